"""Rendering: LaTeX tables through jinja2 templates (one renderer for every table) and figures."""
