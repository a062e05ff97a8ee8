"""Stochastic dynamics as a protocol axis (docs/protocol.md#noise): the noise stream is common random numbers
(the same flips for every policy, batching and subset), its flip rate is epsilon, success under noise matches a
closed form, epsilon = 0 is exactly today's evaluation, the config section is validated, and the
success-vs-epsilon table and figure are built from per-level aggregates."""
from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from pipeline_helpers import REPO

from tapebench import layout
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import episode_set, noise_flips
from tapebench.episodes.streams import noise_key
from tapebench.evaluation.evaluate import evaluate_untrained, play, side_protocols
from tapebench.evaluation.protocol import protocol_differences, protocol_episodes
from tapebench.evaluation.runner import run_episodes
from tapebench.pipeline.config import (ConfigError, checkpoint_eval_slice, load_config, load_config_file, merge_config,
                                       method_eval_slice, noise_eval_slice, validate_config)
from tapebench.registry import get_method
from tapebench.report import registry
from tapebench.report.noise import noise_summary, render_noise_figure, render_noise_table
from tapebench.rule_family import RuleFamily
from tapebench.settings import noise_study
from tapebench.stats.aggregate import aggregate_seeds
from tapebench.utils.io import read_parquet_meta, write_parquet

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


class Recorder:
    """Wraps a stateless policy and keeps every transition (obs, actions, next_obs) it observes."""

    def __init__(self, act):
        self._act, self.transitions = act, []

    def begin(self, batch):
        self.transitions.clear()

    def act(self, obs):
        return self._act(obs)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        self.transitions.append((obs.clone(), actions.clone(), next_obs.clone()))


def applied_flips(recorder: Recorder, L: int) -> list[np.ndarray]:
    """Under rule 204 (identity) s' = G(s, a) XOR flips, so the flips are s' XOR G(s, a)."""
    out = []
    for obs, actions, next_obs in recorder.transitions:
        before = obs[:, :L].to(torch.uint8).clone()
        before[torch.arange(len(actions)), actions] ^= 1
        out.append((next_obs[:, :L].to(torch.uint8) ^ before).numpy())
    return out


def test_two_policies_see_the_same_noise_at_the_same_episode_and_step():
    L, H, eps = 8, 6, 0.2
    episodes = episode_set([204], 40, L, eval_seed=5, key=11, side="test", noise=eps)
    first_cell = Recorder(lambda obs: torch.zeros(len(obs), dtype=torch.long))
    last_one = Recorder(lambda obs: (L - 1) - obs[:, :L].flip(1).argmax(dim=1))
    a = run_episodes(first_cell, episodes, H)
    b = run_episodes(last_one, episodes, H)
    assert not np.array_equal(a["final_dist"], b["final_dist"])       # the policies do play differently
    flips_a, flips_b = applied_flips(first_cell, L), applied_flips(last_one, L)
    steps = min(len(flips_a), len(flips_b))
    assert steps >= 1
    for t in range(steps):
        assert np.array_equal(flips_a[t], flips_b[t]), t
        assert np.array_equal(flips_a[t], episodes.flips(t)), t
    assert sum(int(f.sum()) for f in flips_a) > 0


def test_noise_does_not_depend_on_batching_subsets_or_the_other_rules():
    L, H = 8, 8
    episodes = episode_set([30, 110, 204], 5, L, eval_seed=2, key=3, side="test", noise=0.1)
    whole = run_episodes(lambda o: o[:, :L].argmax(dim=1), episodes, H)
    for kwargs in ({"batch_size": 4}, {"by_rule": True}):
        parts = run_episodes(lambda o: o[:, :L].argmax(dim=1), episodes, H, **kwargs)
        for key in whole:
            assert np.array_equal(whole[key], parts[key]), (kwargs, key)
    alone = episode_set([110], 5, L, eval_seed=2, key=3, side="test", noise=0.1)
    rows = episodes.rules == 110
    assert np.array_equal(alone.noise_keys, episodes.noise_keys[rows])
    for t in range(H):
        assert np.array_equal(alone.flips(t), episodes.flips(t)[rows])
        assert np.array_equal(episodes.subset(np.flatnonzero(rows)).flips(t), alone.flips(t))
    # the stream is a third one: neither the tape stream nor the methods' episode keys
    assert noise_key(2, 3, "test", 110, 0) != alone.keys[0]
    other_side = episode_set([110], 5, L, eval_seed=2, key=3, side="train", noise=0.1)
    assert not np.array_equal(other_side.noise_keys, alone.noise_keys)


def test_flip_rate_matches_epsilon_and_levels_are_nested():
    n_episodes, L, H = 400, 16, 16
    base = episode_set([30], n_episodes, L, eval_seed=7, noise=0.3)
    cells = n_episodes * L * H
    masks = {}
    for eps in (0.01, 0.05, 0.3):
        masks[eps] = np.stack([noise_flips(base.noise_keys, t, L, eps) for t in range(H)])
        rate = masks[eps].mean()
        tolerance = 5 * np.sqrt(eps * (1 - eps) / cells)      # 5 binomial standard deviations
        assert abs(rate - eps) <= tolerance, (eps, rate)
    # the same uniforms serve every epsilon: flips at a smaller level are a subset of the larger level's
    assert not (masks[0.01] & ~masks[0.05]).any() and not (masks[0.05] & ~masks[0.3]).any()
    # neighbouring cells and steps are uncorrelated (the counter is (step, cell))
    m = masks[0.3].astype(float)
    assert abs(np.corrcoef(m[:, :, :-1].ravel(), m[:, :, 1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(m[:-1].ravel(), m[1:].ravel())[0, 1]) < 0.02


def test_k_colour_noise_moves_a_cell_to_a_uniform_other_colour_at_rate_epsilon():
    family = RuleFamily(3, 1)
    n_episodes, L, H, eps = 300, 16, 8, 0.2
    episodes = episode_set([0], n_episodes, L, eval_seed=3, family=family, noise=eps)
    shifts = np.stack([episodes.flips(t) for t in range(H)])
    cells = shifts.size
    assert set(np.unique(shifts)) == {0, 1, 2}
    rate = (shifts > 0).mean()
    assert abs(rate - eps) <= 5 * np.sqrt(eps * (1 - eps) / cells), rate
    # given noise, shift 1 and shift 2 are equally likely; the noisy cells are the two-colour flips
    ones = (shifts == 1).sum() / (shifts > 0).sum()
    assert abs(ones - 0.5) <= 5 * np.sqrt(0.25 / (shifts > 0).sum()), ones
    binary = np.stack([noise_flips(episodes.noise_keys, t, L, eps) for t in range(H)])
    assert np.array_equal(binary, (shifts > 0).astype(np.uint8))
    # rule 0 clears the tape, so after a failed step the tape is exactly the shifts
    got = run_episodes(lambda o: torch.zeros(len(o), dtype=torch.long), episodes, H)
    failed = ~got["success"]
    assert failed.any()
    assert np.allclose(got["final_dist"][failed], (episodes.flips(H - 1)[failed] > 0).sum(axis=1) / L)


def test_rule_0_success_under_noise_matches_the_closed_form():
    """Rule 0 clears the tape whatever the action, so step t succeeds iff its flip mask is empty:
    per episode, success iff one of the first H masks is empty, after (first such t) + 1 steps; over
    episodes P(success) = 1 - (1 - (1 - eps)^L)^H."""
    L, H, eps, n = 6, 3, 0.1, 3000
    episodes = episode_set([0], n, L, eval_seed=1, noise=eps)
    got = run_episodes(lambda o: torch.full((len(o),), 2, dtype=torch.long), episodes, H)
    empty = np.stack([episodes.flips(t).sum(axis=1) == 0 for t in range(H)], axis=1)
    assert np.array_equal(got["success"], empty.any(axis=1))
    first = np.where(empty.any(axis=1), empty.argmax(axis=1) + 1, H)
    assert np.array_equal(got["steps"], first)
    p = 1 - (1 - (1 - eps) ** L) ** H
    assert abs(got["success"].mean() - p) <= 4 * np.sqrt(p * (1 - p) / n), (got["success"].mean(), p)
    # after a failed step the noisy tape is exactly the flip mask
    failed = ~got["success"]
    assert np.allclose(got["final_dist"][failed], episodes.flips(H - 1)[failed].sum(axis=1) / L)


def test_epsilon_zero_is_todays_evaluation_bit_for_bit():
    split_free = dict(L=8, H=6, episodes_per_rule=3, eval_seed=4, rules=[4, 30, 110])
    a_eps, a_protocol, _ = protocol_episodes(**split_free)
    b_eps, b_protocol, _ = protocol_episodes(**split_free, noise=0.0)
    assert a_protocol == b_protocol and "noise" not in a_protocol.as_dict()
    assert a_eps.noise == 0.0 and a_eps.noise_keys is None and a_eps.flips(0) is None
    sides = side_protocols(**{**split_free, "rules": [4, 30, 110]})
    sides0 = side_protocols(**{**split_free, "rules": [4, 30, 110]}, noise=0.0)
    for method in ("random", "mpc"):
        hp = {"candidates": 32} if method == "mpc" else {}
        records, summary = evaluate_untrained(method, hp, 1, sides)
        records0, summary0 = evaluate_untrained(method, hp, 1, sides0)
        pd.testing.assert_frame_equal(records, records0)
        for timing in ("seconds", "cpu_seconds"):          # what the evaluation cost, not what it found
            summary.pop(timing), summary0.pop(timing)
        assert json.dumps(summary, sort_keys=True) == json.dumps(summary0, sort_keys=True)
    noisy = side_protocols(**{**split_free, "rules": [4, 30, 110]}, noise=0.05)
    assert noisy[0][1].as_dict()["noise"] == 0.05
    assert protocol_differences(a_protocol.as_dict(), noisy[0][1].as_dict()) == ["noise (0.0 vs 0.05)"]


def test_configuring_the_study_changes_no_existing_job_params():
    base = load_config(root=REPO)
    merge_config(base, load_config_file(REPO / "tests/data/tiny.yaml"))
    without = copy.deepcopy(base)
    without["studies"].pop("noise")
    validate_config(base, SCHEMA), validate_config(without, SCHEMA)
    for method in base["methods"]:
        slicer = checkpoint_eval_slice if get_method(method).trains else method_eval_slice
        assert slicer(base, method) == slicer(without, method)
        assert "noise" not in json.dumps(slicer(base, method))
    assert [j.name for _, j in registry.jobs(without) if "noise" in j.name] == []
    assert set(registry.targets(base)) - set(registry.targets(without)) == {
        "results/noise.tex", "results/noise.parquet", "results/figures/noise.pdf", "results/figures/noise.png"}


def test_noisy_evaluation_slices():
    config = load_config(root=REPO)
    merge_config(config, load_config_file(REPO / "tests/data/tiny.yaml"))
    validate_config(config, SCHEMA)
    dqn = noise_eval_slice(config, "dqn", "0.1")
    assert dqn["evaluation"] == {"episodes_per_rule": 1, "eval_seed": 20260101, "noise": 0.1, "checkpoints": 2}
    mpc = noise_eval_slice(config, "mpc", 0.1)
    assert mpc["agent"] == {"candidates": 64} and mpc["evaluation"]["noise"] == 0.1
    study = noise_study(config)
    assert study == {"levels": [0.0, 0.1], "methods": ["dqn", "ppo", "random", "mpc", "exact"], "H": 8, "split": "main"}
    assert layout.noise_per_seed("main", 0.0, "dqn", 8) == layout.per_seed("main", "dqn", 8)
    assert layout.noise_eval("main", 0.05, "dqn", 3, 8) == "results/noise/main/eps0.05/dqn/seed3_H8.parquet"
    assert [layout.noise_label(x) for x in (0, 0.5, 0.01, 1e-6)] == ["0", "0.5", "0.01", "0.000001"]


@pytest.mark.parametrize("noise, key, message", [
    ({"levels": [0.0, 0.6]}, "studies.noise.levels.1", "0.6 is greater than the maximum of 0.5"),
    ({"levels": [-0.1]}, "studies.noise.levels.0", "less than the minimum of 0"),
    ({"levels": [0.0123456]}, "studies.noise.levels[0]", "more than 6 decimals"),
    ({"levels": [0.1], "methods": ["nope"]}, "studies.noise.methods[0]", "unknown method 'nope'"),
    ({"levels": [0.1], "horizon": 0}, "studies.noise.horizon", "less than the minimum of 1"),
])
def test_bad_noise_study_config_is_rejected_naming_the_key(noise, key, message):
    config = load_config(root=REPO)
    merge_config(config, load_config_file(REPO / "tests/data/tiny.yaml"))
    config["studies"]["noise"] = noise
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    assert f"'{key}'" in str(info.value) and message in str(info.value), str(info.value)


def test_explicit_flips_are_checked_by_the_env():
    env = BatchedTapeEnv(2, L=8, H=4, rules=[204], noise=0.1, autoreset=False)
    env.reset()
    with pytest.raises(ValueError, match="without noise of its own"):
        env.step(torch.zeros(2, dtype=torch.long), np.zeros((2, 8), dtype=np.uint8))
    env = BatchedTapeEnv(2, L=8, H=4, rules=[204], autoreset=False)
    env.reset()
    with pytest.raises(ValueError, match=r"flips must have shape \(2, 8\)"):
        env.step(torch.zeros(2, dtype=torch.long), np.zeros((2, 7), dtype=np.uint8))


def test_every_method_without_training_plays_the_noisy_protocol():
    """Identify-then-plan restarts its identification on a contradiction under noise (it raises without noise);
    the planners plan with the noise-free rule; all finish and are scored on the noisy tape."""
    episodes, protocol, types = protocol_episodes(L=8, H=8, episodes_per_rule=6, eval_seed=3, rules=[0, 30, 110, 204],
                                                  noise=0.3)
    from tapebench.registry import PolicyContext, build_config

    context = PolicyContext(L=8, H=8, seed=0, train_rules=(0, 30), device=torch.device("cpu"))
    for method_id in ("identify_then_plan", "bayes_filter", "mpc", "exact", "random"):
        method = get_method(method_id)
        hp = {"candidates": 32} if method_id in ("identify_then_plan", "mpc") else {}
        frame = play(method.make_policy(build_config(method_id, hp), context), method, episodes, protocol, types)
        assert len(frame) == 24 and frame["success"].dtype == bool
        # rule 0 succeeds exactly at the first empty flip mask, for every method alike
        rule0 = frame[frame["rule"] == 0].sort_values("episode")
        empty = np.stack([episodes.flips(t)[episodes.rules == 0].sum(axis=1) == 0 for t in range(8)], axis=1)
        assert np.array_equal(rule0["success"].to_numpy(), empty.any(axis=1)), method_id


# --- the success-vs-epsilon table and figure ----------------------------------------------------------------
def _per_seed(noise_shift: dict[str, float], seeds=(0, 1, 2)) -> pd.DataFrame:
    """Synthetic per-seed success: agent base value - shift, + seed / 100 (test side: one tenth less)."""
    base = {"dqn": 0.30, "random": 0.10, "mpc": 0.60}
    rows = []
    for agent, value in base.items():
        for s in (seeds if agent != "mpc" else (0, 1)):
            for side, offset in (("train", 0.0), ("test", -0.1)):
                v = value - noise_shift[agent] + s / 100 + offset
                rows.append({"split": "main", "agent": agent, "L": 8, "H": 8, "seed": s, "side": side,
                             "metric": "success", "value": v, "k_used": 1, "checkpoint_first": 0,
                             "checkpoint_last": 0, "n_episodes": 10})
    return pd.DataFrame(rows)


def test_noise_table_and_figure_from_synthetic_per_seed_data(tmp_path):
    levels = [0.0, 0.05]
    shifts = {0.0: {"dqn": 0.0, "random": 0.0, "mpc": 0.0}, 0.05: {"dqn": 0.1, "random": 0.05, "mpc": 0.2}}
    paths = []
    for x in levels:
        agg = aggregate_seeds(_per_seed(shifts[x]), n_resamples=200, seed=0)
        path = tmp_path / f"agg{x}.parquet"
        write_parquet(path, agg, meta={"table": "aggregate", "config": {"ci": 0.95, "n_resamples": 200}})
        paths.append(str(path))
    text = render_noise_table(tmp_path / "noise.tex", aggregate=paths, levels=levels, split="main", H=8,
                              parquet=str(tmp_path / "noise.parquet"))
    summary = pd.read_parquet(tmp_path / "noise.parquet")
    assert read_parquet_meta(tmp_path / "noise.parquet")["table"] == "noise_summary"
    # dqn OOD at eps 0.05: mean over seeds 0..2 of 0.30 - 0.1 + s/100 - 0.1 = 0.11
    cell = summary[(summary.agent == "dqn") & (summary.side == "test") & (summary.noise == 0.05)].iloc[0]
    assert cell["mean"] == pytest.approx(0.11) and cell["n"] == 3 and cell["ci_low"] <= 0.11 <= cell["ci_high"]
    assert summary[(summary.agent == "mpc")]["n"].unique().tolist() == [2]
    # rows: the learned method first, the references under the rule; columns: ID then OOD, each level ascending
    body = text[text.index(r"\midrule"):]
    assert body.index("DQN") < body.index("Reference") < body.index("Random policy") < body.index("MPC")
    assert re.search(r"Method & \$n\$ & \$\\varepsilon=0\$ & \$\\varepsilon=0.05\$ & \$\\varepsilon=0\$ & "
                     r"\$\\varepsilon=0.05\$", text)
    dqn_line = next(line for line in text.splitlines() if line.startswith("DQN"))
    assert dqn_line == "DQN & 3 & 0.310 & 0.210 & 0.210 & 0.110 \\\\"
    assert r"\begin{tabular}{lrcccc}" in text and text.count("[") >= 12
    # one aggregate per level, the same methods at every level
    with pytest.raises(ValueError, match="one aggregate table per noise level"):
        render_noise_table(tmp_path / "x.tex", aggregate=paths[:1], levels=levels, split="main", H=8)
    partial = aggregate_seeds(_per_seed(shifts[0.05]).query("agent != 'random'"), n_resamples=50)
    with pytest.raises(ValueError, match=r"lacks methods \['random'\]"):
        noise_summary({0.0: pd.read_parquet(paths[0]), 0.05: partial}, split="main", H=8)
    figure = render_noise_figure(str(tmp_path / "fig"), aggregate=paths, levels=levels, split="main", H=8)
    assert [p[-3:] for p in figure] == ["pdf", "png"]
    assert (tmp_path / "fig.png").stat().st_size > 10_000
