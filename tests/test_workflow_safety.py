"""No config value reaches a shell unquoted: every placeholder in every rule's shell command is
`:q`-quoted, and an injection string in a split's rule list, with the config check bypassed, is
handed to `tapebench split` as one argument and runs nothing."""
from __future__ import annotations

import ast
import re
import string

import yaml
from pipeline_helpers import REPO, make_workdir, snakemake


def shell_commands() -> dict[str, str]:
    """{rule name: shell command template} read from workflow/rules/*.smk."""
    commands = {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        rule, parts, in_shell, generated = None, [], False, 0
        for line in path.read_text().splitlines() + [""]:
            stripped = line.strip()
            if in_shell and stripped[:1] == '"':
                parts.append(ast.literal_eval(stripped))
                continue
            if in_shell:
                commands[rule] = "".join(parts)
                in_shell, parts = False, []
            if stripped.startswith("rule ") and stripped.endswith(":"):
                rule = stripped[5:-1]
            elif stripped == "rule:":      # rules generated in a loop (report.smk: one per registry entry;
                generated += 1              # evaluate.smk, noise.smk: per seed or per seed block)
                rule = f"{path.stem}: generated #{generated}"
            in_shell = stripped == "shell:"
    return commands


def test_every_shell_placeholder_is_quoted():
    commands = shell_commands()
    assert {"train", "split", "mpc_split", "report: generated #1", "evaluate: generated #1", "evaluate: generated #2",
            "noise: generated #1", "noise: generated #2"} <= set(commands)
    unquoted = [(rule, field + (":" + spec if spec else ""))
                for rule, command in commands.items()
                for _, field, spec, _ in string.Formatter().parse(command)
                if field is not None and not spec.endswith("q")]
    assert unquoted == []
    assert "'{params" not in "".join(commands.values())   # no hand-made quotes around a quoted value


def test_injection_string_is_one_argument_even_without_the_config_check(tmp_path):
    workdir = make_workdir(tmp_path)
    marker = tmp_path / "INJECTED"
    hostile = f"0-255 --out x; touch {marker}; true"
    common = workdir / "workflow" / "rules" / "common.smk"
    check = next(m.group(0) for m in re.finditer(r"(?ms)^validate_config\(\n.*?^\)", common.read_text()))
    # validate with a harmless rule list, then put the hostile one back: only the shell quoting is left
    common.write_text(common.read_text().replace(check, (
        "_hostile = config['splits']['main']['rules']\n"
        "config['splits']['main']['rules'] = '0-255'\n"
        f"{check}\n"
        "config['splits']['main']['rules'] = _hostile")))
    (workdir / "hostile.yaml").write_text(yaml.safe_dump(
        {"splits": {"main": {"method": "diverse", "test_size": 4, "seed": 0, "rules": hostile}}}))
    proc = snakemake(workdir, "results/splits/main.json", configfiles=("tiny.yaml", "hostile.yaml"))
    assert proc.returncode != 0
    assert not marker.exists()
    assert not (workdir / "x").exists()
    log = (workdir / "logs" / "splits" / "main.log").read_text()
    assert f"cannot parse rule list item '{hostile}'" in log
