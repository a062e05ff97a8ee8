"""Corrupt and wrong-kind artifacts: every error names the file and the way to recover, a run whose
files do not load is never taken as finished, and `tapebench train` rejects its arguments before it
creates anything."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from tapebench.cli import main
from tapebench.pipeline.integrity import scan_results
from tapebench.splits.io import save_split
from tapebench.training import checkpoint as ckpt
from tapebench.utils.artifacts import CorruptArtifact, file_sha256, read_table

PARAMS = {"agent": {"num_envs": 4, "hidden_size": 16, "learning_starts": 32, "buffer_size": 500,
                    "batch_size": 16, "target_update_frequency": 64},
          "env": {"L": 8, "H": 8}, "training": {"total_steps": 128, "eval_every": 64}}
EVAL_PARAMS = {"env": {"L": 8, "H": 8}, "evaluation": {"episodes_per_rule": 1, "eval_seed": 1}}
DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: b"\x00not a checkpoint\xff" * 64,
}


@pytest.fixture(scope="module")
def split_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("split") / "toy.json"
    save_split(path, {"name": "toy", "train": [4, 12, 200], "test": [0, 76], "params": {}, "unit": "rule",
                      "types": {"4": "periodic", "12": "periodic", "200": "stable", "0": "stable", "76": "stable"}})
    return path


def train_args(split_file, out, **overrides):
    args = {"--agent": "dqn", "--split": str(split_file), "--seed": "0", "--params": json.dumps(PARAMS),
            "--out": str(out), "--device": "cpu", "--threads": "1", **overrides}
    return ["train", *[x for kv in args.items() for x in kv], "--quiet"]


def evaluate_args(run, split_file, out):
    return ["evaluate", "--run", str(run), "--split", str(split_file), "--H", "8", "--params",
            json.dumps(EVAL_PARAMS), "--out", str(out), "--device", "cpu", "--quiet"]


def same_tensors(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    return a == b


@pytest.fixture(scope="module")
def finished_run(split_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "seed0"
    assert main(train_args(split_file, out)) == 0
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    """A copy of the finished run where the pipeline keeps runs (results/): its damage is advised deleted."""
    copy = tmp_path / "results" / "runs" / "toy" / "dqn" / "seed0"
    shutil.copytree(finished_run, copy)
    return copy


def test_manifest_records_each_checkpoint_hash(finished_run):
    manifest = json.loads((finished_run / ckpt.MANIFEST_FILE).read_text())
    assert [c["env_steps"] for c in manifest["checkpoints"]] == [64, 128]
    for entry in manifest["checkpoints"]:
        assert entry["sha256"] == file_sha256(finished_run / entry["file"])


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoint_is_named_with_recovery_and_the_run_is_trained_again(
        run, split_file, tmp_path, capsys, damage):
    target = run / "checkpoints" / "step_0000064.pt"
    good = target.read_bytes()
    target.write_bytes(DAMAGE[damage](good))

    assert main(evaluate_args(run, split_file, tmp_path / "eval.parquet")) == 2
    err = capsys.readouterr().err
    assert str(target) in err and f"rm -r {run}" in err and "Traceback" not in err
    assert not (tmp_path / "eval.parquet").exists()
    with pytest.raises(CorruptArtifact, match="step_0000064.pt"):
        ckpt.load(target)

    assert main(train_args(split_file, run)) == 0
    log = (run / ckpt.LOG_FILE).read_text()
    assert "the run is not finished" in log and "damaged" in log
    assert log.rstrip().splitlines()[-1].split("] ", 1)[1].startswith("done:")
    (tmp_path / "good.pt").write_bytes(good)   # CPU training is deterministic: the same weights again
    assert same_tensors(ckpt.load(target)["policy"], ckpt.load(tmp_path / "good.pt")["policy"])
    assert main(evaluate_args(run, split_file, tmp_path / "eval.parquet")) == 0


def test_truncated_manifest_is_reported_as_corrupt_not_missing(run, split_file, tmp_path, capsys):
    manifest = run / ckpt.MANIFEST_FILE
    manifest.write_text(manifest.read_text()[:40])
    assert main(evaluate_args(run, split_file, tmp_path / "eval.parquet")) == 2
    err = capsys.readouterr().err
    assert f"{manifest} is corrupt" in err and "not valid JSON" in err and "missing" not in err
    assert f"rm -r {run}" in err

    assert main(train_args(split_file, run)) == 0
    assert "nothing to do" not in (run / ckpt.LOG_FILE).read_text().splitlines()[-3]
    assert json.loads(manifest.read_text())["checkpoints"][-1]["env_steps"] == 128


def test_finished_intact_run_is_not_retrained(run, split_file):
    before = (run / ckpt.MANIFEST_FILE).read_text()
    assert main(train_args(split_file, run)) == 0
    assert "nothing to do" in (run / ckpt.LOG_FILE).read_text().splitlines()[-1]
    assert (run / ckpt.MANIFEST_FILE).read_text() == before


@pytest.mark.parametrize("overrides, needle", [
    ({"--agent": "sac"}, "unknown method 'sac'"),
    ({"--threads": "0"}, "threads must be an integer >= 1"),
    ({"--device": "tpu"}, "device must be 'auto', 'cpu' or 'cuda[:N]'"),
    ({"--params": json.dumps({**PARAMS, "agent": {"gamma": 3.0}})}, "gamma"),
    ({"--params": json.dumps({**PARAMS, "training": {"total_steps": 10**9, "eval_every": 1}})},
     "at most 1000 checkpoints per run"),
    ({"--params": "{not json"}, "--params is not valid JSON"),
])
def test_train_rejects_arguments_before_creating_its_output(split_file, tmp_path, capsys, overrides, needle):
    out = tmp_path / "new" / "seed0"
    assert main(train_args(split_file, out, **overrides)) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.fixture(scope="module")
def tables(finished_run, split_file, tmp_path_factory):
    """An episode file, a per-seed table and an aggregate table written by the real commands."""
    d = tmp_path_factory.mktemp("tables")
    assert main(evaluate_args(finished_run, split_file, d / "eval_H8.parquet")) == 0
    assert main(["aggregate-seed", "--episodes", str(d / "eval_H8.parquet"), "--last-k", "2",
                 "--out", str(d / "per_seed.parquet")]) == 0
    assert main(["aggregate", "--per-seed", str(d / "per_seed.parquet"), "--n-resamples", "100",
                 "--out", str(d / "aggregate.parquet")]) == 0
    return d


def test_render_refuses_an_episode_file_given_as_the_aggregate(tables, tmp_path, capsys):
    out = tmp_path / "table3.tex"
    assert main(["render", "table3", "--aggregate", str(tables / "eval_H8.parquet"), "--split", "toy",
                 "--H", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{tables / 'eval_H8.parquet'} is not an aggregate table" in err
    assert "per-episode evaluation records of an agent (written by `tapebench evaluate`)" in err
    assert "`tapebench aggregate --out`" in err and not out.exists()
    assert main(["render", "table3", "--aggregate", str(tables / "aggregate.parquet"), "--split", "toy",
                 "--H", "8", "--out", str(out)]) == 0


def test_aggregate_commands_refuse_the_wrong_kind(tables, tmp_path, capsys):
    assert main(["aggregate", "--per-seed", str(tables / "eval_H8.parquet"), "--out", str(tmp_path / "a.parquet")]) == 2
    assert "is not a per-seed table: it looks like per-episode evaluation records" in capsys.readouterr().err
    assert main(["aggregate-seed", "--episodes", str(tables / "per_seed.parquet"),
                 "--out", str(tmp_path / "b.parquet")]) == 2
    assert "is not per-episode evaluation records of an agent: it looks like a per-seed table" \
        in capsys.readouterr().err


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_aggregate_is_named_with_recovery(tables, tmp_path, capsys, damage):
    """Under results/ the recovery is deleting it; elsewhere (not the pipeline's file) writing it again."""
    for bad, recovery in ((tmp_path / "results" / "aggregate.parquet", "rm {bad}"),
                          (tmp_path / "aggregate.parquet", "write it again with `tapebench aggregate --out`")):
        bad.parent.mkdir(exist_ok=True)
        bad.write_bytes(DAMAGE[damage]((tables / "aggregate.parquet").read_bytes()))
        assert main(["render", "table3", "--aggregate", str(bad), "--split", "toy", "--H", "8",
                     "--out", str(tmp_path / "t.tex")]) == 2
        err = capsys.readouterr().err
        assert f"{bad} is corrupt or unreadable" in err and recovery.format(bad=bad) in err and "Traceback" not in err
        assert ("rm " in err) == recovery.startswith("rm ")
        with pytest.raises(CorruptArtifact):
            read_table(bad, "aggregate")


def test_scan_results_finds_every_damaged_artifact(run, tables, split_file, tmp_path):
    results = tmp_path / "results"
    assert run == results / "runs/toy/dqn/seed0"     # the fixture's copy is in this results folder
    shutil.copy(tables / "aggregate.parquet", results / "aggregate.parquet")
    shutil.copy(split_file, results / "splits.json")
    (results / "splits").mkdir()
    shutil.copy(split_file, results / "splits" / "toy.json")
    assert scan_results(results) == []

    seed0 = results / "runs/toy/dqn/seed0"
    (seed0 / "checkpoints/step_0000064.pt").write_bytes(b"")
    (results / "aggregate.parquet").write_bytes(b"PAR1 garbage")
    split = json.loads((results / "splits/toy.json").read_text())
    split["test"] = [0]
    (results / "splits/toy.json").write_text(json.dumps(split))
    (seed0 / "checkpoints/step_0000128.pt").unlink()
    found = {p.path.relative_to(results).as_posix(): (p.problem, p.remove) for p in scan_results(results)}
    assert set(found) == {"runs/toy/dqn/seed0/checkpoints/step_0000064.pt", "aggregate.parquet",
                          "splits/toy.json", "runs/toy/dqn/seed0/train.json"}
    assert found["runs/toy/dqn/seed0/checkpoints/step_0000064.pt"][1] == seed0
    assert found["aggregate.parquet"][1] == results / "aggregate.parquet"
    assert "content hash mismatch" in found["splits/toy.json"][0]
    assert "step_0000128.pt" in found["runs/toy/dqn/seed0/train.json"][0]
