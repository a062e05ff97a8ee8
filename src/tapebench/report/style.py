"""The one place for the figures' look: rule-type colours and markers, method colours, sides, sizes.

Colours are Okabe–Ito (colour-blind-safe). Every figure that colours by rule type uses `TYPE_COLOURS`;
markers repeat the type so a grey-scale print still separates them. ID (training rules) and OOD (held-out
rules) are told apart by marker fill (ID filled, OOD hollow) or line style (ID solid, OOD dashed).
"""
from __future__ import annotations

from tapebench.utils.io import atomic_path
from tapebench.vocabulary import ID_PROTOCOL, ID_SIDE, OOD_PROTOCOL, OOD_SIDE

TYPE_ORDER = ("stable", "periodic", "chaotic")
TYPE_COLOURS = {"stable": "#0072B2", "periodic": "#E69F00", "chaotic": "#009E73"}
TYPE_MARKERS = {"stable": "o", "periodic": "s", "chaotic": "^"}
OTHER_TYPE_COLOUR = "#999999"       # a type outside TYPE_ORDER (e.g. a features table from another version)
OTHER_TYPE_MARKER = "D"

# One colour per method, in the order the methods are listed; with more methods than colours the line style
# changes (METHOD_LINESTYLES) so that no two methods look the same.
METHOD_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
METHOD_LINESTYLES = ("-", "--", ":", "-.")
METHOD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

SIDE_LABELS = {ID_SIDE: ID_PROTOCOL, OOD_SIDE: OOD_PROTOCOL}
SIDE_LONG_LABELS = {"train": "ID (training rules)", "test": "OOD (held-out rules)"}
SIDE_LINESTYLES = {"train": "-", "test": "--"}

CELL_CMAP = "Greys"                 # 0 white, 1 black
FLIP_COLOUR = "#D55E00"             # Okabe–Ito vermillion: the flipped cell, visible on black and on white

COLUMN_WIDTH = 3.3                  # inches: one column of a two-column paper
FULL_WIDTH = 7.0                    # inches: both columns


def type_colour(rule_type: str) -> str:
    return TYPE_COLOURS.get(str(rule_type), OTHER_TYPE_COLOUR)


def type_marker(rule_type: str) -> str:
    return TYPE_MARKERS.get(str(rule_type), OTHER_TYPE_MARKER)


def types_present(types) -> list[str]:
    """The types among `types`, in TYPE_ORDER, unknown ones after (sorted)."""
    present = {str(t) for t in types}
    return [t for t in TYPE_ORDER if t in present] + sorted(present - set(TYPE_ORDER))


def method_style(index: int) -> dict:
    """Colour, line style and marker of the index-th method."""
    n = len(METHOD_COLOURS)
    return {"color": METHOD_COLOURS[index % n], "linestyle": METHOD_LINESTYLES[(index // n) % len(METHOD_LINESTYLES)],
            "marker": METHOD_MARKERS[index % len(METHOD_MARKERS)]}


def pyplot():
    """matplotlib.pyplot on the Agg backend with font sizes readable at column width."""
    # matplotlib is heavy: only figure builders load it
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib is heavy: only figure builders load it
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
                         "ytick.labelsize": 7, "legend.fontsize": 7, "figure.dpi": 100,
                         "pdf.fonttype": 42, "ps.fonttype": 42})
    return plt


def save_figure(fig, stem) -> list[str]:
    """Write `stem`.pdf and `stem`.png atomically (PNG at 200 dpi); returns the paths and closes the figure."""
    # matplotlib is heavy: only figure builders load it
    import matplotlib.pyplot as plt


    paths = []
    for ext in ("pdf", "png"):
        path = f"{stem}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=200 if ext == "png" else None, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths
