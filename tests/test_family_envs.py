"""TapeEnv and BatchedTapeEnv for rule families (docs/protocol.md#rule-families): k colours, radius r,
increment-mod-k action, Box(0, k-1) tape observation, uniform initial colours, noise to another colour;
the batched env agrees with TapeEnv step for step; the elementary family is untouched."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tapebench  # noqa: F401  (registers tapebench/Tape-v0)
from tapebench.ca import reference
from tapebench.envs import ENV_ID
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.tape_env import TapeEnv
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.training.checkpoint import env_state, load_env_state

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_rules(family: RuleFamily, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [family.number(rng.integers(0, family.k, family.neighbourhoods)) for _ in range(n)]


def constant_rule(family: RuleFamily, colour: int) -> int:
    return family.number(np.full(family.neighbourhoods, colour))


def identity_rule(family: RuleFamily) -> int:
    return family.number(family.centre_cells)


# --- TapeEnv ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k, r", [(3, 1), (2, 2)])
def test_gymnasium_make_with_a_family_passes_env_checker(k, r):
    family = RuleFamily(k, r)
    rule = random_rules(family, 1, seed=k)[0]
    env = gymnasium.make(ENV_ID, rule=rule, L=32, H=32, k=k, r=r)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert info["rule"] == rule and env.unwrapped.family == family
    space = env.observation_space
    assert space.high.tolist() == [float(k - 1)] * 32 + [1.0] and space.low.tolist() == [0.0] * 33
    assert space.contains(obs) and set(obs[:32].tolist()) <= set(range(k))


def test_tape_env_family_transition_is_the_reference_transition():
    for family in (RuleFamily(3, 1), RuleFamily(4, 2), RuleFamily(2, 2)):
        rules = random_rules(family, 3, seed=family.k)
        env = TapeEnv(L=11, H=50, rules=rules, family=family)
        rng = np.random.default_rng(1)
        for episode in range(3):
            _, info = env.reset(seed=episode)
            tape, rule = env.tape.copy(), info["rule"]
            for _ in range(8):
                action = int(rng.integers(0, 11))
                _, _, terminated, _, info = env.step(action)
                tape = reference.transition(tape, action, rule, family)
                assert env.tape.tolist() == tape.tolist()
                assert info["dist"] == np.mean(tape != 0)
                if terminated:
                    break


def test_tape_env_increment_action_and_goal_in_k_colours():
    family = RuleFamily(3, 1)
    env = TapeEnv(rule=identity_rule(family), L=4, H=5, family=family, goal=[0, 2, 0, 0])
    obs, info = env.reset(options={"tape": [0, 1, 0, 2]})
    assert obs.tolist() == [0, 1, 0, 2, 0.0] and info["dist"] == 0.5
    obs, reward, terminated, *_ = env.step(3)          # 2 -> 0
    assert obs[:4].tolist() == [0, 1, 0, 0] and reward == -0.25 and not terminated
    obs, reward, terminated, *_ = env.step(1)          # 1 -> 2: the goal
    assert obs[:4].tolist() == [0, 2, 0, 0] and terminated and reward == 1.0


def test_tape_env_initial_tapes_are_uniform_over_the_colours():
    env = TapeEnv(rule=0, L=64, H=4, k=3, r=1)
    cells = np.concatenate([env.reset(seed=s)[0][:64] for s in range(100)])
    freq = np.bincount(cells.astype(int), minlength=3) / len(cells)
    assert np.all(np.abs(freq - 1 / 3) < 0.02), freq


def test_elementary_family_arguments_change_nothing():
    plain, explicit = TapeEnv(rule=110, L=16, H=8), TapeEnv(rule=110, L=16, H=8, k=2, r=1)
    a, b = plain.reset(seed=3)[0], explicit.reset(seed=3)[0]
    assert np.array_equal(a, b) and plain.observation_space == explicit.observation_space
    for action in (0, 5, 9):
        assert np.array_equal(plain.step(action)[0], explicit.step(action)[0])
    # k = 2, r = 2 draws its initial tape from the same fair-bits stream as the elementary family
    assert np.array_equal(TapeEnv(rule=7, L=16, k=2, r=2).reset(seed=3)[0], a)


def test_bad_family_arguments_are_named():
    with pytest.raises(ValueError, match=r"rule must be in 0\.\.3\^27 - 1"):
        TapeEnv(rule=3 ** 27, k=3, r=1)
    with pytest.raises(ValueError, match="colours k must be an integer in 2..4"):
        TapeEnv(rule=0, k=5)
    with pytest.raises(ValueError, match="contradicts"):
        TapeEnv(rule=0, k=3, family=RuleFamily(4, 1))
    with pytest.raises(ValueError, match="init_density applies to binary tapes"):
        TapeEnv(rule=0, k=3, init_density=0.3)
    with pytest.raises(ValueError, match=r"goal tape cells must be integers in 0\.\.2, got values \[3\]"):
        TapeEnv(rule=0, L=3, k=3, goal=[0, 3, 0])
    with pytest.raises(ValueError, match=r"load: tape cells must be integers in 0\.\.3"):
        BatchedTapeEnv(2, L=3, rules=[5], k=4, r=1).load([[0, 0, 4], [1, 0, 0]], [5, 5])


# --- noise in k colours ----------------------------------------------------------------------------

def test_noise_moves_a_cell_to_another_colour_uniformly():
    family = RuleFamily(3, 1)
    identity = identity_rule(family)
    for make in ("tape", "batched"):
        before, after = [], []
        if make == "tape":
            env = TapeEnv(rule=identity, L=64, H=1000, family=family, noise=0.5)
            env.reset(seed=0)
            for _ in range(40):
                tape = env.tape.copy()
                tape[0] = (tape[0] + 1) % 3
                env.step(0)
                before.append(tape)
                after.append(env.tape.copy())
        else:
            env = BatchedTapeEnv(40, L=64, H=1000, rules=[identity], family=family, noise=0.5)
            env.reset()
            tape = env.tapes.clone()
            tape[:, 0] = (tape[:, 0] + 1) % 3
            env.step(torch.zeros(40, dtype=torch.long))
            before, after = tape.numpy(), env.tapes.numpy()
        before, after = np.asarray(before).astype(int), np.asarray(after).astype(int)
        changed = before != after
        # epsilon = 0.5 changes half the cells: a noisy cell never keeps its colour (uniform over all
        # three colours would change only a third of them)
        assert abs(changed.mean() - 0.5) < 0.03, (make, changed.mean())
        # ... and takes each of the two other colours equally often
        up = ((after - before) % 3 == 1)[changed]
        assert abs(up.mean() - 0.5) < 0.05, (make, up.mean())


# --- BatchedTapeEnv --------------------------------------------------------------------------------

def _compare_step(tape_envs, results, batched_out, rule_numbers_of):
    obs, reward, terminated, truncated, info = batched_out
    for i, (t_obs, t_reward, t_term, t_trunc, t_info) in enumerate(results):
        assert np.array_equal(info["final_obs"][i].cpu().numpy(), t_obs), i
        assert reward[i].item() == np.float32(t_reward), i
        assert bool(terminated[i]) == t_term and bool(truncated[i]) == t_trunc, i
        assert info["dist"][i].item() == np.float32(t_info["dist"]), i
        assert rule_numbers_of(int(info["rule"][i])) == t_info["rule"] and int(info["t"][i]) == t_info["t"], i


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k, r, goal", [(3, 1, None), (3, 1, [0, 2, 1, 0, 0, 1, 0]), (4, 2, None)])
def test_batched_env_agrees_with_tape_env_step_for_step(device, k, r, goal):
    family = RuleFamily(k, r)
    L, H = 7, 5
    goal_tape = np.zeros(L, dtype=np.uint8) if goal is None else np.asarray(goal, dtype=np.uint8)
    identity, zero = identity_rule(family), constant_rule(family, 0)
    rule_set = [zero, identity] + random_rules(family, 4, seed=k * 10 + r)
    rng = np.random.default_rng(11)
    rules = [identity, zero] + [rule_set[i] for i in rng.integers(0, len(rule_set), 6)]
    n = len(rules)
    tapes = rng.integers(0, k, (n, L), dtype=np.uint8)
    tapes[0] = goal_tape
    tapes[0, 3] = (goal_tape[3] + k - 1) % k        # row 0: identity rule, incrementing cell 3 succeeds
    tapes[(tapes == goal_tape).all(1), 1] = (goal_tape[1] + 1) % k
    batched = BatchedTapeEnv(n, L=L, H=H, rules=rule_set, goal=goal, device=device, seed=5,
                             success_bonus=1.5, family=family)
    obs = batched.load(tapes, rules)
    assert batched.row_rules() == rules
    if family.fits_int64:
        assert batched.rules.dtype == torch.int64 and batched.rules.tolist() == rules

    def rule_number(rule_id):
        return rule_id if family.fits_int64 else batched.rule_numbers[rule_id]

    tape_envs = [TapeEnv(rule=z, L=L, H=H, rules=rule_set, goal=goal, success_bonus=1.5, family=family)
                 for z in rules]
    for env, tape, rule, row in zip(tape_envs, tapes, rules, obs.cpu().numpy()):
        t_obs, _ = env.reset(seed=0, options={"tape": tape, "rule": rule})
        assert np.array_equal(t_obs, row)

    successes = truncations = resets = 0
    for step in range(40):
        actions = rng.integers(0, L, n)
        if step == 0:
            actions[0] = 3
        results = [env.step(int(a)) for env, a in zip(tape_envs, actions)]
        out = batched.step(torch.as_tensor(actions, device=device))
        _compare_step(tape_envs, results, out, rule_number)
        obs, _, terminated, truncated, info = out
        done = (terminated | truncated).cpu().numpy()
        successes += int(terminated.sum())
        truncations += int(truncated.sum())
        new_tapes, new_rules = batched.tapes.cpu().numpy(), batched.row_rules()
        for i in np.flatnonzero(done):
            resets += 1
            assert new_rules[i] in rule_set and int(batched.t[i]) == 0
            assert not np.array_equal(new_tapes[i], goal_tape)
            t_obs, _ = tape_envs[i].reset(options={"tape": new_tapes[i], "rule": new_rules[i]})
            assert np.array_equal(obs[i].cpu().numpy(), t_obs)
    assert successes > 0 and truncations > 0 and resets > n


def test_batched_rule_ids_beyond_int64_are_positions_in_rule_numbers():
    family = RuleFamily(4, 1)                      # rule numbers up to 4^64 - 1
    rule_set = [2 ** 100 + 1, 7]
    env = BatchedTapeEnv(4, L=8, H=3, rules=rule_set, family=family, seed=1)
    env.reset()
    assert env.rule_numbers == rule_set and env.rules.dtype == torch.int64
    assert set(env.rules.tolist()) <= {0, 1}
    assert env.row_rules() == [rule_set[i] for i in env.rules.tolist()]
    outside = 4 ** 64 - 1
    env.load(np.ones((4, 8), dtype=np.uint8), [outside, 7, outside, 2 ** 100 + 1])
    assert env.rule_numbers == rule_set + [outside]
    assert env.rules.tolist() == [2, 1, 2, 0]
    _, _, _, _, info = env.step(torch.zeros(4, dtype=torch.long))
    assert info["rule"].tolist() == [2, 1, 2, 0]
    # the all-3 rule maps everything to colour 3: a row under it is at distance 1
    assert info["dist"][0].item() == 1.0 and info["dist"][2].item() == 1.0
    for _ in range(20):     # resets draw from the rule set only, never the loaded extra rule
        env.step(torch.zeros(4, dtype=torch.long))
    assert set(env.row_rules()) <= set(rule_set)


def test_batched_initial_tapes_uniform_and_elementary_stream_unchanged():
    env = BatchedTapeEnv(256, L=32, rules=random_rules(RuleFamily(3, 1), 5, 0), k=3, r=1, seed=0)
    cells = env.reset().numpy()[:, :32]
    freq = np.bincount(cells.astype(int).ravel(), minlength=3) / cells.size
    assert np.all(np.abs(freq - 1 / 3) < 0.02), freq
    # k = 2: the fair-bits stream of the elementary env, whatever the radius
    elementary = BatchedTapeEnv(64, L=16, rules=range(256), seed=4).reset()[:, :16]
    radius_two = BatchedTapeEnv(64, L=16, rules=[0, 1, 2 ** 31], k=2, r=2, seed=4).reset()[:, :16]
    assert torch.equal(elementary, radius_two)


def test_batched_elementary_family_argument_is_the_default_env():
    def trajectory(**kwargs):
        env = BatchedTapeEnv(32, L=9, H=4, rules=range(256), seed=3, noise=(0.0, 0.2), **kwargs)
        env.reset()
        gen = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(10):
            obs, reward, _, _, info = env.step(torch.randint(0, 9, (32,), generator=gen))
            rows.append(torch.cat([obs.flatten(), reward, info["rule"].float()]))
        assert env.rules.dtype == torch.uint8
        return torch.stack(rows)

    assert torch.equal(trajectory(), trajectory(family=ELEMENTARY))
    assert torch.equal(trajectory(), trajectory(k=2, r=1))


@pytest.mark.parametrize("k, r", [(3, 1), (4, 1)])
def test_checkpoint_env_state_round_trip_for_families(k, r):
    family = RuleFamily(k, r)
    rule_set = random_rules(family, 6, seed=3)

    def run(env, steps):
        gen = torch.Generator().manual_seed(1)
        out = []
        for _ in range(steps):
            obs, *_ = env.step(torch.randint(0, 10, (16,), generator=gen))
            out.append(obs)
        return torch.stack(out)

    env = BatchedTapeEnv(16, L=10, H=6, rules=rule_set, family=family, seed=2)
    env.reset()
    run(env, 7)
    state = env_state(env)
    expected = run(env, 12)
    restored = BatchedTapeEnv(16, L=10, H=6, rules=rule_set, family=family, seed=99)
    load_env_state(restored, state)
    assert torch.equal(run(restored, 12), expected)


# --- the throughput benchmark (figures are not asserted: only what the command computes and writes) --

def test_bench_families_writes_ratios_json_and_figure(tmp_path):
    import json

    from tapebench.cli import main

    out_json, out_png = tmp_path / "families.json", tmp_path / "families.png"
    assert main(["bench", "families", "--seconds", "0.01", "--repeats", "1", "--L", "8", "--num-envs", "16",
                 "--json", str(out_json), "--figure", str(out_png)]) == 0
    figures = json.loads(out_json.read_text())["figures"]
    env = figures["env"]
    assert set(env) == {"eca", "k3r1", "k2r2", "k4r1"} and figures["num_envs"] == 16 and figures["threads"] == 1
    for row in env.values():
        assert row["steps_per_s"] > 0 and row["slowdown"] == env["eca"]["steps_per_s"] / row["steps_per_s"]
    assert set(figures["kernel"]) == {"packed_eca", "eca", "k3r1", "k2r2", "k4r1"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_families_rejects_a_figure_it_cannot_write(tmp_path, capsys):
    from tapebench.cli import main

    assert main(["bench", "families", "--figure", str(tmp_path / "f.svg")]) != 0
    assert "--figure must end in .png or .pdf" in capsys.readouterr().err
