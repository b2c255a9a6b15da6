"""The README's Python examples run as written (each in an empty directory).

Every ```python block between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in the
repository's README.md is executed, for each NAME below; a missing section fails.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent / ".." / ".." / ".." / "README.md"
SECTIONS = ["py-example", "py-langchain", "py-langgraph"]


def blocks(name: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- {name}:start -->(.*?)<!-- {name}:end -->", text, re.S)
    if m is None:
        pytest.fail(f"README.md has no <!-- {name}:start --> ... <!-- {name}:end --> section")
    code = re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", m.group(1), re.S | re.M)
    if not code:
        pytest.fail(f"README.md's {name} section has no ```python block")
    return code


@pytest.mark.parametrize("name", SECTIONS)
def test_readme_example_runs(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for i, code in enumerate(blocks(name)):
        scope = {"__name__": f"readme_{name}"}
        exec(compile(code, f"README.md[{name}#{i}]", "exec"), scope)
        # The example's stores close here, in its directory.
        scope.clear()
        gc.collect()
    assert capsys.readouterr().out.strip()  # each example shows something
