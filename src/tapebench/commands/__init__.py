"""The command line: one module per area, each `register(subparsers)` for the commands `tapebench.cli.COMMANDS`
lists. The top layer: a command module may import any layer below, nothing imports it but `tapebench.cli`;
the command modules share `write_generated`."""
import sys
from pathlib import Path


def write_generated(pages: dict, check: bool, regenerate: str) -> int:
    """Write each generated page (`{path: text}`) atomically, or with `check` write nothing and exit 1 where a page
    is not what it would be, naming the command that regenerates it (`regenerate`)."""
    # lazy: the command modules import this package before they know which command runs
    from tapebench.utils.io import atomic_path

    pages = {Path(path): text for path, text in pages.items()}
    if check:
        stale = [str(p) for p, text in pages.items() if not p.is_file() or p.read_text() != text]
        if stale:
            print(f"stale: {', '.join(stale)}; regenerate with `{regenerate}`", file=sys.stderr)
            return 1
        print(f"current: {', '.join(map(str, pages))}")
        return 0
    for path, text in pages.items():
        with atomic_path(path) as tmp:
            Path(tmp).write_text(text)
        print(f"wrote {path}")
    return 0
