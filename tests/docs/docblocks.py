"""Read the code blocks of the documentation, and run them.

The rules the doc tests apply to README.md, every page under docs/ and CHANGELOG.md:

- A ```sql block runs in psql. All the sql blocks of a page run in order, in one psql
  session, on a fresh database. That database already has the extension, unless one of
  the page's sql blocks says `create extension treadle` itself: then it starts empty.
- A ```python block runs in Python. All the python blocks of a page run in order, in one
  process (one namespace, like a notebook), with DATABASE_URL naming a fresh database
  that has the extension.
- A ```sh block runs in bash from the repository's root with DATABASE_URL set, unless
  the shell test lists it as one it cannot run, with the reason.
- A fenced block whose info string names a file after the language, such as
  ```python examples/webhook.py, is an excerpt: its text must appear, as it is, in that
  file (which another test runs). It does not run on its own.
- A ```text block that follows a sql, python or sh block with nothing but blank lines
  between is that block's expected output, compared exactly (trailing spaces aside).
  A sql block may expect an error: its output then shows psql's `ERROR:` line. Any other
  error stops the page.
- Any other fence (```text after prose, ```ascii, ```ini ...) is for reading only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARK = "@@treadle-doc-block {}@@"
RUNNABLE = ("sql", "python", "sh")

FENCE = re.compile(r"^(`{3,})([\w+-]*)[ \t]*([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    expected: str | None
    source: str | None = None  # an excerpt of this file

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """Every documentation page, in a stable order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), ROOT / "CHANGELOG.md"]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, with the expected output of each runnable one."""
    text = path.read_text()
    found = [(m.start(), m.end(), m.group(2), m.group(3).strip(), m.group(4)) for m in FENCE.finditer(text)]
    out: list[Block] = []
    for i, (start, end, lang, info, code) in enumerate(found):
        if lang not in RUNNABLE:
            continue
        expected = None
        if i + 1 < len(found) and not info:
            nstart, _, nlang, _, ncode = found[i + 1]
            if nlang == "text" and text[end:nstart].strip() == "":
                expected = ncode
        out.append(Block(page_id(path), text.count("\n", 0, start) + 1, lang, code, expected, info or None))
    return out


def page_blocks(lang: str) -> list[tuple[str, list[Block]]]:
    """(page, its runnable blocks in lang) for every page that has some."""
    result = []
    for path in pages():
        mine = [b for b in blocks(path) if b.lang == lang and b.source is None]
        if mine:
            result.append((page_id(path), mine))
    return result


def excerpts() -> list[Block]:
    """Every block that quotes a file."""
    return [b for path in pages() for b in blocks(path) if b.source is not None]


def normalise(output: str) -> str:
    lines = [line.rstrip() for line in output.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def split_marked(output: str, count: int) -> list[str]:
    """The output of each block, cut at the markers printed before each one."""
    parts: list[str] = []
    for i in range(count):
        head = MARK.format(i) + "\n"
        start = output.find(head)
        if start < 0:
            break
        start += len(head)
        end = output.find(MARK.format(i + 1), start)
        parts.append(output[start:] if end < 0 else output[start:end])
    return parts


def check_outputs(done: list[Block], outputs: list[str]) -> None:
    for block, output in zip(done, outputs, strict=True):
        if block.expected is not None:
            assert normalise(output) == normalise(block.expected), (
                f"{block.where}: the {block.lang} block printed\n{output}\nbut the page shows\n{block.expected}"
            )


def creates_extension(page: list[Block]) -> bool:
    return any(re.search(r"create\s+extension\s+treadle", b.code, re.I) for b in page if b.lang == "sql")


def run_psql(url: str, page: list[Block]) -> None:
    """Run a page's sql blocks in one psql session and check what they print."""
    script = []
    for i, block in enumerate(page):
        script.append(f"\\echo '{MARK.format(i)}'")
        expects_error = block.expected is not None and "ERROR:" in block.expected
        if expects_error:
            script.append("\\set ON_ERROR_STOP 0")
        script.append(block.code.rstrip("\n"))
        if expects_error:
            script.append("\\set ON_ERROR_STOP 1")
    script.append(f"\\echo '{MARK.format(len(page))}'")
    run = subprocess.run(
        ["psql", url, "-X", "-v", "ON_ERROR_STOP=1"],
        input="\n".join(script) + "\n",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    outputs = split_marked(run.stdout, len(page))
    if run.returncode != 0:
        failed = page[max(len(outputs) - 1, 0)]
        raise AssertionError(f"{failed.where}: psql stopped with an error:\n{outputs[-1] if outputs else run.stdout}")
    check_outputs(page, outputs)


RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for i, block in enumerate(blocks):
    print(block["mark"], flush=True)
    try:
        exec(compile(block["code"], block["where"], "exec"), namespace)
    except BaseException:
        sys.stdout.flush()
        traceback.print_exc()
        sys.exit(1)
    sys.stdout.flush()
print(blocks[-1]["end"], flush=True)
"""


def python_env(url: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=url, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_python(url: str, page: list[Block], tmp: Path) -> None:
    """Run a page's python blocks in one process and check what they print."""
    spec = [
        {"mark": MARK.format(i), "end": MARK.format(len(page)), "code": b.code, "where": b.where}
        for i, b in enumerate(page)
    ]
    path = tmp / "blocks.json"
    path.write_text(json.dumps(spec))
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, str(path)],
        capture_output=True,
        text=True,
        env=python_env(url),
        cwd=tmp,
        timeout=170,
    )
    outputs = split_marked(run.stdout, len(page))
    if run.returncode != 0:
        failed = page[max(len(outputs) - 1, 0)]
        raise AssertionError(f"{failed.where}: the python block raised:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}")
    check_outputs(page, outputs)
