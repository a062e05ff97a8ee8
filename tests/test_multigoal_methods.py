"""Every learned method takes the episode's goal (docs/protocol.md#multi-goal): each trains on derived goals and plays
them, reading the goal as input channels beside the tape; RAD/CURL shift tape and goal together; the ensemble MPC
scores its predicted tapes against each episode's own goal. In the fixed-goal protocol (the paper's) nothing changed:
short runs give the parameters and returns recorded before goals were added, bit for bit."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.methods import augment
from tapebench.registry import registry
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
DQN = {"num_envs": 4, "buffer_size": 500, "learning_starts": 32, "batch_size": 16, "hidden_size": 16,
       "target_update_frequency": 64}
PEARL = {"num_envs": 4, "hidden_size": 16, "latent_dim": 4, "encoder_hidden_size": 16, "buffer_size": 64,
         "learning_starts": 32, "batch_size": 16, "target_update_frequency": 48}
PPO = {"num_envs": 4, "num_steps": 16, "hidden_size": 16}
EQUIVARIANT = {"conv_channels": 4, "conv_layers": 2}
ENSEMBLE = {"num_envs": 4, "ensemble_size": 2, "hidden_size": 16, "buffer_size": 200, "batch_size": 8,
            "learning_starts": 32, "candidates": 16}
WORLD_MODEL = {"num_envs": 4, "deter_size": 16, "hidden_size": 16, "stoch_groups": 8, "batch_size": 4,
               "sequence_length": 8, "train_ratio": 16, "learning_starts": 64, "buffer_size": 256}
DREAMER = {**WORLD_MODEL, "imagination_horizon": 4, "imagination_starts": 16}
TINY = {"dqn": DQN, "dqn_her": DQN, "dqn_equivariant": {**DQN, **EQUIVARIANT}, "rainbow": {**DQN, "buffer_size": 100, "atoms": 11,
                                                                              "batch_size": 8},
        "rad_dqn": DQN, "curl_dqn": DQN, "pearl_dqn": PEARL, "pearl_dqn_equivariant": {**PEARL, **EQUIVARIANT},
        "ppo": PPO, "ppo_dr": PPO, "ppo_equivariant": {**PPO, **EQUIVARIANT},
        "ppo_context": {**PPO, **EQUIVARIANT}, "rl2_a2c": {"num_envs": 4, "num_steps": 12, "hidden_size": 16},
        "ensemble_mpc": ENSEMBLE, "ensemble_mpc_ig": ENSEMBLE,
        "ensemble_mpc_equivariant": {**{k: v for k, v in ENSEMBLE.items() if k != "hidden_size"}, **EQUIVARIANT},
        "dreamer": DREAMER, "dreamer_large": DREAMER, "planet": {**WORLD_MODEL, "candidates": 8},
        "context_mpc": None}


def learned_methods_of_the_paper_and_extended_presets() -> list[str]:
    """Every method that trains in config/config.yaml's and config/extended.yaml's `methods` (a preset's list
    replaces the default one) and in their studies' method lists."""
    ids = set()
    for name in ("config.yaml", "extended.yaml"):
        config = yaml.safe_load((REPO / "config" / name).read_text())
        ids.update(config.get("methods", []))
        for study in (config.get("studies") or {}).values():
            if isinstance(study, dict):
                ids.update(study.get("methods") or [])
                for table in study.values():
                    if isinstance(table, dict):
                        ids.update(table.get("methods") or [])
    methods = registry()
    return sorted(m for m in ids if m in methods and methods[m].trains)


LEARNED = learned_methods_of_the_paper_and_extended_presets()
MULTIGOAL_ONLY = ["dqn_her"]   # learned rows that exist for derived goals only: in the multi-goal presets, no other


def test_every_learned_method_of_the_paper_and_extended_presets_takes_the_goal_and_runs_in_the_multigoal_presets():
    assert {"dqn", "rainbow", "ppo_dr", "rad_dqn", "curl_dqn", "pearl_dqn", "rl2_a2c", "dreamer", "planet",
            "ensemble_mpc"} <= set(LEARNED)
    assert not [m for m in LEARNED if not registry()[m].goal_conditioned]
    for preset in ("multigoal.yaml", "multigoal_quick.yaml"):
        listed = yaml.safe_load((REPO / "config" / preset).read_text())["methods"]
        assert set(LEARNED + MULTIGOAL_ONLY) <= set(listed), (preset, sorted(set(LEARNED) - set(listed)))
    assert all(registry()[m].needs_derived_goal for m in MULTIGOAL_ONLY)


@pytest.mark.parametrize("agent", sorted(m for m in TINY if TINY[m] is not None))
def test_a_learned_method_trains_on_derived_goals_reads_the_goal_and_plays_each_episodes_goal(tmp_path, agent):
    spec = TrainSpec(agent=agent, rules=(30, 204), seed=0, L=8, H=8, total_steps=128, eval_every=128,
                     hyperparameters=TINY[agent], goal="derived", goal_steps=4)
    assert spec.env_spec().obs_dim == 17 and spec.env_spec().goal_in_obs
    manifest = train(spec, tmp_path / "run", quiet=True)
    payload = ckpt.load(tmp_path / "run" / manifest["checkpoints"][-1]["file"])
    assert payload["env_spec"]["obs_dim"] == 17
    records, summary = evaluate_run(tmp_path / "run", 8, rules=[204, 30], episodes_per_rule=3, eval_seed=3,
                                    goal_mode="derived", goal_steps=4)
    assert summary["protocols"][0]["goal_mode"] == "derived" and len(records) == 2 * 3
    assert records["success"].between(0, 1).all()


def test_the_rad_and_curl_shift_moves_the_goal_with_the_tape_and_keeps_t():
    torch.manual_seed(0)
    L = 8
    tape, goal, time = torch.randint(0, 2, (5, L)).float(), torch.randint(0, 2, (5, L)).float(), torch.rand(5, 1)
    shifts = torch.tensor([0, 1, 3, 7, 5])
    out = augment.shift_tapes(torch.cat([tape, goal, time], 1), shifts, L)
    for i, k in enumerate(shifts.tolist()):
        assert torch.equal(out[i, :L], tape[i].roll(k)) and torch.equal(out[i, L:2 * L], goal[i].roll(k))
    assert torch.equal(out[:, -1:], time)
    # a flipped view flips tape cells only, never the goal's
    view = augment.View(shifts=None, flips=torch.ones(5, L, dtype=torch.bool))
    flipped = view.observations(torch.cat([tape, goal, time], 1), L)
    assert torch.equal(flipped[:, :L], 1 - tape) and torch.equal(flipped[:, L:], torch.cat([goal, time], 1))


def test_the_ensemble_planner_scores_each_row_against_its_own_goal():
    """A batch of rows with their own goals plans, row by row, what a fixed-goal batch of that goal plans."""
    from tapebench.methods import ensemble_mpc
    from tapebench.methods.contract import EpisodeBatch

    L, n = 8, 6
    config = ensemble_mpc.Config(candidates=32, plan_horizon=3)

    def identity(inputs):   # rule 204: the next tape is the post-action tape (the last L inputs)
        return inputs[:, -L:].float().unsqueeze(0)

    rng = np.random.default_rng(1)
    goals = rng.integers(0, 2, (n, L), dtype=np.uint8)
    tapes = torch.as_tensor(rng.integers(0, 2, (n, L)), dtype=torch.float32)
    obs = torch.cat([tapes, torch.as_tensor(goals, dtype=torch.float32), torch.zeros(n, 1)], 1)
    keys = np.arange(n, dtype=np.uint64) + np.uint64(11)
    planner = ensemble_mpc.EnsemblePlanner(identity, config, "cpu")
    planner.begin(EpisodeBatch(L=L, H=8, keys=keys, goal=np.zeros(L, np.uint8), success_bonus=1.0,
                               device=torch.device("cpu"), goals=goals))
    together = planner.act(obs)
    for i in range(n):
        alone = ensemble_mpc.EnsemblePlanner(identity, config, "cpu")
        alone.begin(EpisodeBatch(L=L, H=8, keys=keys[i:i + 1], goal=goals[i], success_bonus=1.0,
                                 device=torch.device("cpu")))
        assert together[i] == alone.act(torch.cat([tapes[i:i + 1], torch.zeros(1, 1)], 1))[0]


def _policy_digest(payload) -> str:
    digest = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            digest.update(x.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(x, dict):
            for key in sorted(x, key=str):
                walk(x[key])
        elif isinstance(x, (list, tuple)):
            for value in x:
                walk(value)
    walk(payload["policy"])
    return digest.hexdigest()


RECORDED = json.loads((REPO / "tests" / "data" / "fixed_goal_digests.json").read_text())
FIXED_GOAL_CASES = {"dqn": DQN, "rad_dqn": DQN, "curl_dqn": DQN, "dreamer": DREAMER,
                    "planet": {**WORLD_MODEL, "candidates": 8}, "ensemble_mpc": ENSEMBLE, "ensemble_mpc_ig": ENSEMBLE}


@pytest.mark.parametrize("agent", sorted(FIXED_GOAL_CASES))
def test_fixed_goal_training_and_evaluation_are_bit_for_bit_those_before_goals_were_added(tmp_path, agent):
    """The parameters after 192 steps and the evaluation returns of a fixed-goal run (obs [s, t/H]) are those the
    code before this change (cd8c624, the one that made reference/tape-v2) gave on the same seed."""
    if torch.__version__ != RECORDED["torch"]:
        pytest.skip(f"digests recorded with torch {RECORDED['torch']}, this is {torch.__version__}")
    spec = TrainSpec(agent=agent, rules=(30, 90, 110), seed=0, L=8, H=8, total_steps=192, eval_every=192,
                     hyperparameters=FIXED_GOAL_CASES[agent])
    manifest = train(spec, tmp_path / "run", quiet=True)
    payload = ckpt.load(tmp_path / "run" / manifest["checkpoints"][-1]["file"])
    records, _ = evaluate_run(tmp_path / "run", 8, rules=[30, 90], episodes_per_rule=2, eval_seed=3)
    recorded = RECORDED["runs"][agent]
    assert _policy_digest(payload) == recorded["policy_sha256"]
    assert [float(r) for r in records["return"]] == recorded["returns"]


def test_the_world_model_predicts_tapes_without_the_goal_and_its_scoring_heads_read_it():
    from tapebench.methods import dreamer
    from tapebench.methods.contract import EnvSpec

    config = dreamer.Config(**{k: v for k, v in DREAMER.items() if k in dreamer.Config.__dataclass_fields__})
    torch.manual_seed(0)
    agent = dreamer.make(config, EnvSpec.for_tape(8, 8, goal_in_obs=True), 256, "cpu")
    model = agent.model
    assert model.encoder[0].in_features == 9 and model.decoder[-1].out_features == 8
    assert model.reward_head[0].in_features == model.feat_size + 8 == agent.actor[0].in_features
    tape, goal = torch.randint(0, 2, (5, 8)).float(), torch.randint(0, 2, (5, 8)).float()
    time = torch.full((5, 1), 0.25)
    with torch.no_grad():   # the encoder reads [s, t/H]: the goal does not change the embedding
        assert torch.equal(model.encode(torch.cat([tape, goal, time], 1)), model.encoder(torch.cat([tape, time], 1)))
        for p in model.reward_head.parameters():   # DreamerV3 zero-initialises the reward output: give it weights
            p.normal_()
        feat = torch.randn(5, model.feat_size)
        assert not torch.allclose(model.reward(feat, goal), model.reward(feat, 1 - goal))
        assert not torch.allclose(model.cont(feat, goal), model.cont(feat, 1 - goal))
    with pytest.raises(ValueError, match="trained on derived goals"):
        model.reward(feat)


@pytest.mark.parametrize("preset", ["config/multigoal_quick.yaml", "config/multigoal.yaml"])
def test_the_multigoal_presets_build_table3_with_every_learned_method(tmp_path, preset):
    from pipeline_helpers import make_workdir, scheduled_jobs, snakemake

    work = make_workdir(tmp_path)
    results_dir = yaml.safe_load((REPO / preset).read_text())["results_dir"]   # each preset writes its own folder
    proc = snakemake(work, "--dry-run", f"{results_dir}/table3.tex", configfiles=(preset,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled_jobs(proc.stdout)
    trained = {wc["agent"] for rule, wc in jobs if rule in ("train", "train_block")}
    assert set(LEARNED + MULTIGOAL_ONLY) <= trained and "render_table3" in {rule for rule, _ in jobs}


@pytest.mark.slow
def test_a_tiny_multigoal_table3_with_dqn_and_rad_dqn_is_built(tmp_path):
    """The whole DAG of Table 3 on the tiny protocol with derived goals, DQN and DQN + RAD beside the references
    (about 90 s on 2 cores)."""
    from pipeline_helpers import make_workdir, snakemake

    work = make_workdir(tmp_path)
    (work / "goals.yaml").write_text(yaml.safe_dump({
        "env": {"goal": "derived", "goal_steps": 4}, "methods": ["dqn", "rad_dqn", "random", "mpc"],
        "studies": {"noise": {"levels": []}, "worldtest": {"methods": []}, "fewshot": {"methods": []}}}))
    proc = snakemake(work, "results/table3.tex", configfiles=("tiny.yaml", "goals.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (work / "results/table3.tex").read_text()
    assert "DQN + RAD &" in table and "\nDQN &" in table
    manifest = json.loads((work / "results/runs/main/rad_dqn/seed0/train.json").read_text())
    assert manifest["env"]["goal"] == "derived"
