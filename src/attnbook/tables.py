"""Results as the reader sees them: tables that the book renders.

A chapter shows a result with rows and columns as a table, not as text lined up with spaces,
which a narrow column cuts off or wraps into nonsense:

    show_table(["model", "BLEU"], [["GRU", "23.1"], ["Transformer", "35.9"]])

In a notebook this displays a Markdown table; the book renders it as MyST (``_config.yml``:
``nb_render_markdown_format: myst``), sized to the column. Cells are strings formatted by the
caller, so the page shows exactly the digits the chapter chose, or other values, shown with
``str()``. Characters that Markdown reads as markup (``| * _ ` $ < > [ ] # \\``) are escaped: a
cell is always shown as the text it holds.
"""
from __future__ import annotations

import re
from typing import Sequence

MARKUP = re.compile(r"([\\`*_\[\]<>|#$])")
ALIGN = {"l": ":--", "r": "--:", "c": ":-:"}
# a number as a table shows one: 35.9, -1.12, 1,200, 35.9 ± 0.4, 23.0–23.3, 1.17M, 58.6%, x1.5, 0.009 *
NUMBER = re.compile(r"[\s+\-−–±×x*.,%()0-9]*(M|k|G|ms|s|MiB|to|[\s.,0-9±–-])*")


def cell_text(value) -> str:
    """One cell as Markdown text: ``str(value)`` with markup escaped and line breaks as spaces."""
    return MARKUP.sub(r"\\\1", " ".join(str(value).split()))


def numeric(value) -> bool:
    """Whether a cell reads as a number (digits, with signs, units and ranges): right-aligned."""
    text = str(value).strip()
    return any(c.isdigit() for c in text) and NUMBER.fullmatch(text) is not None


def markdown_table(header: Sequence, rows: Sequence[Sequence], align: str | None = None,
                   caption: str = "") -> str:
    """A Markdown (MyST/GFM) table: ``header`` (k names), ``rows`` (each k cells), ``align`` one
    letter per column, l, r or c (default: right where every cell of the column reads as a number,
    as numbers are read, left elsewhere). ``caption``, if given, is a line of text above the
    table. ValueError for a row of another length or a bad ``align``."""
    k = len(header)
    if align is None:                  # empty cells and dashes (no value) do not decide
        cols = [[str(row[j]).strip() for row in rows if len(row) == k] for j in range(k)]
        align = "".join("r" if any(map(numeric, c)) and all(numeric(x) or x in ("", "–", "—")
                                                           for x in c) else "l" for c in cols)
    if len(align) != k or set(align) - set(ALIGN):
        raise ValueError(f"align {align!r} must give l, r or c for each of the {k} columns")
    for i, row in enumerate(rows):
        if len(row) != k:
            raise ValueError(f"row {i} has {len(row)} cells for {k} columns: {list(row)!r}")
    lines = [f"{cell_text(caption)}\n"] if caption else []
    lines.append("| " + " | ".join(cell_text(h) for h in header) + " |")
    lines.append("|" + "|".join(ALIGN[a] for a in align) + "|")
    lines += ["| " + " | ".join(cell_text(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def show_table(header: Sequence, rows: Sequence[Sequence], align: str | None = None,
               caption: str = "") -> None:
    """Display :func:`markdown_table` in a notebook (IPython's Markdown display)."""
    from IPython.display import Markdown, display
    display(Markdown(markdown_table(header, rows, align, caption)))
