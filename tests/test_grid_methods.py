"""The registry's methods on the 2D grid family through the one runner (docs/protocol.md#grid): MPC and the Bayes
filters play exactly what the grid oracles play, the rule-agnostic rows act on the flattened grid, the runner and
the training loop build the grid env, and a method without `supports_grid` is refused."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tapebench.cli import main
from tapebench.evaluation.model_error import probe_trajectories, rollout_errors
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.envs.factory import batched_env
from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.runner import run_episodes
from tapebench.grid_rules import MOORE, VON_NEUMANN, parse_rule
from tapebench.methods.bayes_filter import Config as FilterConfig
from tapebench.methods.contract import EpisodeBatch
from tapebench.methods.grid_bayes_filter import GridBayesFilter, GridBayesFilterFull, run_grid_bayes_filter
from tapebench.methods.grid_mpc import run_grid_mpc
from tapebench.methods.mpc import MPCConfig
from tapebench.registry import PolicyContext, build_config, check_rule_family, get_method, registry
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train, training_env
from tapebench.utils.io import read_parquet_meta

KEYS = ("success", "final_dist", "auc_dist", "return", "steps")
RULES = ["B3/S23", "B36/S23", "B2/S", "B34/S34"]


def moore_episodes(n: int = 4, per_rule: int = 3):
    ids = [parse_rule(r).id for r in RULES]
    return ids, episode_set(ids, per_rule, n * n, family=MOORE, eval_seed=5, side="test")


def policy_of(method: str, ids, L: int, H: int, family=MOORE, **overrides):
    context = PolicyContext(L=L, H=H, seed=3, train_rules=tuple(ids), family=family)
    return get_method(method).policy_maker(family)(build_config(method, overrides), context)


def test_mpc_through_the_runner_plays_what_the_grid_oracle_plays():
    ids, episodes = moore_episodes()
    played = run_episodes(policy_of("mpc", ids, 16, 12, candidates=32), episodes, 12, reveal_rules=True,
                          batch_size=5)
    oracle = run_grid_mpc(episodes.tapes.reshape(-1, 4, 4), episodes.rules.tolist(), MOORE, 12,
                          MPCConfig(horizon=8, candidates=32, seed=3), keys=episodes.keys)
    for key in KEYS:
        np.testing.assert_allclose(played[key], oracle[key], err_msg=key)
    assert played["success"].any()


@pytest.mark.parametrize("method", ["bayes_filter", "bayes_filter_full"])
def test_bayes_filters_through_the_runner_play_what_the_grid_filters_play(method):
    ids, episodes = moore_episodes()
    played = run_episodes(policy_of(method, ids, 16, 10), episodes, 10, batch_size=7)
    candidate = GridBayesFilter(ids, MOORE, 4, FilterConfig(), 3) if method == "bayes_filter" \
        else GridBayesFilterFull(MOORE, 4, FilterConfig(), 3)
    oracle = run_grid_bayes_filter(episodes.tapes.reshape(-1, 4, 4), episodes.rules.tolist(), MOORE, 10, candidate,
                                   keys=episodes.keys)
    for key in KEYS:
        np.testing.assert_allclose(played[key], oracle[key], err_msg=key)


def test_live_cell_rows_flip_a_live_cell_of_the_flattened_grid():
    ids, episodes = moore_episodes()
    policy = policy_of("live_leftmost", ids, 16, 8)
    env = batched_env(len(episodes), L=16, H=8, rules=ids, family=MOORE, success_bonus=1.0, device="cpu",
                      autoreset=False)
    assert isinstance(env, BatchedGridEnv)
    obs = env.load(episodes.tapes, episodes.rules)
    policy.begin(EpisodeBatch(L=16, H=8, keys=episodes.keys, goal=np.zeros(16, dtype=np.uint8), success_bonus=1.0,
                              device=torch.device("cpu"), family=MOORE))
    actions = policy.act(obs).numpy()
    assert (actions == episodes.tapes.argmax(axis=1)).all()      # the lowest live cell, row-major
    assert episodes.tapes[np.arange(len(actions)), actions].all()
    for method in ("random", "live_random"):
        results = run_episodes(policy_of(method, ids, 16, 8), episodes, 8)
        assert results["steps"].min() >= 1 and (results["final_dist"] <= 1).all()


def test_the_grid_env_is_the_runner_s_and_keeps_noise_flips():
    ids, episodes = moore_episodes(per_rule=2)
    env = batched_env(len(episodes), L=16, H=8, rules=ids, family=MOORE, success_bonus=1.0, device="cpu",
                      autoreset=False, goal=np.zeros(16, dtype=np.uint8))
    env.load(episodes.tapes, episodes.rules)
    before = env.tapes.clone()
    flips = np.zeros((len(episodes), 16), dtype=np.uint8)
    flips[:, 5] = 1
    quiet = BatchedGridEnv(len(episodes), n=4, H=8, rules=ids, autoreset=False)
    quiet.load(before.view(-1, 4, 4), episodes.rules)
    env.step(torch.zeros(len(episodes), dtype=torch.long), flips)
    quiet.step(torch.zeros(len(episodes), dtype=torch.long))
    assert torch.equal(env.tapes, quiet.tapes ^ torch.from_numpy(flips))
    with pytest.raises(ValueError, match="goal_in_obs"):
        batched_env(2, L=16, H=8, rules=ids, family=MOORE, success_bonus=1.0, device="cpu", goal_in_obs=True)
    with pytest.raises(ValueError, match="not square"):
        batched_env(2, L=15, H=8, rules=ids, family=MOORE, success_bonus=1.0, device="cpu")


def test_training_on_the_grid_builds_the_grid_env_and_the_grid_env_spec():
    spec = TrainSpec(agent="dqn", rules=(194, 4), seed=0, L=25, H=8, total_steps=64, eval_every=64,
                     family=VON_NEUMANN.as_dict(), hyperparameters={"num_envs": 2})
    env_spec = spec.env_spec()
    assert (env_spec.grid, env_spec.L, env_spec.obs_dim, env_spec.num_actions) == (5, 25, 26, 25)
    env = training_env(spec, get_method("dqn"), spec.config(), "cpu", 0)
    assert isinstance(env, BatchedGridEnv) and env.n == 5 and env.reset().shape == (2, 26)
    with pytest.raises(ValueError, match="not square"):
        TrainSpec(agent="dqn", rules=(194,), seed=0, L=24, H=8, family=VON_NEUMANN.as_dict())
    with pytest.raises(ValueError, match="'ppo_dr' does not run on the 2D grid family"):
        TrainSpec(agent="ppo_dr", rules=(194,), seed=0, L=25, H=8, family=VON_NEUMANN.as_dict())
    with pytest.raises(ValueError, match="supports_grid"):
        check_rule_family("exact", MOORE)


def test_grid_features_command_takes_an_explicit_rule_set_and_lambda_edges(tmp_path, capsys):
    out = tmp_path / "listed.parquet"
    assert main(["grid-features", "--family", "moore", "--rules", "B3/S23, 6152,B2/S", "--out", str(out)]) == 2
    assert "['B3/S23'] more than once" in capsys.readouterr().err        # B3/S23 is id 6152
    assert main(["grid-features", "--family", "moore", "--rules", "B3/S23,B2/S", "--out", str(out)]) == 0
    assert pd.read_parquet(out)["rule"].tolist() == sorted([6152, parse_rule("B2/S").id])
    assert read_parquet_meta(out)["config"]["family"] == {"neighbourhood": "moore"}
    assert main(["grid-features", "--family", "moore", "--rules", "B9/S2", "--out", str(out)]) == 2
    assert "0..8, got [9]" in capsys.readouterr().err
    edges = tmp_path / "edges.parquet"
    assert main(["grid-features", "--family", "moore", "--sample", "4", "--lambda-bins", "0,0.2,0.4", "--no-b0",
                 "--out", str(edges)]) == 0
    assert (pd.read_parquet(edges)["lambda"] <= 0.4).all()


@pytest.mark.parametrize("agent", ["ppo_equivariant", "dqn_equivariant"])
def test_equivariant_rows_train_on_the_grid_through_the_training_loop(agent, tmp_path):
    # the 2D circular-convolution trunk (methods/equivariant.py) behind the registry's supports_grid flag
    spec = TrainSpec(agent=agent, rules=(194, 4), seed=0, L=16, H=8, total_steps=64, eval_every=64,
                     family=VON_NEUMANN.as_dict(),
                     hyperparameters={"num_envs": 2, **({"num_steps": 16} if agent.startswith("ppo") else
                                                        {"learning_starts": 16, "batch_size": 8})})
    manifest = train(spec, tmp_path, quiet=True)
    assert manifest["training"]["env_steps"] == 64 and len(manifest["checkpoints"]) == 1


def test_a_grid_run_records_its_family_and_is_evaluated_on_a_rule_list_of_it(tmp_path):
    from tapebench.evaluation.trained_runs import evaluate_run
    from tapebench.grid_rules import GridFamily
    from tapebench.training.loop import TrainSpec, train

    rules = GridFamily("moore").rules(["B3/S23", "B36/S23"])
    ids = tuple(rule.id for rule in rules)
    spec = TrainSpec(agent="ppo", rules=ids, seed=0, L=16, H=8, total_steps=128, eval_every=128,
                     hyperparameters={"num_envs": 4, "num_steps": 32, "hidden_size": 16, "num_minibatches": 2,
                                      "update_epochs": 1}, family={"neighbourhood": "moore"})
    manifest = train(spec, tmp_path / "run", quiet=True)
    assert manifest["family"] == {"neighbourhood": "moore"}
    records, summary = evaluate_run(tmp_path / "run", 8, rules=list(ids), episodes_per_rule=3, eval_seed=1)
    assert sorted(set(records["rule"])) == sorted(ids) and len(records) == 6


# Tiny hyperparameters of every method that reads the flattened grid generically (registry flag supports_grid): a
# few hundred steps on a 4 x 4 von Neumann torus, then the normal evaluation path on grid episodes.
REPLAY = {"learning_starts": 64, "batch_size": 8, "buffer_size": 512}
LATENT = {"deter_size": 16, "hidden_size": 16, "stoch_groups": 8, "batch_size": 4, "sequence_length": 8,
          "learning_starts": 64, "buffer_size": 512}
ENSEMBLE = {"num_envs": 4, "ensemble_size": 2, "batch_size": 16, "learning_starts": 64, "buffer_size": 512,
            "plan_horizon": 2, "candidates": 8}
SMALL_TRUNK = {"conv_channels": 4, "conv_layers": 2}
GRID_TINY = {
    "rainbow": {"num_envs": 2, "hidden_size": 16, "atoms": 11, "target_update_frequency": 64, **REPLAY},
    "rad_dqn": {"num_envs": 2, "hidden_size": 16, "target_update_frequency": 64, **REPLAY},
    "curl_dqn": {"num_envs": 2, "hidden_size": 16, "target_update_frequency": 64, **REPLAY},
    "pearl_dqn": {"num_envs": 2, "hidden_size": 16, "encoder_hidden_size": 8, "target_update_frequency": 64, **REPLAY},
    "pearl_dqn_equivariant": {"num_envs": 2, "encoder_hidden_size": 8, "target_update_frequency": 64, **REPLAY,
                              **SMALL_TRUNK},
    "rl2_a2c": {"num_envs": 4, "num_steps": 16, "hidden_size": 16},
    "ppo_context": {"num_envs": 4, "num_steps": 16, "num_minibatches": 2, "update_epochs": 1, **SMALL_TRUNK,
                    "neighbourhood": "von_neumann", "lookahead": 1, "lookahead_gain": 0.0},
    "dreamer": {"num_envs": 4, **LATENT, "imagination_horizon": 3, "imagination_starts": 8},
    "dreamer_large": {"num_envs": 4, **LATENT, "imagination_horizon": 3, "imagination_starts": 8, "train_ratio": 16},
    "planet": {"num_envs": 4, **LATENT, "candidates": 8, "plan_horizon": 2, "elites": 2},
    "ensemble_mpc": {**ENSEMBLE, "hidden_size": 16},
    "ensemble_mpc_ig": {**ENSEMBLE, "hidden_size": 16},
    "ensemble_mpc_equivariant": {**ENSEMBLE, **SMALL_TRUNK},
}


def test_every_trained_grid_method_is_trained_on_the_grid_in_this_file():
    trained = sorted(m for m, entry in registry().items() if entry.trains and entry.supports_grid)
    covered = set(GRID_TINY) | {"dqn", "ppo", "dqn_equivariant", "ppo_equivariant"}   # above
    assert sorted(covered) == trained


@pytest.mark.parametrize("method", sorted(GRID_TINY))
def test_a_method_trains_on_the_grid_and_its_run_is_evaluated_on_grid_episodes(method, tmp_path):
    ids = (194, 4)
    spec = TrainSpec(agent=method, rules=ids, seed=0, L=16, H=8, total_steps=256, eval_every=256,
                     family=VON_NEUMANN.as_dict(), hyperparameters=GRID_TINY[method])
    assert spec.env_spec().grid == 4
    manifest = train(spec, tmp_path / "run", quiet=True)
    assert manifest["family"] == VON_NEUMANN.as_dict() and manifest["training"]["env_steps"] == 256
    rules = [*ids, 5]                                              # an OOD rule of the family besides the two
    records, _ = evaluate_run(tmp_path / "run", 8, rules=rules, episodes_per_rule=2, eval_seed=1)
    assert sorted(set(records["rule"])) == sorted(rules) and len(records) == 6
    assert records["success"].between(0, 1).all() and (records["steps"] >= 1).all()
    if get_method(method).world_model:     # its prediction error is probed on grid trajectories
        payload = ckpt.load(tmp_path / "run" / manifest["checkpoints"][-1]["file"])
        agent = ckpt.build_policy_agent(payload, "cpu")
        agent.load_policy_state_dict(payload["policy"])
        episodes = episode_set(list(ids), 2, 16, family=VON_NEUMANN, eval_seed=1, side="test")
        errors, valid = rollout_errors(agent, episodes, 8, context=2, depth=3)
        assert errors.shape == (4, 3) and ((errors >= 0) & (errors <= 1)).all() and valid.any()


def test_the_model_error_probe_steps_grids_as_the_grid_env_does():
    ids, episodes = moore_episodes()
    tapes, actions = probe_trajectories(episodes, 4)
    env = BatchedGridEnv(len(episodes), n=4, H=8, rules=ids, neighbourhood="moore", autoreset=False)
    env.load(episodes.tapes.reshape(-1, 4, 4), episodes.rules)
    for t in range(4):
        obs = env.step(torch.as_tensor(actions[:, t]))[0]
        assert np.array_equal(obs[:, :16].numpy().astype(np.uint8), tapes[:, t + 1])
    assert not np.array_equal(tapes[:, 1:], tapes[:, :-1])


def test_the_equivariant_next_grid_models_commute_with_torus_translations():
    # ensemble_mpc_equivariant on the grid: translating the three grids of its input by (dy, dx) translates every
    # member's prediction by (dy, dx) (the 2D trunk, docs/methods.md#equivariant-grid); a flat roll does not
    from tapebench.methods import augment
    from tapebench.methods.contract import EnvSpec
    from tapebench.methods.ensemble_mpc import EquivariantEnsemble

    n, L = 4, 16
    torch.manual_seed(0)
    config = build_config("ensemble_mpc_equivariant", {"ensemble_size": 2, **SMALL_TRUNK})
    model = EquivariantEnsemble(2, config, EnvSpec.for_grid(n, 8)).double()
    x = torch.randint(0, 2, (L, 3 * L + 1)).double()          # [context grid, its successor, flag, grid]
    x[:, 2 * L] = 1.0
    shifts = torch.arange(L)                                   # row k translated by k = dy * n + dx

    def moved(cells, grid):                                    # (L, L) cells, each row by its own shift
        padded = torch.cat([cells, torch.zeros(L, 1, dtype=cells.dtype)], 1)
        return augment.shift_tapes(padded, shifts, L, grid)[:, :L]

    def inputs(grid):
        return torch.cat([moved(x[:, :L], grid), moved(x[:, L:2 * L], grid), x[:, 2 * L:2 * L + 1],
                          moved(x[:, 2 * L + 1:], grid)], 1)

    expected = torch.stack([moved(member, n) for member in model.probs(x)])
    torch.testing.assert_close(model.probs(inputs(n)), expected, atol=1e-10, rtol=0)
    assert not torch.allclose(model.probs(inputs(None)), torch.stack([moved(m, None) for m in model.probs(x)]),
                              atol=1e-6)
