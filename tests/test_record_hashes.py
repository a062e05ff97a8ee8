"""Records that cannot lie (issue 50, item 3): every table the pipeline writes carries a content hash of its data in
its provenance record, checked where it is read; records that contradict themselves are refused; the same content
under two paths is refused by every aggregate; files written before the hash existed stay readable."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from agent_contract import toy_split

from tapebench import layout
from tapebench.cli import main
from tapebench.utils.artifacts import CorruptArtifact, read_table
from tapebench.utils.io import CONTENT_HASH, read_parquet_meta, table_content_hash, write_parquet


def _evaluate(tmp_path, seed: int = 0, episodes: int = 3):
    """A random policy's evaluation records at their place in the layout (results/runs/toy/random/seed<seed>)."""
    split = tmp_path / "toy.json"
    if not split.exists():
        toy_split(split)
    out = tmp_path / layout.evaluation(layout.run_dir("toy", "random", seed), 8)
    params = {"env": {"L": 8}, "evaluation": {"episodes_per_rule": episodes}}
    assert main(["evaluate", "--method", "random", "--seed", str(seed), "--split", str(split), "--H", "8",
                 "--params", json.dumps(params), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    return out


def _edit(path, change) -> None:
    """Rewrite a Parquet file with `change(frame)` applied and its schema metadata (provenance, hash) kept."""
    table = pq.read_table(path)
    frame = change(table.to_pandas())
    edited = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(table.schema.metadata)
    pq.write_table(edited, path)


# --- the hash --------------------------------------------------------------------------------------------------
def test_the_content_hash_is_of_the_data_in_a_canonical_form():
    frame = pd.DataFrame({"rule": np.array([4, 30], dtype=np.int64), "side": ["train", "test"],
                          "success": [True, False], "final_dist": [0.0, np.nan]})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    digest = table_content_hash(table)
    assert len(digest) == 64 and digest == table_content_hash(table)
    # what a Parquet round trip or another writer may change without changing a value: the same hash
    narrow = frame.assign(rule=frame["rule"].astype(np.int32), side=pd.Categorical(frame["side"]))
    assert table_content_hash(pa.Table.from_pandas(narrow, preserve_index=False)) == digest
    assert table_content_hash(pa.concat_tables([table.slice(0, 1), table.slice(1)])) == digest
    assert table_content_hash(table.replace_schema_metadata({b"x": b"y"})) == digest
    # any value, name or order: another hash; strings cannot trade characters across rows
    changed = [frame.assign(success=[True, True]), frame.assign(final_dist=[0.0, 0.5]), frame.rename(columns={
        "rule": "rules"}), frame[["side", "rule", "success", "final_dist"]], frame.iloc[::-1]]
    for other in changed:
        assert table_content_hash(pa.Table.from_pandas(other, preserve_index=False)) != digest
    ab = pa.table({"s": ["ab", "c"]})
    assert table_content_hash(ab) != table_content_hash(pa.table({"s": ["a", "bc"]}))


def test_every_written_table_records_the_hash_of_what_it_holds(tmp_path):
    out = _evaluate(tmp_path)
    meta = read_parquet_meta(out)
    assert meta[CONTENT_HASH] == table_content_hash(pq.read_table(out))
    frame, read_meta = read_table(out, "episodes")
    assert read_meta[CONTENT_HASH] == meta[CONTENT_HASH] and len(frame) == 5 * 3
    # the hash is metadata only: the records' values are what they were (same seed, same numbers)
    again = _evaluate(tmp_path / "again")
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(again))
    assert read_parquet_meta(again)[CONTENT_HASH] == meta[CONTENT_HASH]


# --- an edited value is refused where it is read -----------------------------------------------------------------
def test_an_edited_value_is_refused_naming_the_file(tmp_path, capsys):
    out = _evaluate(tmp_path)
    _edit(out, lambda f: f.assign(**{"return": f["return"] + 1.0}))
    with pytest.raises(CorruptArtifact, match="do not match the content hash") as info:
        read_table(out, "episodes")
    assert str(out) in str(info.value)
    assert main(["aggregate-seed", "--episodes", str(out), "--out", str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "content hash" in err and "Traceback" not in err


def test_ood_success_set_true_is_refused(tmp_path, capsys):
    """The issue's edit: success = True on every OOD episode, metadata kept."""
    out = _evaluate(tmp_path)
    _edit(out, lambda f: f.assign(success=f["success"] | (f["side"] == "test")))
    assert main(["aggregate-seed", "--episodes", str(out), "--out", str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "content hash" in err
    assert not (tmp_path / "s.parquet").exists()


def test_records_that_contradict_themselves_are_refused(tmp_path):
    """Even with a hash that matches (rewritten through the pipeline's own writer), success must be final_dist 0,
    each episode once, every rule with the same episodes."""
    out = _evaluate(tmp_path)
    frame, meta = read_table(out, "episodes")
    failed = frame.index[~frame["success"]][0]
    lies = {"success": frame.assign(success=frame.index == failed),
            "appear twice": pd.concat([frame, frame.iloc[:1]], ignore_index=True),
            "unequal episode counts": frame.drop(index=frame.index[-1])}
    for needle, edited in lies.items():
        write_parquet(out, edited, meta=meta)
        with pytest.raises(CorruptArtifact, match=needle) as info:
            read_table(out, "episodes")
        assert str(out) in str(info.value)


def test_records_rewritten_without_their_provenance_are_refused_at_a_pipeline_path(tmp_path):
    out = _evaluate(tmp_path)
    pd.read_parquet(out).to_parquet(out)        # e.g. edited with pandas: the provenance and its hash are gone
    with pytest.raises(CorruptArtifact, match="carries no provenance"):
        read_table(out, "episodes")
    elsewhere = tmp_path / "hand_made.parquet"  # a table made by hand, outside the layout: read unverified
    pd.read_parquet(out).to_parquet(elsewhere)
    assert len(read_table(elsewhere, "episodes")[0]) == 15


def test_a_table_written_before_the_hash_is_read_unverified(tmp_path):
    out = _evaluate(tmp_path)
    table = pq.read_table(out)
    meta = json.loads(table.schema.metadata[b"tapebench"])
    del meta[CONTENT_HASH]
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"tapebench": json.dumps(meta).encode()}),
                   out)
    frame, read_meta = read_table(out, "episodes")
    assert CONTENT_HASH not in read_meta and len(frame) == 15


# --- the same content under another path: one mechanism, every aggregate -----------------------------------------
def _worldtest_records(tmp_path):
    split = toy_split(tmp_path / "toy.json")
    out = tmp_path / layout.worldtest_records("toy", "random", 0, 0)
    params = {"env": {"L": 8, "H": 8}, "worldtest": {"problems_per_rule": 2, "planner": {"candidates": 8}}}
    assert main(["worldtest", "--method", "random", "--seed", "0", "--budget", "0", "--split", str(split),
                 "--params", json.dumps(params), "--out", str(out), "--quiet"]) == 0
    return out


def test_a_copy_under_another_path_is_refused_by_aggregate_worldtest(tmp_path, capsys):
    out = _worldtest_records(tmp_path)
    copy = tmp_path / "elsewhere" / "copy.parquet"
    copy.parent.mkdir()
    copy.write_bytes(out.read_bytes())
    agg = tmp_path / "agg.parquet"
    assert main(["aggregate-worldtest", "--inputs", str(out), str(copy), "--out", str(agg)]) == 2
    err = capsys.readouterr().err
    assert "hold the same records" in err and str(out) in err and str(copy) in err
    assert not agg.exists()
    assert main(["aggregate-worldtest", "--inputs", str(out), "--out", str(agg)]) == 0


@pytest.mark.parametrize("command,flag,kind", [("aggregate-seed", "--episodes", "episodes"),
                                               ("aggregate-fewshot", "--inputs", "fewshot")])
def test_every_aggregate_refuses_a_copy_by_its_content(tmp_path, capsys, command, flag, kind):
    """The same check as aggregate-worldtest's (not only a repeated episode key)."""
    out = _evaluate(tmp_path)
    if kind == "fewshot":
        out = tmp_path / "fewshot.parquet"
        assert main(["fewshot", "--method", "random", "--seed", "0", "--split", str(tmp_path / "toy.json"),
                     "--params", json.dumps({"env": {"L": 8, "H": 8}, "evaluation": {"episodes_per_rule": 2},
                                             "fewshot": {"shots": [0, 1], "rules_per_side": 1}}),
                     "--out", str(out), "--quiet"]) == 0
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(out.read_bytes())
    assert main([command, flag, str(out), str(copy), "--out", str(tmp_path / "agg.parquet")]) == 2
    assert "hold the same records" in capsys.readouterr().err
