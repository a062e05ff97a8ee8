"""Rule splits (docs/protocol.md#splits): generation, the split file format, and the health gate."""
from tapebench.splits.io import Split, load_split, resolve_split, save_split

__all__ = ["Split", "load_split", "resolve_split", "save_split"]
