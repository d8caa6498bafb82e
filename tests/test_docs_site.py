"""The documentation site builds in strict mode, and README / docs speak only of the project."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: How the project was built is no part of its documentation.
BUILD_HISTORY = re.compile(r"\bsession \d|\bsessions'|\bissue \d|\bissue's|before issue|\bs\d-i\d+"
                           r"|\.\./shared|/work/", re.IGNORECASE)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed")
def test_mkdocs_build_strict(tmp_path: Path):
    """`mkdocs build --strict` (what `make docs` runs) succeeds: no broken link or anchor."""
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_build_history(page: Path):
    """No page names sessions, issue numbers or paths outside the repository."""
    hits = [f"{page.name}:{i}: {line.strip()[:120]}"
            for i, line in enumerate(page.read_text().splitlines(), 1)
            if BUILD_HISTORY.search(line)]
    assert not hits, "\n".join(hits)


def test_readme_is_a_short_user_guide():
    """The README is the user guide on one page, under 300 lines; the rest is the docs site."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 300
