"""The chapters as pages a reader meets: code that fits the built page's code column, headings that reach the page,
chapters that carry one idea. The book's code column shows about 85 characters at 1920 pixels and 76 at 1280; a
longer line is cut off behind a scroll bar, so code-cell lines are held to 88 (ruff holds the library to 120)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.py")) + sorted(ROOT.glob("notebooks/appendix_*.py")) \
    + [ROOT / "notebooks" / "results.py"]
CODE_COLUMNS = 88
LONG, MOST_LONG, MOST_LINES = 400, 2, 450


def cells(path: Path) -> list[tuple[str, list[str]]]:
    """(kind, lines) of each jupytext percent cell, the header before the first cell left out."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if line.startswith("# %% [markdown]") else "code", []))
        elif out:
            out[-1][1].append(line)
    return out


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_cells_fit_the_page(path):
    wide = [line for kind, lines in cells(path) if kind == "code" for line in lines if len(line) > CODE_COLUMNS]
    assert not wide, f"{len(wide)} code lines over {CODE_COLUMNS} columns, e.g. {wide[0]!r}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_heading_hides_in_a_code_cell(path):
    hidden = [line for kind, lines in cells(path) if kind == "code" for line in lines
              if re.match(r"^# #{1,3} \S", line)]
    assert not hidden, f"a markdown heading inside a code cell never reaches the page: {hidden}"


def test_chapters_carry_one_idea():
    lengths = {p.stem: p.read_text(encoding="utf-8").count("\n") for p in CHAPTERS}
    long = {k: n for k, n in lengths.items() if n > LONG}
    assert len(long) <= MOST_LONG, f"chapters over {LONG} lines (split them on ideas): {long}"
    assert max(lengths.values()) <= MOST_LINES, lengths
