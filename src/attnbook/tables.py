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


def cell_text(value) -> str:
    """One cell as Markdown text: ``str(value)`` with markup escaped and line breaks as spaces."""
    return MARKUP.sub(r"\\\1", " ".join(str(value).split()))


def markdown_table(header: Sequence, rows: Sequence[Sequence], align: str | None = None,
                   caption: str = "") -> str:
    """A Markdown (MyST/GFM) table: ``header`` (k names), ``rows`` (each k cells), ``align`` one
    letter per column, l, r or c (default: the first column left, the others right, as numbers
    are read). ``caption``, if given, is a line of text above the table. ValueError for a row of
    another length or a bad ``align``."""
    k = len(header)
    align = align or "l" + "r" * (k - 1)
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
