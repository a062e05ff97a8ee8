"""The one table renderer: jinja2 templates in `tapebench/templates/`, LaTeX-safe delimiters.

Templates use `<< var >>` for expressions and `<% ... %>` for statements so LaTeX braces stay
literal. Filters: `num(x, digits)` fixed-point ('--' for missing), `tex` escapes LaTeX specials.
"""
from __future__ import annotations

import math
from pathlib import Path

import jinja2

from tapebench.utils.io import write_text

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
_TEX_SPECIALS = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def fmt_num(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "--"
    return f"{float(x):.{digits}f}"


def tex_escape(s) -> str:
    return "".join(_TEX_SPECIALS.get(c, c) for c in str(s))


# Characters pdflatex has no glyph for by default, written as LaTeX (the report's template declares the same ones for
# text that comes from the tables).
_UNICODE = {"−": "$-$", "×": r"$\times$", "≥": r"$\geq$", "≤": r"$\leq$", "±": r"$\pm$", "∈": r"$\in$",
            "→": r"$\rightarrow$", "≈": r"$\approx$"}


def tex_text(s) -> str:
    """LaTeX-escape plain text, including the non-ASCII symbols our titles and captions use."""
    return "".join(_UNICODE.get(c, c) for c in tex_escape(s))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        block_start_string="<%", block_end_string="%>",
        variable_start_string="<<", variable_end_string=">>",
        comment_start_string="<#", comment_end_string="#>",
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False,
    )
    env.filters["num"] = fmt_num
    env.filters["tex"] = tex_escape
    return env


def render_table(template: str, out_path, **context) -> str:
    """Render `templates/<template>` with `context`, write it atomically to `out_path`, return the text."""
    text = environment().get_template(template).render(**context)
    write_text(out_path, text)
    return text
