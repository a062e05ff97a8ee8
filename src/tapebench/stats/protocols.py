"""The protocols the pipeline compares (docs/protocol.md#protocol-comparison): `ComparedProtocol`, a named
selection of per-seed rows, and `protocols(config)`, the one list of them. Light on purpose (no pandas, no
scipy): the Snakefile and the report registry list the protocols without loading the comparison itself
(stats/protocol_comparison.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Mapping

from tapebench import layout
from tapebench.rule_family import config_family
from tapebench.settings import noise_study
from tapebench.validation import refuse_duplicates
from tapebench.vocabulary import ID_PROTOCOL, ID_SIDE, OOD_PROTOCOL, OOD_SIDE, ladder_side

REFERENCE = OOD_PROTOCOL


@dataclass(frozen=True)
class ComparedProtocol:
    """A named selection of per-seed rows: `split`, `H`, `side` (and `match`: extra column == value filters)
    from the files `per_seed`. Protocols with the same `runs` (default: the split) come from the same trained
    runs and are seed-paired in the bootstrap."""

    name: str
    split: str
    H: int
    side: str
    per_seed: tuple[str, ...]
    family: str = "protocol"
    runs: str = ""
    match: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "H", int(self.H))
        object.__setattr__(self, "per_seed", tuple(str(p) for p in self.per_seed))
        object.__setattr__(self, "match", tuple((str(k), v) for k, v in self.match))
        if not self.runs:
            object.__setattr__(self, "runs", self.split)
        if not self.name:
            raise ValueError("a protocol needs a name")
        if not self.per_seed:
            raise ValueError(f"protocol {self.name!r} names no per-seed file")
        refuse_duplicates(self.per_seed, f"protocol {self.name!r}: per-seed")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["per_seed"], out["match"] = list(self.per_seed), [list(kv) for kv in self.match]
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "ComparedProtocol":
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"protocol {d.get('name')!r}: unknown keys {unknown}; allowed: "
                             f"{sorted(cls.__dataclass_fields__)}")
        return cls(**{**d, "per_seed": tuple(d["per_seed"]), "match": tuple(tuple(kv) for kv in d.get("match", ()))})


def protocols(config: dict) -> list[ComparedProtocol]:
    """The protocols the pipeline compares, the reference first: ID, each other horizon, each robustness
    partition, each severity-ladder level and each noise level > 0. One entry per protocol, its files in the
    config's results folder."""
    main, H = config["main_split"], int(config["env"]["H"])
    methods = list(config["methods"])

    def files(split, h):
        return tuple(layout.per_seed(split, m, h) for m in methods)

    out = [ComparedProtocol(REFERENCE, main, H, OOD_SIDE, files(main, H), family="reference"),
           ComparedProtocol(ID_PROTOCOL, main, H, ID_SIDE, files(main, H), family="side")]
    out += [ComparedProtocol(f"{OOD_PROTOCOL} H={h}", main, h, OOD_SIDE, files(main, h), family="horizon")
            for h in config["evaluation"]["horizons"] if int(h) != H]
    out += [ComparedProtocol(f"{OOD_PROTOCOL} {s}", s, H, OOD_SIDE, files(s, H), family="split")
            for s in config["studies"]["robustness"]["splits"] if s != main]
    out += _ladder_protocols(config)
    out += _noise_protocols(config)
    folder = config.get("results_dir", layout.RESULTS_DIR)
    return [replace(p, per_seed=layout.rebase(p.per_seed, folder)) for p in out]


def _ladder_protocols(config: dict) -> list[ComparedProtocol]:
    """One protocol per severity-ladder level (side d<d> of the ladder split, its own runs and methods)."""
    ladder = config["studies"]["ladder"]
    if not config_family(config).elementary:
        return []       # the ladder is an elementary-family study in the pipeline
    H, name = int(config["env"]["H"]), ladder["name"]
    files = tuple(layout.per_seed(name, m, H) for m in ladder["methods"])
    return [ComparedProtocol(f"ladder d={d}", name, H, ladder_side(d), files, family="ladder") for d in sorted(ladder["levels"])]


def _noise_protocols(config: dict) -> list[ComparedProtocol]:
    """One protocol per noise level > 0 (OOD side of the main split's runs evaluated with cell-update noise)."""
    study = noise_study(config)
    split, H = study["split"], study["H"]
    return [ComparedProtocol(f"{OOD_PROTOCOL} eps={layout.noise_label(eps)}", split, H, OOD_SIDE,
                     tuple(layout.noise_per_seed(split, eps, m, H) for m in study["methods"]), family="noise")
            for eps in study["levels"] if eps > 0]


def protocol_files(protos) -> list[str]:
    """Every per-seed file the protocols read, each once, in order."""
    return list(dict.fromkeys(p for proto in protos for p in proto.per_seed))
