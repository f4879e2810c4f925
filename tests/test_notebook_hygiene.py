"""The committed outputs of every notebook are fit to publish: the book renders them as they are.

Fast, no kernel and no browser: reads notebooks/*.ipynb and fails on

* output spam: a code cell with more than MAX_OUTPUTS output blocks, or more than MAX_TEXT_LINES
  lines of text (a print in a training loop: Jupyter merges consecutive prints into one block,
  so the block count alone would not see it);
* progress bars: a carriage return that is not part of a Windows line break (how tqdm and other
  bars redraw a line), tqdm's rates ("12.3it/s]", "1.2s/it]") or its bar ("45%|####  |"), ANSI
  cursor movement, and ipywidgets (tqdm.auto in Jupyter), which a static page cannot show;
* paths of the machine that ran the notebook (/work/..., /home/..., /tmp/..., /Users/..., /root/...,
  C:\\Users\\...) in any output, tracebacks and warnings included;
* tracebacks (an error output, or "Traceback (most recent call last)" in a stream or text) except
  in cells tagged `raises-exception` (nbval's tag for a cell that must raise);
* figures too wide to read: a PNG wider than ``attnbook.plotting.PAGE_WIDTH`` at the style's
  100 dpi (and the few pixels a tight bounding box adds), which the page shrinks until its tick
  labels are smaller than 9 px.

The browser test (tests/test_browser.py) bounds the height of each rendered page and output.
"""
from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import pytest

from attnbook.plotting import PAGE_WIDTH

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The largest cell in the committed notebooks (November 2026) has 9 output blocks
# (07_positional_encoding) and 41 lines of text (09_training, the leaderboard).
MAX_OUTPUTS = 30
MAX_TEXT_LINES = 150

RAISES = "raises-exception"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROGRESS = [
    (re.compile(r"\r(?!\n)"), "a carriage return (a progress bar redrawing its line)"),
    (re.compile(r"(?:it|s|B)/(?:it|s)\]"), "a tqdm rate such as `13.2it/s]`"),
    (re.compile(r"\d{1,3}%\|[\s#0-9\u2588\u2589\u258a\u258b\u258c\u258d\u258e\u258f]*\|"),
     "a tqdm bar such as `45%|####5     |`"),
    (re.compile(r"\x1b\[\d*[ABK]"), "ANSI cursor movement or line erasing (a redrawn line)"),
]
# A path of the machine that ran the notebook: /work/, /home/, /tmp/, ... at the start of a path,
# not inside a URL ("https://host/home/..." has a host name before the slash).
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])(?:/(?:work|home|tmp|root|Users|private/var|var/folders)/"
                          r"|[A-Za-z]:\\(?:Users|Windows)\\)\S*")
TRACEBACK = "Traceback (most recent call last)"
WIDGET = "application/vnd.jupyter.widget-view+json"

# Violations already committed, each with the fix it needs; strict: the test fails once it is fixed,
# so that the entry is removed.
KNOWN: dict[tuple[str, str], str] = {}   # (check, notebook): why it fails today (strict xfail)


def code_cells(path: Path):
    """(cell number, tags, outputs) of every code cell, from the notebook's JSON."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            yield i, cell.get("metadata", {}).get("tags", []), cell.get("outputs", [])


def text_of(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def texts(output: dict) -> list[tuple[str, str]]:
    """(where, text) of everything readable in one output; images are left out."""
    kind = output["output_type"]
    if kind == "stream":
        return [(output.get("name", "stream"), text_of(output.get("text", "")))]
    if kind == "error":
        return [("error", f"{output.get('ename')}: {output.get('evalue')}\n"
                          + ANSI.sub("", "\n".join(output.get("traceback", []))))]
    found = []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith(("json", "+xml")) and mime != WIDGET:
            found.append((mime, text_of(value) if isinstance(value, (str, list))
                          else json.dumps(value)))
    return found


def lines_of_text(outputs: list[dict]) -> int:
    """Lines of text the cell shows: streams, and plain text that no image or HTML replaces."""
    n = 0
    for o in outputs:
        if o["output_type"] == "stream":
            n += text_of(o.get("text", "")).count("\n")
        elif o["output_type"] in ("execute_result", "display_data"):
            data = o.get("data", {})
            if set(data) == {"text/plain"}:
                n += text_of(data["text/plain"]).count("\n") + 1
    return n


def short(text: str, at: int, width: int = 60) -> str:
    return repr(text[max(0, at - 20): at + width])


def spam(path: Path) -> list[str]:
    problems = []
    for i, _, outputs in code_cells(path):
        if len(outputs) > MAX_OUTPUTS:
            problems.append(f"cell {i}: {len(outputs)} output blocks (at most {MAX_OUTPUTS})")
        lines = lines_of_text(outputs)
        if lines > MAX_TEXT_LINES:
            problems.append(f"cell {i}: {lines} lines of text output (at most {MAX_TEXT_LINES}): "
                            "print a summary, or every n-th step")
    return problems


def progress_bars(path: Path) -> list[str]:
    problems = []
    for i, _, outputs in code_cells(path):
        for o in outputs:
            if WIDGET in o.get("data", {}):
                problems.append(f"cell {i}: an ipywidget (tqdm.auto's bar?): a static page shows "
                                "nothing; use a text bar or none")
            for where, text in texts(o):
                if where == "error":
                    continue  # a traceback's colours are not a progress bar
                for pattern, what in PROGRESS:
                    m = pattern.search(text)
                    if m:
                        problems.append(f"cell {i} ({where}): {what}: {short(text, m.start())}")
    return problems


def machine_paths(path: Path) -> list[str]:
    problems = []
    for i, _, outputs in code_cells(path):
        for o in outputs:
            for where, text in texts(o):
                for m in MACHINE_PATH.finditer(text):
                    problems.append(f"cell {i} ({where}): the path {m.group()!r}: print paths "
                                    "relative to the repository or the notebook")
    return problems


def tracebacks(path: Path) -> list[str]:
    problems = []
    for i, tags, outputs in code_cells(path):
        if RAISES in tags:
            continue
        for o in outputs:
            if o["output_type"] == "error":
                problems.append(f"cell {i}: raised {o.get('ename')}: {o.get('evalue')!r} (tag "
                                f"the cell `{RAISES}` if it is meant to raise)")
            elif any(TRACEBACK in text for _, text in texts(o)):
                problems.append(f"cell {i}: a traceback in its {o['output_type']} output")
    return problems


MAX_FIGURE_PX = round(PAGE_WIDTH * 100) + 40      # 100 dpi, and a tight bounding box's margin


def wide_figures(path: Path) -> list[str]:
    problems = []
    for i, _, outputs in code_cells(path):
        for o in outputs:
            png = o.get("data", {}).get("image/png")
            if png:
                width, height = struct.unpack(">II", base64.b64decode(text_of(png))[16:24])
                if width > MAX_FIGURE_PX:
                    problems.append(f"cell {i}: a figure {width} px wide (at most {MAX_FIGURE_PX}): "
                                    f"give it figsize=(PAGE_WIDTH, ...) from attnbook.plotting, "
                                    "or put its panels in rows")
    return problems


CHECKS = {"spam": spam, "progress": progress_bars, "paths": machine_paths,
          "tracebacks": tracebacks, "figures": wide_figures}


def cases():
    for check in CHECKS:
        for path in NOTEBOOKS:
            reason = KNOWN.get((check, path.stem))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(check, path, marks=marks, id=f"{check}-{path.stem}")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 9


def test_known_violations_name_real_notebooks():
    stems = {p.stem for p in NOTEBOOKS}
    assert {stem for _, stem in KNOWN} <= stems and {c for c, _ in KNOWN} <= set(CHECKS)


@pytest.mark.parametrize("check,path", list(cases()))
def test_committed_outputs(check, path):
    problems = CHECKS[check](path)
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


# The checks themselves, on outputs made up for the purpose.

def fake_notebook(tmp_path: Path, outputs: list[dict], tags=()) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": "code", "id": "c", "execution_count": 1, "source": "x",
                     "metadata": {"tags": list(tags)}, "outputs": outputs}]}
    path = tmp_path / "fake.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def png(width: int, height: int) -> str:
    """A PNG's first bytes (its signature and header), base64 as a notebook stores it."""
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", width, height)
    return base64.b64encode(head + b"\x08\x06\x00\x00\x00").decode()


TQDM = "\r  0%|          | 0/300 [00:00<?, ?it/s]\r 45%|####5     | 135/300 [00:10<00:12, 13.2it/s]"


@pytest.mark.parametrize("outputs,check", [
    ([stream(TQDM, "stderr")], "progress"),
    ([stream("step 10: loss 4.1 [00:03, 1.52s/it]\n")], "progress"),
    ([stream("\u2588\u2588\u2588\u258c      | 35%\n 35%|\u2588\u2588\u2588\u258c      | 7/20\n")],
     "progress"),
    ([stream("epoch 1\x1b[A\x1b[K")], "progress"),
    ([{"output_type": "display_data", "metadata": {},
       "data": {WIDGET: {"model_id": "abc"}, "text/plain": "HBox()"}}], "progress"),
    ([stream(f"step {i}\n") for i in range(MAX_OUTPUTS + 1)], "spam"),
    ([stream("".join(f"step {i}\n" for i in range(MAX_TEXT_LINES + 1)))], "spam"),
    ([stream("saved to /home/alice/attnbook/runs/x\n")], "paths"),
    ([stream("/tmp/tmpab12/run.json\n")], "paths"),
    ([stream("C:\\Users\\alice\\runs\n")], "paths"),
    ([{"output_type": "error", "ename": "ValueError", "evalue": "no",
       "traceback": ["\x1b[31mValueError\x1b[0m", "File \x1b[32m/work/x/y.py:3\x1b[0m"]}], "paths"),
    ([{"output_type": "error", "ename": "ValueError", "evalue": "no", "traceback": []}],
     "tracebacks"),
    ([stream("Traceback (most recent call last):\n  ...\nKeyError: 1\n", "stderr")], "tracebacks"),
    ([{"output_type": "display_data", "metadata": {},
       "data": {"image/png": png(1400, 400), "text/plain": "<Figure>"}}], "figures"),
])
def test_checks_catch(tmp_path, outputs, check):
    assert CHECKS[check](fake_notebook(tmp_path, outputs))


@pytest.mark.parametrize("outputs,tags", [
    ([stream("loss 4.10\r\nloss 3.20\r\n")], ()),          # Windows line breaks
    ([stream("see https://example.org/home/tmp/work/x and results/cpu/board.json\n")], ()),
    ([stream("| accuracy | 45%| 3 it/s |\n")], ()),        # a table, not a bar or a rate
    ([{"output_type": "error", "ename": "DataError", "evalue": "unknown split 'dev'",
       "traceback": ["\x1b[31mDataError\x1b[0m: unknown split"]}], (RAISES,)),
    ([stream(f"row {i}\n") for i in range(3)], ()),
    ([{"output_type": "display_data", "metadata": {},
       "data": {"image/png": png(MAX_FIGURE_PX, 400), "text/plain": "<Figure>"}}], ()),
])
def test_checks_pass(tmp_path, outputs, tags):
    path = fake_notebook(tmp_path, outputs, tags)
    assert {name: check(path) for name, check in CHECKS.items()} == dict.fromkeys(CHECKS, [])
