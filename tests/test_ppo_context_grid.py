"""PPO (context) on the 2D grid family: a cell's context entry is its (state, live-neighbour count), its channels are
what the context says flipping it does to it and its neighbours, its one-step lookahead is the pinned rule's reward,
the policy commutes with torus translations, and the grid-only limits are checked early."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tapebench.ca import grid_torch
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.grid_rules import MOORE, VON_NEUMANN
from tapebench.methods.context_model import entry_counts, increment
from tapebench.methods.contract import EnvSpec, EpisodeBatch
from tapebench.methods.ppo_context import GridCells, table_probabilities
from tapebench.registry import build_config, make_agent
from tapebench.rule_family import family_from_config
from tapebench.training.loop import TrainSpec, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_SIDE = 5
RULES = {MOORE: ["B3/S23", "B36/S23", "B2/S", "B3/S12345"], VON_NEUMANN: ["B1/S12V", "B2/S0V", "B13/S024V", "B/S1V"]}
SMALL = {"num_envs": 4, "num_steps": 8, "num_minibatches": 2, "update_epochs": 1, "conv_channels": 8,
         "conv_layers": 2, "lookahead": 1}


def pinned(family):
    """Random grids, their rules' tables and the counts of a context that has shown every entry once."""
    rng = np.random.default_rng(0)
    tables = torch.as_tensor(family.tables(RULES[family])).flatten(1)          # (N, 2 (m + 1))
    grids = torch.as_tensor(rng.random((len(tables), N_SIDE * N_SIDE)) < 0.4).long()
    return grids, tables, torch.nn.functional.one_hot(tables.long(), 2).float()


def step(grids, actions, tables, family):
    shaped = grids.view(-1, N_SIDE, N_SIDE).to(torch.uint8)
    return grid_torch.transition(shaped, actions, tables, family).view(len(grids), -1).long()


@pytest.mark.parametrize("family", [MOORE, VON_NEUMANN], ids=["moore", "von_neumann"])
def test_the_one_step_lookahead_is_the_pinned_rules_reward_for_every_cell(family):
    grids, tables, counts = pinned(family)
    L = grids.shape[1]
    goals = torch.as_tensor(np.random.default_rng(1).random(grids.shape) < 0.3).long()
    goals[0] = 0
    values = GridCells(family, N_SIDE).lookahead(grids, goals, table_probabilities(counts), 1)[:, 0]
    for a in range(L):
        mismatches = (step(grids, torch.full((len(grids),), a), tables, family) != goals).sum(-1).double()
        assert torch.allclose(values[:, a].double(), -mismatches / L + (mismatches == 0).double(), atol=1e-6), a


@pytest.mark.parametrize("family", [MOORE, VON_NEUMANN], ids=["moore", "von_neumann"])
def test_a_cells_channels_are_its_next_value_and_its_neighbourhoods_after_flipping_it(family):
    grids, tables, counts = pinned(family)
    cells = GridCells(family, N_SIDE)
    L, m = grids.shape[1], family.neighbours
    channels = cells.features(grids, counts)                                    # (N, 2 (m + 2), L)
    assert channels.shape[1] == cells.channels(0) == 2 * (m + 2)
    assert torch.equal(channels[:, 0::2], torch.ones_like(channels[:, 0::2]))  # every entry shown
    unflipped = grid_torch.ca_step(grids.view(-1, N_SIDE, N_SIDE).to(torch.uint8), tables, family)
    assert torch.equal(channels[:, 1], unflipped.view(len(grids), -1).float())  # own entry: the step without a flip
    rows = torch.arange(len(grids))
    for a in range(L):
        after = step(grids, torch.full((len(grids),), a), tables, family)
        r, c = divmod(a, N_SIDE)
        for w, (dr, dc) in enumerate(cells.offsets):
            neighbour = (r + dr) % N_SIDE * N_SIDE + (c + dc) % N_SIDE
            assert torch.equal(channels[rows, 3 + 2 * w, a], after[rows, neighbour].float()), (a, w)
    empty = cells.features(grids, torch.zeros_like(counts))
    assert torch.equal(empty, torch.zeros_like(empty))


@pytest.mark.parametrize("family", [MOORE, VON_NEUMANN], ids=["moore", "von_neumann"])
def test_a_context_of_true_transitions_shows_the_rules_table(family):
    grids, tables, _ = pinned(family)
    cells = GridCells(family, N_SIDE)
    actions = torch.arange(len(grids))
    counts = entry_counts(cells.index(increment(grids, actions, 2)[:, None]),
                          step(grids, actions, tables, family)[:, None], cells.entries, 2)
    shown = counts.sum(-1) > 0
    assert shown.sum() > len(grids) * 4 and torch.equal(counts.argmax(-1)[shown], tables.long()[shown])


def grid_agent(**overrides):
    torch.manual_seed(0)
    return make_agent("ppo_context", build_config("ppo_context", {**SMALL, **overrides}),
                      EnvSpec.for_grid(N_SIDE, 8), 1_000, "cpu")


def test_translating_the_episode_so_far_on_the_torus_translates_the_logits():
    policy = grid_agent().evaluation_policy()
    grids, tables, _ = pinned(MOORE)
    n, L = len(grids), grids.shape[1]
    actions = torch.as_tensor(np.random.default_rng(2).integers(0, L, (n, 2)))
    tapes = [grids]
    for t in range(2):
        tapes.append(step(tapes[-1], actions[:, t], tables, MOORE))

    def moved(x, dy, dx):
        return torch.roll(x.unflatten(-1, (N_SIDE, N_SIDE)), (dy, dx), (-2, -1)).flatten(-2)

    def logits(dy, dx):
        policy.begin(EpisodeBatch(L=L, H=8, keys=np.arange(n, dtype=np.uint64), goal=np.zeros(L, np.uint8),
                                  success_bonus=1.0, device=torch.device("cpu"), family=MOORE))
        obs = [torch.cat([moved(tapes[t], dy, dx).float(), torch.full((n, 1), t / 8)], 1) for t in range(3)]
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(2):
            cell = moved(torch.nn.functional.one_hot(actions[:, t], L), dy, dx).argmax(-1)
            policy.observe(obs[t], cell, None, obs[t + 1], done, done)
        return policy.actor(policy.context.augment(obs[2]))

    base = logits(0, 0)
    assert torch.allclose(logits(2, 3), moved(base, 2, 3), atol=1e-5)
    assert not torch.allclose(base, moved(base, 0, 1), atol=1e-5)


def test_grid_limits_are_checked_before_training():
    with pytest.raises(ValueError, match="lookahead to 0 or 1"):
        grid_agent(lookahead=2)
    with pytest.raises(ValueError, match="neighbourhood must be 'moore' or 'von_neumann', got 'hex'"):
        build_config("ppo_context", {"neighbourhood": "hex"})
    policy = grid_agent().evaluation_policy()
    with pytest.raises(ValueError, match="Moore neighbourhood .*not von_neumann"):
        policy.begin(EpisodeBatch(L=N_SIDE ** 2, H=8, keys=np.arange(2, dtype=np.uint64),
                                  goal=np.zeros(N_SIDE ** 2, np.uint8), success_bonus=1.0,
                                  device=torch.device("cpu"), family=VON_NEUMANN))


@pytest.mark.slow
def test_trained_on_six_grid_rules_it_beats_the_floor_and_itself_untrained_on_six_others(tmp_path):
    """On a 4 x 4 Moore torus (H = 8, the all-zero goal), PPO (context) with config/grid.yaml's settings (one-step
    lookahead channels, no lookahead path, gamma 0.5) trained 6,144 steps on six rules plays six other rules above the
    rule-agnostic floor and above the same network untrained: the gain is learned and transfers (~10 CPU-s).
    (Measured, seeds 0 / 1 / 2: untrained 0.58 / 0.65 / 0.69, trained 0.92 / 0.95 / 0.95; flip a random live cell
    0.72, flip the leftmost 0.69, random 0.58.)"""
    family = {"neighbourhood": "moore"}
    train_rules = [MOORE.rule(r).id for r in ("B3/S23", "B36/S23", "B3/S12", "B2/S2", "B3/S234", "B34/S12")]
    test_rules = [MOORE.rule(r).id for r in ("B3/S2", "B36/S2", "B3/S13", "B23/S3", "B3/S123", "B34/S2")]
    hyper = {"num_envs": 16, "num_steps": 16, "num_minibatches": 4, "update_epochs": 4, "conv_channels": 16,
             "conv_layers": 2, "learning_rate": 1e-3, "anneal_lr": False, "lookahead": 1, "lookahead_gain": 0.0,
             "gamma": 0.5}

    def success(total_steps):
        run = TrainSpec(agent="ppo_context", rules=tuple(train_rules), seed=0, L=16, H=8, total_steps=total_steps,
                        eval_every=max(1, total_steps), hyperparameters=hyper, family=family)
        train(run, tmp_path / f"steps{total_steps}", quiet=True)
        records, _ = evaluate_run(tmp_path / f"steps{total_steps}", 8, rules=test_rules, episodes_per_rule=50,
                                  eval_seed=3)
        return records["success"].mean()

    sides = side_protocols(L=16, H=8, episodes_per_rule=50, eval_seed=3, rules=test_rules,
                           family=family_from_config(family))
    floor = max(evaluate_untrained(m, {}, 0, sides)[0]["success"].mean() for m in ("live_random", "live_leftmost"))
    untrained, trained = success(0), success(6_144)
    assert trained >= floor + 0.15 and trained >= untrained + 0.2, (floor, untrained, trained)
