"""The README's client snippet runs as written against a live server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_client_snippet_runs(url: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python block"
    code = blocks[0].replace('"localhost:8001"', repr(url))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[[ 1  2  3")  # a + b
    assert lines[1].startswith("[[-1  0  1")  # a - b
