"""Every command and code example in README.md and docs/*.md runs, and shows what it prints.

Fenced blocks are read from each page in order and run in one scratch directory per page (with
``docs/`` and ``hardware_specs/`` linked in, so relative paths work and written files stay out of
the repository):

- ``bash`` / ``console`` blocks hold ``plan`` commands: either lines ``plan ...`` (run, output not
  shown) or ``$ plan ...`` followed by the lines it prints. ``\\`` continues a line, ``#`` starts
  a comment, ``> FILE`` writes stdout to FILE. The command runs in-process through typer's
  CliRunner on ``cli.main.app``. Its exit status must be 0, or 2 where the shown output is a
  ``plan: error:`` line (the user-error contract). Every shown line must appear, in order, in the
  real output; a line ``...`` stands for lines left out, and search times (``in 1.17 s``,
  ``'seconds': 0.36``) are not compared.
- ``python`` blocks are executed (one namespace per page); comment lines ``#> TEXT`` are lines the
  block prints, checked as above.
- A block preceded by the line ``<!-- skip-test -->`` is not run (``make`` targets, ``torchrun``
  launches, commands that need a GPU or minutes). Any other bash / console block must be a
  ``plan`` command.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARKER = "<!-- skip-test -->"
SHELL_LANGS = {"bash", "console", "shell", "sh"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_TIMES = [(re.compile(r"\bin \d+(\.\d+)? s\b"), "in <t> s"),
          (re.compile(r"'seconds': [0-9.e+-]+"), "'seconds': <t>")]


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its language, first line number and text."""

    page: Path
    line: int
    lang: str
    text: str
    skipped: bool


@dataclass(frozen=True)
class Command:
    """One ``plan`` command of a shell block and the output lines shown under it."""

    argv: tuple[str, ...]
    stdout_file: str | None
    shown: tuple[str, ...]


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order, each marked skipped when the marker precedes it."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        before = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        out.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:j]),
                         before == SKIP_MARKER))
        i = j + 1
    return out


def _joined(lines: list[str]) -> list[str]:
    """Lines with ``\\`` continuations joined."""
    out: list[str] = []
    carry = ""
    for s in lines:
        if s.rstrip().endswith("\\"):
            carry += s.rstrip()[:-1] + " "
            continue
        out.append(carry + s)
        carry = ""
    return out


def _command(line: str, shown: list[str]) -> Command:
    words = shlex.split(line, comments=True)
    assert words and words[0] == "plan", f"not a plan command: {line!r}"
    stdout_file = None
    if ">" in words:
        k = words.index(">")
        stdout_file, words = words[k + 1], words[:k]
    return Command(tuple(words[1:]), stdout_file, tuple(shown))


def shell_commands(block: Block) -> list[Command]:
    """The ``plan`` commands of a bash / console block with their shown output."""
    lines = _joined(block.text.splitlines())
    if any(s.startswith("$ ") for s in lines):
        out: list[Command] = []
        for s in lines:
            if s.startswith("$ "):
                out.append(_command(s[2:], []))
            elif out:
                out[-1] = Command(out[-1].argv, out[-1].stdout_file, (*out[-1].shown, s))
        return out
    return [_command(s, []) for s in lines if s.strip() and not s.lstrip().startswith("#")]


def _normal(line: str) -> str:
    line = line.rstrip()
    for pat, repl in _TIMES:
        line = pat.sub(repl, line)
    return line


def assert_shown(shown: tuple[str, ...] | list[str], output: str, where: str) -> None:
    """Every shown line (``...`` and blank lines aside) appears in ``output``, in order."""
    actual = [_normal(s) for s in output.splitlines()]
    k = 0
    for want in (_normal(s) for s in shown):
        if not want.strip() or want.strip() == "...":
            continue
        while k < len(actual) and actual[k] != want:
            k += 1
        assert k < len(actual), f"{where}: shown line not in the real output (in order):\n{want}"
        k += 1


def run_command(cmd: Command, where: str) -> None:
    """Run one command in-process; check its exit status and its shown lines."""
    result = CliRunner().invoke(app, list(cmd.argv), prog_name="plan")
    expect_error = any(s.startswith("plan: error:") for s in cmd.shown)
    want_rc = 2 if expect_error else 0
    assert result.exit_code == want_rc, (
        f"{where}: plan {' '.join(cmd.argv)} exited {result.exit_code}, expected {want_rc}\n"
        f"{result.output[-2000:]}\n{result.exception!r}")
    if cmd.stdout_file:
        Path(cmd.stdout_file).write_text(result.stdout)
    assert_shown(cmd.shown, result.output, where)


def run_python(block: Block, namespace: dict, where: str) -> None:
    """Execute a python block; check the lines it shows with ``#>``."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(block.text, where, "exec"), namespace)  # noqa: S102 (the docs' own code)
    shown = [s.strip()[3:] for s in block.text.splitlines() if s.strip().startswith("#> ")]
    assert_shown(shown, buf.getvalue(), where)


def _scratch(tmp_path: Path, monkeypatch) -> None:
    for name in ("docs", "hardware_specs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)


def test_page_blocks_parse_shell_and_python():
    """The block reader finds skip markers, continuations, redirects and shown output."""
    page = ROOT / "README.md"
    blocks = page_blocks(page)
    assert any(b.lang == "python" for b in blocks)
    demo = Block(page, 1, "console", "$ plan --model x \\\n    --top 3 > a.txt  # c\nline\n...",
                 False)
    (cmd,) = shell_commands(demo)
    assert cmd.argv == ("--model", "x", "--top", "3")
    assert cmd.stdout_file == "a.txt" and cmd.shown == ("line", "...")
    assert_shown(["a", "...", "searched 5 with grid in 1.0 s"], "a\nb\nsearched 5 with grid in 2.5 s",
                 "demo")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_examples_run(page: Path, tmp_path: Path, monkeypatch):
    """Each page's plan commands and python blocks run and print what the page shows."""
    _scratch(tmp_path, monkeypatch)
    namespace: dict = {"__name__": "__docs__"}
    for block in page_blocks(page):
        where = f"{page.name}:{block.line}"
        if block.skipped:
            continue
        if block.lang in SHELL_LANGS:
            for cmd in shell_commands(block):
                run_command(cmd, where)
        elif block.lang == "python":
            run_python(block, namespace, where)
