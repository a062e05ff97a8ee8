"""The split artifact: `results/splits/<name>.json`.

Fields: family and rule_set (only for a sampled rule set of a non-elementary family), name, train, test (sorted rule lists), types ({rule: type} for all rules in the split),
features ({rule: [feature values]}), feature_names, params (generator parameters), unit
("mirror_class" or "rule"), test_type_counts, provenance, and content_hash = sha256 over every
other field except provenance (canonical JSON). A severity ladder (splits/ladder.py, kind "ladder") adds
levels ({d: rules at exact distance d from train}; test is their union), distances ({rule: d}) and family;
it is evaluated on the sides "train" and "d1", "d2", ... (`ladder_side`) instead of "test". Same parameters -> byte-identical file (within one
code version). Provenance (code version, config slice, seed) is recorded but not hashed: the hash
names the split's content and keys its evaluation episodes (evaluation.episodes.split_key), so it
must not change when an unrelated commit changes the code version.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tapebench.layout import SPLITS_DIR
from tapebench.rule_family import family_from_config
from tapebench.utils.artifacts import CorruptArtifact, WrongKind, describe_file, read_json
from tapebench.utils.io import content_hash, write_json
from tapebench.vocabulary import ID_SIDE, SPLIT_SIDES, ladder_level, ladder_side

DEFAULT_SPLITS_DIR = Path(SPLITS_DIR)
UNHASHED_FIELDS = ("content_hash", "provenance")

def split_content_hash(payload: dict) -> str:
    return content_hash({k: v for k, v in payload.items() if k not in UNHASHED_FIELDS})


@dataclass(frozen=True)
class Split:
    name: str
    train: tuple[int, ...]
    test: tuple[int, ...]
    types: dict[int, str]
    content_hash: str
    params: dict = field(default_factory=dict)
    unit: str = "mirror_class"
    family_config: dict | None = None
    """{k, r} of a non-elementary family (None: elementary)"""
    levels: dict[int, tuple[int, ...]] = field(default_factory=dict)   # severity ladder: {d: rules}

    @property
    def family(self):
        return family_from_config(self.family_config)

    @property
    def sides(self) -> tuple[str, ...]:
        """The evaluation sides: ID ('train') and OOD ('test', or one side per ladder level)."""
        if self.levels:
            return (ID_SIDE, *(ladder_side(d) for d in sorted(self.levels)))
        return SPLIT_SIDES

    def side_rules(self, side: str) -> tuple[int, ...]:
        if side == "train":
            return self.train
        if side == "test":
            return self.test
        if ladder_level(side) in self.levels:
            return self.levels[ladder_level(side)]
        raise ValueError(f"side must be one of {sorted({*self.sides, 'test'})} for split {self.name!r}, got {side!r}")


def save_split(path, payload: dict) -> dict:
    """Add the content hash to `payload` and write it atomically; returns the written dict."""
    body = {k: v for k, v in payload.items() if k != "content_hash"}
    body["content_hash"] = split_content_hash(body)
    write_json(path, body)
    return body


def load_split(path) -> Split:
    """Read and verify a split file. A readable file of another kind (a Parquet table, a training manifest, any
    file that is not JSON) raises WrongKind naming what it is; only a split file that is malformed or tampered
    with raises CorruptArtifact (both are ValueErrors)."""
    path = Path(path)
    expected = f"give a split file written by `tapebench split` ({SPLITS_DIR}/<name>.json)"
    if not path.is_file():
        raise FileNotFoundError(f"split file not found: {path}")
    what = describe_file(path)
    if what is not None and not what.startswith("a split file"):
        raise WrongKind(f"{path} is not a split file: it is {what}; {expected}")
    raw = read_json(path, "split file", writer="tapebench split")   # not JSON and not named .json: WrongKind
    if not isinstance(raw, dict):
        raise WrongKind(f"{path} is not a split file: expected a JSON object, got a {type(raw).__name__}; {expected}")
    required = ("name", "train", "test", "types", "content_hash")
    missing = [k for k in required if k not in raw]
    if missing:
        raise WrongKind(f"{path} is not a split file: a JSON object with missing fields {missing}; {expected}")
    if split_content_hash(raw) != raw["content_hash"]:
        raise CorruptArtifact(path, "failed its integrity check: content hash mismatch, "
                                    "the file was edited after it was generated")
    return Split(name=raw["name"], train=tuple(raw["train"]), test=tuple(raw["test"]),
                 types={int(k): v for k, v in raw["types"].items()}, content_hash=raw["content_hash"],
                 params=raw.get("params", {}), unit=raw.get("unit", "mirror_class"), family_config=raw.get("family"),
                 levels={int(d): tuple(rules) for d, rules in raw.get("levels", {}).items()})


def resolve_split(name_or_path, splits_dir=DEFAULT_SPLITS_DIR) -> Split:
    """Load a split by file path, or by name from `splits_dir`; unknown names list the known ones."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_file():
        return load_split(p)
    candidate = Path(splits_dir) / f"{name_or_path}.json"
    if not candidate.is_file():
        known = sorted(f.stem for f in Path(splits_dir).glob("*.json")) if Path(splits_dir).is_dir() else []
        raise ValueError(f"unknown split name {name_or_path!r}; known splits in {splits_dir}: {known or 'none'}")
    return load_split(candidate)
