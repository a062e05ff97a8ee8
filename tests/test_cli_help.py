"""Help is written for users: every command and subcommand has a description, every option a help
line, and no developer notes (module docs, how to add code, spec paragraphs) leak into it."""
from __future__ import annotations

import argparse
import re

import pytest

from tapebench.cli import build_parser, main

DEVELOPER_NOTES = re.compile(
    r"[Mm]odule doc|\bdef \w|register\(|REGISTRY|\bSPEC\b|[Aa]dding a|tapebench\.[a-z_]+\.[a-z_]+|"
    r"`cli` module|subcommands from|[Dd]ocstring")


def all_parsers(parser=None, name="tapebench"):
    parser = parser or build_parser()
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {a.dest: a.help for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                assert listed.get(sub_name), f"`{name} {sub_name}` has no one-line help in `{name} --help`"
                yield from all_parsers(sub, f"{name} {sub_name}")


PARSERS = dict(all_parsers())


def test_every_command_is_covered():
    assert {"tapebench train", "tapebench evaluate", "tapebench bench", "tapebench status", "tapebench config",
            "tapebench render table3", "tapebench mpc"} <= set(PARSERS)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_is_for_users(name):
    parser = PARSERS[name]
    text = parser.format_help()
    found = DEVELOPER_NOTES.search(text)
    assert found is None, f"`{name} --help` shows a developer note: {found.group(0)!r}\n{text}"
    assert parser.description and len(parser.description) > 30, f"`{name}` has no description"
    undocumented = [a.option_strings or a.dest for a in parser._actions
                    if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert undocumented == []


def test_top_level_help_points_to_status(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "tapebench status" in out and "snakemake" in out
