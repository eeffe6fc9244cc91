"""The README's claims that a test can check without a server: its settings table against the
flags `inferd serve` takes, and the `make` targets it names against the Makefile.
(tests/integration/test_readme.py runs its client snippet against a live server.)"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from inferd import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"

SETTINGS_TABLE_HEADER = "| setting | what it does |"
# Flags of other tools that the README quotes (`ruff format --check`, `mypy --strict`,
# `deploy/install.sh install WHEEL --gpu`).
OTHER_TOOLS_FLAGS = frozenset({"--check", "--strict", "--gpu"})
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A rule's line: one or more target names, then `:` (but `NAME :=` assigns a variable).
RULE_TARGETS = re.compile(r"^([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*:(?!=)", re.M)
# `make TARGET` as a command: first on its line (or after VAR=value), so that `make` in a list of
# Debian packages is not one; VAR=value arguments may come before the target.
MAKE_COMMAND = re.compile(
    r"^[ \t]*(?:[A-Z][A-Z0-9_]*=\S*[ \t]+)*make(?:[ \t]+[A-Z][A-Z0-9_]*=\S*)*[ \t]+([a-z][\w.-]*)",
    re.M,
)


def serve_flags() -> set[str]:
    """The long options `inferd serve --help` prints, from the real parser (no server starts)."""
    return command_flags("serve")


def command_flags(*command: str) -> set[str]:
    """The long options `inferd COMMAND --help` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    # argparse puts each option at the start of its own line, indented by two spaces; flags that
    # help texts mention further right are not options of their own.
    return set(re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", out.getvalue(), flags=re.M))


def settings_table_flags(readme: str) -> set[str]:
    """The flags named in the first column of the README's settings table."""
    lines = readme.splitlines()
    assert SETTINGS_TABLE_HEADER in lines, f"README has no table headed {SETTINGS_TABLE_HEADER!r}"
    start = lines.index(SETTINGS_TABLE_HEADER) + 2  # past the header and its `| --- |` row
    flags: set[str] = set()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        flags.update(LONG_FLAG.findall(first_cell))
    return flags


def makefile_targets(makefile: str) -> set[str]:
    """Targets of the Makefile's rules (`name:` at the start of a line; `NAME :=` is a variable)."""
    targets: set[str] = set()
    for names in RULE_TARGETS.findall(makefile):
        targets.update(names.split())
    return targets


def readme_code(readme: str) -> list[str]:
    """The README's code, where commands are written: fenced blocks and inline spans, each
    without its backticks."""
    fences = re.findall(r"```[^\n]*\n(.*?)```", readme, flags=re.S)
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    return fences + re.findall(r"`([^`\n]+)`", prose)


def readme_make_targets(readme: str) -> set[str]:
    """Targets of the `make ...` commands in the README's code."""
    return {target for code in readme_code(readme) for target in MAKE_COMMAND.findall(code)}


def test_every_serve_option_is_in_the_readme_settings_table() -> None:
    options = serve_flags() - {"--help"}
    assert "--grpc-port" in options  # the help's layout is still parsed
    missing = options - settings_table_flags(README.read_text())
    assert not missing, f"`inferd serve` options missing from README's settings table: {missing}"


def test_every_flag_the_readme_settings_table_names_is_a_serve_option() -> None:
    unknown = settings_table_flags(README.read_text()) - serve_flags()
    assert not unknown, f"README's settings table names flags `inferd serve` lacks: {unknown}"


def test_every_flag_the_readme_mentions_is_an_inferd_option() -> None:
    # The prose names flags too (`--model-control-mode none`, `--log-verbose 1`, ...).
    mentioned = set(LONG_FLAG.findall(README.read_text())) - OTHER_TOOLS_FLAGS
    unknown = mentioned - serve_flags() - command_flags("health") - command_flags()
    assert not unknown, (
        f"README mentions flags `inferd serve`, `health` and `inferd` lack: {unknown}"
    )


def test_every_make_target_the_readme_names_is_in_the_makefile() -> None:
    named = readme_make_targets(README.read_text())
    assert {"serve", "test"} <= named  # the README's commands are still found
    undefined = named - makefile_targets(MAKEFILE.read_text())
    assert not undefined, f"README names make targets the Makefile does not define: {undefined}"
