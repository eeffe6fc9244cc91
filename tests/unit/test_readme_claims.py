"""The claims of the README, CONTRIBUTING.md and docs/ that a test can check without a server:
docs/settings.md's tables against the flags of `inferd serve`, section by section as its
`--help` groups them; every flag the Markdown names against inferd's, perf_analyzer's and the
other tools' it quotes; the `make` targets against the Makefile; every relative link against the
files and headings it points to; and the README's length. (tests/integration/test_readme.py and
the snippet tests beside each feature run their Python blocks against a live server.)"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferd import cli
from inferd.settings import SECTIONS, section_fields
from inferd.triton_flags import BY_NAME as TRITON_FLAGS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
# What a newcomer reads: the README, the contributor's page and the reference in docs/.
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
MAKEFILE = ROOT / "Makefile"
# Issue 26: the README reads in five minutes; the reference lives in docs/.
README_MAX_LINES = 220

SETTINGS_TABLE_HEADER = "| setting | what it does |"
# Flags of other tools that the Markdown quotes: `ruff format --check`, `mypy --strict`,
# `cmake --build DIR --target T`, `deploy/install.sh install WHEEL --gpu`, and the benchmark
# scripts' (docs/benchmarks.md: `benchmarks/run.py --model ... --configs ... --before-python`,
# `benchmarks/soak.py --hostile`).
OTHER_TOOLS_FLAGS = frozenset(
    {"--check", "--strict", "--build", "--target", "--gpu"}
    | {"--model", "--configs", "--before-python", "--hostile"}
)
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A rule's line: one or more target names, then `:` (but `NAME :=` assigns a variable).
RULE_TARGETS = re.compile(r"^([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*:(?!=)", re.M)
# `make TARGET` as a command: first on its line (or after VAR=value), so that `make` in a list of
# Debian packages is not one; VAR=value arguments may come before the target.
MAKE_COMMAND = re.compile(
    r"^[ \t]*(?:[A-Z][A-Z0-9_]*=\S*[ \t]+)*make(?:[ \t]+[A-Z][A-Z0-9_]*=\S*)*[ \t]+([a-z][\w.-]*)",
    re.M,
)
# A Markdown link to a file of the repository: [text](path) or [text](path#heading) or (#heading).
RELATIVE_LINK = re.compile(r"\[[^\]]*\]\((?!https?:)([^)\s#]*)(?:#([^)\s]*))?\)")


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


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The headings of a Markdown file, outside its fenced code."""
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return re.findall(r"^#+ (.+)$", prose, flags=re.M)


def section_tables(markdown: str) -> dict[str, set[str]]:
    """Per ``## heading`` of docs/settings.md, the flags named in the first column of the
    settings table under it."""
    tables: dict[str, set[str]] = {}
    heading = ""
    in_table = False
    for line in markdown.splitlines():
        if line.startswith("## "):
            heading, in_table = line[3:].strip(), False
        elif line == SETTINGS_TABLE_HEADER:
            assert heading not in tables, f"two settings tables under {heading!r}"
            tables[heading], in_table = set(), True
        elif in_table and line.startswith("|"):
            tables[heading].update(LONG_FLAG.findall(line.split("|")[1]))
        else:
            in_table = False
    return tables


def help_sections(*command: str) -> dict[str, set[str]]:
    """Per argument group of ``inferd COMMAND --help`` (a heading line ``Title:``), the long
    options listed under it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    groups: dict[str, set[str]] = {}
    group = ""
    for line in out.getvalue().splitlines():
        if re.fullmatch(r"\S.*:", line):
            group = line[:-1]
            groups[group] = set()
        elif group:
            groups[group].update(re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", line))
    return groups


def section_flags(section: str) -> set[str]:
    return {"--" + f.name.replace("_", "-") for f in section_fields(section)}


def perf_analyzer_flags() -> set[str]:
    """The long options perf_analyzer's usage lists, run through inferd's wrapper (it prints
    its usage for ``--help``, which it does not take, and exits 99)."""
    done = subprocess.run(
        [sys.executable, "-m", "inferd.perf_analyzer", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    flags = set(LONG_FLAG.findall(done.stdout + done.stderr))
    assert "--concurrency-range" in flags, done.stdout + done.stderr  # its usage was printed
    return flags


def test_docs_settings_has_one_table_per_section_of_settings_py_with_its_flags() -> None:
    tables = section_tables(SETTINGS_DOC.read_text())
    assert list(tables) == list(SECTIONS), "docs/settings.md's sections, in settings.py's order"
    for section in SECTIONS:
        assert tables[section] == section_flags(section), (
            f"docs/settings.md, {section}: missing {section_flags(section) - tables[section]}, "
            f"not in this section of settings.py {tables[section] - section_flags(section)}"
        )


def test_serve_help_groups_its_flags_as_docs_settings_does() -> None:
    groups = help_sections("serve")
    assert groups.pop("options") == {"--help"}
    assert list(groups) == list(SECTIONS)
    for section in SECTIONS:
        assert groups[section] == section_flags(section), section
    every = set().union(*groups.values())
    assert every == serve_flags() - {"--help"}  # no flag outside a section
    assert "--grpc-port" in every  # the help's layout is still parsed


def test_every_flag_the_docs_mention_is_an_option_of_what_they_run() -> None:
    # The prose names flags too (`--model-control-mode none`, `--log-verbose 1`, ...), and
    # docs/coming-from-triton.md tritonserver's, which `inferd serve` takes too.
    known = (
        serve_flags()
        | set(TRITON_FLAGS)
        | command_flags("health")
        | command_flags("tune")
        | command_flags()
        | perf_analyzer_flags()
        | OTHER_TOOLS_FLAGS
    )
    for doc in DOCS:
        unknown = set(LONG_FLAG.findall(doc.read_text())) - known
        assert not unknown, f"{doc.relative_to(ROOT)} mentions flags nothing it runs has: {unknown}"


def test_every_make_target_the_docs_name_is_in_the_makefile() -> None:
    targets = makefile_targets(MAKEFILE.read_text())
    assert {"serve", "test"} <= readme_make_targets(README.read_text())  # still found
    for doc in DOCS:
        undefined = readme_make_targets(doc.read_text()) - targets
        assert not undefined, f"{doc.relative_to(ROOT)} names undefined make targets: {undefined}"


def test_every_relative_link_in_the_docs_reaches_a_file_and_heading() -> None:
    checked = 0
    for doc in DOCS:
        for path, anchor in RELATIVE_LINK.findall(doc.read_text()):
            target = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: ({path}{'#' + anchor if anchor else ''})"
            assert target.exists(), f"{where}: no such file"
            if anchor:
                anchors = {heading_anchor(h) for h in headings(target.read_text())}
                assert anchor in anchors, f"{where}: no such heading"
            checked += 1
    assert checked > 20  # the links are still found


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines: move the reference to docs/"
