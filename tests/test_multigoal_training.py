"""Goal-conditioned training under the multi-goal protocol (docs/protocol.md#multi-goal): PPO (MLP, equivariant and
context) trains with a derived goal per training episode, observes [s, g, t/H], and its run is evaluated on derived goals;
the goal mode is part of the run's fingerprint and manifest, and a run plays only the goal protocol it was trained
for."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import TrainingGoals
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.training import checkpoint as ckpt
from tapebench.training.blocks import train_block
from tapebench.training.loop import TrainSpec, train

HYPER = {"num_envs": 4, "num_steps": 32, "hidden_size": 32, "num_minibatches": 4, "update_epochs": 2}
EQUIVARIANT = {**HYPER, "conv_channels": 8, "conv_layers": 2}


def spec(seed=0, agent="ppo", goal="derived", total_steps=256, rules=(204,)):
    return TrainSpec(agent=agent, rules=rules, seed=seed, L=8, H=8, total_steps=total_steps, eval_every=128,
                     hyperparameters=HYPER if agent == "ppo" else EQUIVARIANT, goal=goal, goal_steps=4)


def test_training_env_draws_a_reachable_goal_at_every_reset_from_the_rows_own_stream():
    def env(seed):
        return BatchedTapeEnv(3, L=8, H=4, rules=[204], seed=seed, goal_in_obs=True,
                              goal_sampler=TrainingGoals(seed, 3, goal_steps=2))

    a, b = env(5), env(5)
    obs = a.reset()
    assert torch.equal(obs, b.reset()) and obs.shape == (3, 17)
    goals = a.row_goals().clone()
    # rule 204 is the identity: a goal 1..2 flips away, never the start or the all-zero tape
    mismatches = (a.tapes != goals).sum(dim=1)
    assert ((mismatches >= 1) & (mismatches <= 2)).all() and goals.any(dim=1).all()
    assert torch.equal(obs[:, 8:16], goals.float())
    for _ in range(4):       # H steps: every row ends and starts again with a fresh goal in the same step
        actions = torch.zeros(3, dtype=torch.long)
        obs, reward, terminated, truncated, info = a.step(actions)
        assert torch.equal(obs, b.step(actions)[0])
        done = terminated | truncated
        assert torch.equal(info["final_obs"][done, 8:16], goals[done].float())   # the finished episode's goal
        assert torch.equal(obs[:, 8:16], a.row_goals().float())                  # the next episode's goal
        goals = a.row_goals().clone()
    assert a.goal_sampler.episodes.tolist() == b.goal_sampler.episodes.tolist() and (a.goal_sampler.episodes >= 2).all()


@pytest.mark.parametrize("agent", ["ppo", "ppo_equivariant", "ppo_context"])
def test_goal_conditioned_ppo_trains_on_derived_goals_and_plays_them(tmp_path, agent):
    derived, zeros = spec(agent=agent), spec(agent=agent, goal="zeros")
    assert derived.env_spec().obs_dim == 17 and zeros.env_spec().obs_dim == 9
    assert derived.fingerprint() != zeros.fingerprint()
    assert "goal" not in zeros.fields() and derived.fields()["goal"] == "derived"
    manifest = train(derived, tmp_path / "run", quiet=True)
    assert manifest["env"]["goal"] == "derived" and manifest["env"]["goal_steps"] == 4
    payload = ckpt.load(tmp_path / "run" / manifest["checkpoints"][-1]["file"])
    assert payload["env_spec"]["obs_dim"] == 17
    records, summary = evaluate_run(tmp_path / "run", 8, rules=[204], episodes_per_rule=6, eval_seed=3,
                                    goal_mode="derived", goal_steps=4)
    assert summary["protocols"][0]["goal_mode"] == "derived" and len(records) == 2 * 6
    assert records["success"].between(0, 1).all()
    with pytest.raises(ValueError, match="env.goal: zeros in the evaluation params, but the run .* was trained with "
                                         "env.goal: derived"):
        evaluate_run(tmp_path / "run", 8, rules=[204], episodes_per_rule=1, eval_seed=3)


# The single-rule diagnosis (docs/methods/ppo.md#derived-goals-on-one-rule): on the identity rule 204 the
# optimal policy is "flip a cell where s != g"; a goal-conditioned learner must find it from [s, g, t/H] alone.
FAST_EQUIVARIANT = {"num_envs": 16, "num_steps": 16, "num_minibatches": 4, "update_epochs": 4, "conv_channels": 16,
                    "conv_layers": 2, "learning_rate": 1e-3, "anneal_lr": False}


@pytest.mark.slow
def test_equivariant_ppo_learns_the_identity_rule_with_derived_goals_through_train_and_evaluate(tmp_path):
    """Trained by the shared loop on rule 204 with a derived goal per episode (L = H = 8, K = 4; ~10 CPU-s) and
    evaluated by the pipeline's evaluation on derived-goal episodes, the greedy policy reaches every goal, where the
    random policy reaches about one in ten: the goal reaches the network at training and at evaluation time, and
    obs, reward and success agree on it. (Measured: 1.0 from 9,216 steps on for seeds 0, 1 and 3, 12,288 for seed 2;
    PPO's MLP with the same settings stays at or below random, 0.03.)"""
    run = TrainSpec(agent="ppo_equivariant", rules=(204,), seed=0, L=8, H=8, total_steps=12_288, eval_every=3_072,
                    hyperparameters=FAST_EQUIVARIANT, goal="derived", goal_steps=4)
    train(run, tmp_path / "run", quiet=True)
    records, _ = evaluate_run(tmp_path / "run", 8, rules=[204], episodes_per_rule=50, eval_seed=3,
                              goal_mode="derived", goal_steps=4)
    success = records.groupby("checkpoint")["success"].mean()
    sides = side_protocols(L=8, H=8, episodes_per_rule=50, eval_seed=3, rules=[204], goal_mode="derived",
                           goal_steps=4)
    random_success = evaluate_untrained("random", {}, 0, sides)[0]["success"].mean()
    assert random_success < 0.25
    assert success.iloc[-1] >= 0.95 and success.iloc[0] < 0.5, success.to_dict()


def test_a_zeros_run_is_refused_under_derived_goals_and_a_goal_blind_method_cannot_train_on_them(tmp_path,
                                                                                            goal_blind_method):
    train(spec(goal="zeros", total_steps=128), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match="env.goal: derived in the evaluation params, but the run .* was trained "
                                         "with env.goal: zeros"):
        evaluate_run(tmp_path / "run", 8, rules=[204], episodes_per_rule=1, eval_seed=3, goal_mode="derived")
    with pytest.raises(ValueError, match="method 'goal_blind' does not take an episode's goal.*'dqn'"):
        TrainSpec(agent="goal_blind", rules=(204,), seed=0, goal="derived")


@pytest.mark.parametrize("agent", ["ppo", "ppo_equivariant"])
def test_a_stacked_block_with_derived_goals_is_each_seeds_one_seed_run_and_resumes(tmp_path, monkeypatch, capsys,
                                                                                  agent):
    specs = [spec(seed=s, agent=agent, rules=(30, 204), total_steps=384) for s in (0, 1)]
    block = train_block(specs, [tmp_path / f"block{s}" for s in (0, 1)], quiet=False, stacking="always")
    shown = capsys.readouterr()
    assert "as one stacked block" in shown.err and "one after another" not in shown.out + shown.err
    one = train(specs[1], tmp_path / "one", quiet=True)
    assert [c["sha256"] for c in block[1]["checkpoints"]] == [c["sha256"] for c in one["checkpoints"]]
    # a run killed after its first checkpoint resumes to the same weights (goals and counters in resume.pt)
    from tapebench.training import loop

    calls = {"n": 0}
    original = loop.write_run_checkpoint

    def killed_after_first(*args, **kwargs):
        original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop, "write_run_checkpoint", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        train(specs[1], tmp_path / "resumed", quiet=True)
    monkeypatch.setattr(loop, "write_run_checkpoint", original)
    state = ckpt.load(tmp_path / "resumed" / ckpt.RESUME_FILE)["env"]
    assert state["goals"].shape == (4, 8) and np.asarray(state["goal_sampler"]["episodes"]).sum() > 0
    resumed = train(specs[1], tmp_path / "resumed", quiet=True)
    assert [c["sha256"] for c in resumed["checkpoints"]] == [c["sha256"] for c in one["checkpoints"]]


def test_the_equivariant_policy_reads_the_goal_as_a_channel_and_rolls_with_tape_and_goal():
    from tapebench.methods import ppo
    from tapebench.registry import build_config

    config = build_config("ppo_equivariant", {"conv_channels": 8, "conv_layers": 2})
    network = ppo.ActorCritic(config, spec(agent="ppo_equivariant").env_spec())
    assert network.actor.trunk.inp.in_channels == 3
    torch.manual_seed(0)
    tape, goal = torch.randint(0, 2, (5, 8)).float(), torch.randint(0, 2, (5, 8)).float()
    obs = torch.cat([tape, goal, torch.full((5, 1), 0.25)], dim=1)
    rolled = torch.cat([tape.roll(3, 1), goal.roll(3, 1), obs[:, -1:]], dim=1)
    with torch.no_grad():
        assert torch.allclose(network.actor(rolled), network.actor(obs).roll(3, 1), atol=1e-5)
        assert torch.allclose(network.value(rolled), network.value(obs), atol=1e-5)
        other = torch.cat([tape, 1 - goal, obs[:, -1:]], dim=1)
        assert not torch.allclose(network.actor(other), network.actor(obs))   # the goal changes the policy


def test_the_context_policy_reads_the_goal_as_a_channel_beside_its_context_channels():
    from tapebench.methods import ppo_context
    from tapebench.registry import build_config
    from tapebench.rule_family import RuleFamily

    config = build_config("ppo_context", {"conv_channels": 8, "conv_layers": 2})
    env_spec = spec(agent="ppo_context").env_spec()
    channels = ppo_context.feature_channels(RuleFamily(), config.lookahead)
    network = ppo_context.ContextActorCritic(config, env_spec, channels)
    assert network.actor.trunk.inp.in_channels == 3 + channels
    torch.manual_seed(0)
    tape, goal = torch.randint(0, 2, (5, 8)).float(), torch.randint(0, 2, (5, 8)).float()
    context = torch.rand(5, channels, 8)

    def augmented(tape_, goal_, context_):
        return torch.cat([tape_, goal_, torch.full((5, 1), 0.25), context_.flatten(1)], dim=1)

    obs = augmented(tape, goal, context)
    rolled = augmented(tape.roll(3, 1), goal.roll(3, 1), context.roll(3, 2))
    with torch.no_grad():
        assert torch.allclose(network.actor(rolled), network.actor(obs).roll(3, 1), atol=1e-5)
        assert torch.allclose(network.value(rolled), network.value(obs), atol=1e-5)
        assert not torch.allclose(network.actor(augmented(tape, 1 - goal, context)), network.actor(obs))


@pytest.mark.slow
def test_context_ppo_learns_from_its_initialisation_to_read_the_episode_and_beats_the_floor_on_unseen_rules(tmp_path):
    """PPO (context) without the lookahead path (`lookahead_gain: 0`, so its initialisation plays near random) and
    with gamma 0.5 (docs/methods/ppo_context.md, "Learned from its initialisation"), trained on derived goals of six
    rules (L = H = 8, K = 4; ~10 CPU-s), plays six other rules above the rule-agnostic floor and above the same network
    untrained (budget 0): the gain is learned and it transfers to rules never trained on. (Measured: untrained 0.06
    and 0.09 for seeds 0 and 1, trained 0.80 and 0.82; live_random 0.15, MPC 1.0.)"""
    train_rules, test_rules = (30, 90, 110, 150, 45, 60), [18, 54, 73, 105, 122, 126]
    hyper = {**FAST_EQUIVARIANT, "lookahead_gain": 0.0, "gamma": 0.5}

    def success(total_steps):
        run = TrainSpec(agent="ppo_context", rules=train_rules, seed=0, L=8, H=8, total_steps=total_steps,
                        eval_every=max(1, total_steps), hyperparameters=hyper, goal="derived", goal_steps=4)
        train(run, tmp_path / f"steps{total_steps}", quiet=True)
        records, _ = evaluate_run(tmp_path / f"steps{total_steps}", 8, rules=test_rules, episodes_per_rule=50,
                                  eval_seed=3, goal_mode="derived", goal_steps=4)
        return records["success"].mean()

    sides = side_protocols(L=8, H=8, episodes_per_rule=50, eval_seed=3, rules=test_rules, goal_mode="derived",
                           goal_steps=4)
    floor = evaluate_untrained("live_random", {}, 0, sides)[0]["success"].mean()
    untrained, trained = success(0), success(6_144)
    assert trained >= floor + 0.4 and trained >= untrained + 0.4, (floor, untrained, trained)
