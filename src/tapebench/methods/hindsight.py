"""Hindsight experience replay (Andrychowicz et al., 2017), the "future" strategy, for the off-policy learners in the
multi-goal protocol (docs/protocol.md#multi-goal; DQN's `her_strategy` / `her_k`, which DQN + RAD and DQN + CURL
inherit).

A training row's transitions (o_t, a_t, o_{t+1}), o = [s, g, t/H], are kept until its episode ends. Then each of its
T transitions is stored again `k` times, each copy with the goal g replaced by a tape the episode reached later,
g' = s_{j+1} with j drawn uniformly from t..T-1 (so j = t, the transition's own outcome, is one of the choices), in
o_t and o_{t+1} alike, and its reward and termination recomputed for g' by the environment's own reward function
(`envs.outcome.goal_distances` and `goal_outcomes`, the ones `BatchedTapeEnv.step` scores per-row goals with): r' =
-d(s_{t+1}, g'), or the success bonus and termination when s_{t+1} = g'. The CA and the flip do not depend on the goal,
so a relabelled transition is one the environment would have produced for goal g'. The draws come from torch's global
generator (the training loop seeds and checkpoints it); relabelled copies are not environment steps.
"""
from __future__ import annotations

import torch

from tapebench.envs.outcome import goal_distances, goal_outcomes
from tapebench.methods.contract import split_observation

STRATEGIES = ("none", "future")


def check_strategy(strategy: str, k: int, who: str) -> None:
    """`who`'s hyperparameters her_strategy and her_k, or ValueError naming the key and what is allowed."""
    if strategy not in STRATEGIES:
        raise ValueError(f"{who} hyperparameter her_strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{who} hyperparameter her_k must be an integer >= 1, got {k!r}")


def check_goal_protocol(strategy: str, env_spec, who: str) -> None:
    """Relabelling replaces goals, which only the multi-goal protocol's observations [s, g, t/H] carry."""
    if strategy != "none" and not (env_spec.goal_in_obs and env_spec.success_bonus is not None):
        raise ValueError(f"{who} hyperparameter her_strategy = {strategy!r} relabels the goals of the multi-goal "
                         f"protocol (env.goal: derived, observations [s, g, t/H]); with the fixed goal there is no "
                         f"goal to relabel: set agents.<method>.her_strategy to 'none'")


def future_relabels(obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor, L: int, k: int,
                    success_bonus: float, generator: torch.Generator | None = None):
    """The k relabelled copies of each transition of one finished episode: obs, next_obs (T, 2L+1), actions (T,) ->
    (obs, actions, rewards, next_obs, terminated) of k * T transitions, transition t's copies at rows t*k..t*k+k-1,
    and the index j of the reached tape each copy's goal is (s_{j+1}, j >= t)."""
    T = len(actions)
    t = torch.arange(T, device=obs.device).repeat_interleave(k)
    later = (torch.rand(T * k, generator=generator).to(obs.device) * (T - t)).long().clamp_(max=T - 1 - t)
    reached = t + later
    goals = split_observation(next_obs, L)[0][reached]
    new_obs, new_next = obs[t].clone(), next_obs[t].clone()
    new_obs[:, L:2 * L] = goals
    new_next[:, L:2 * L] = goals
    rewards, terminated = goal_outcomes(goal_distances(split_observation(new_next, L)[0], goals), success_bonus)
    return (new_obs, actions[t], rewards, new_next, terminated), reached


class EpisodeRecorder:
    """Each training row's transitions of its current episode (at most H); `add` returns the relabelled copies of
    the episodes that just ended (rows in increasing order), to be stored beside the real transitions."""

    def __init__(self, num_envs: int, env_spec, k: int, device):
        self.L, self.k, self.success_bonus = env_spec.L, int(k), float(env_spec.success_bonus)
        shape = (num_envs, env_spec.H, env_spec.obs_dim)
        self.obs = torch.zeros(shape, device=device)
        self.next_obs = torch.zeros(shape, device=device)
        self.actions = torch.zeros(num_envs, env_spec.H, dtype=torch.long, device=device)
        self.length = [0] * num_envs

    def add(self, obs, actions, next_obs, done) -> list[tuple]:
        relabelled = []
        done = done.tolist()
        for row in range(len(self.length)):
            step = self.length[row]
            if step >= self.obs.shape[1]:
                raise ValueError(f"hindsight relabelling: row {row}'s episode runs past H = {self.obs.shape[1]} steps")
            self.obs[row, step], self.actions[row, step], self.next_obs[row, step] = obs[row], actions[row], \
                next_obs[row]
            self.length[row] = step + 1
            if done[row]:
                T = self.length[row]
                batch, _ = future_relabels(self.obs[row, :T], self.actions[row, :T], self.next_obs[row, :T], self.L,
                                           self.k, self.success_bonus)
                relabelled.append(batch)
                self.length[row] = 0
        return relabelled

    def state_dict(self) -> dict:
        return {"obs": self.obs.cpu().clone(), "next_obs": self.next_obs.cpu().clone(),
                "actions": self.actions.cpu().clone(), "length": list(self.length)}

    def load_state_dict(self, state: dict) -> None:
        for name in ("obs", "next_obs", "actions"):
            getattr(self, name).copy_(state[name])
        self.length = list(state["length"])
