"""Numbers that cannot drift: find every number in the book's prose and look for it in the outputs,
result files or definitions the prose names (tests/test_drift.py runs it).

A page names its sources with an HTML comment, invisible when the page is rendered (on GitHub
too):

    <!-- numbers-from: notebooks/08_transformer.ipynb results/cpu/board.json -->

It holds from its line to the end of its section (the next heading of the same or a higher
level), so a comment under the title names sources for the whole page and one under a section
heading for that section; where several hold, a number may come from any of them. A source is

* a notebook: its code cells' stored outputs (streams, text/plain and the rendered tables'
  text/markdown: what the chapter showed)
  and its code (the settings a chapter chose, and its guard cells' asserts);
* a JSON file (results/**): every number in it, also the numbers inside its strings, except
  those of a series (a list of more than SERIES numbers, such as every step's loss of a run);
* any other text file (a workflow, requirements.txt, a module of the package): the numbers in it,
  the definitions the prose restates;
* ``attnbook.training.recipe.PRESETS``: every number of every preset's configuration;
* a function of a test module, ``tests/test_explorer.py:transformer_page_numbers``: every number
  of what it returns, for statistics (means, sums, ratios, correlations) that no file holds and
  the test recomputes from the committed data it names.

A notebook's own markdown cells are backed by that notebook and by results/**, and may name more
sources with the same comment.

A prose number is backed when a source holds a number that, rounded to as many decimals as the
prose shows, is the prose number (0.55 matches 0.5512; 40.07 matches 40.07; 25 matches 24.81),
or is 100 times it (91.7 % matches 0.917; in "97–99 %" both ends are percentages). Signs are
ignored. What is not a quoted measurement is not checked: code, math, links, HTML, directive
options, labels ("chapter 9", "layer 2", "sentences 0, 50, ..., 950", "section 3.2.1"), years,
and integers below 14 (counts such as "3 seeds" or "4 heads", and the numbers of chapters, 0 to 13). ALLOWED lists the few definitional numbers
that need no source, each with its reason.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECLARE = re.compile(r"<!--\s*numbers-from:\s*(.*?)\s*-->", re.S)
PRESETS_SOURCE = "attnbook.training.recipe.PRESETS"
FIGURE_REPR = re.compile(r"<Figure size \d+x\d+ with \d+ Axes>")   # a figure's text/plain

# Definitional numbers: they restate a definition or a fixed fact, not a measurement, and no
# output prints them. Keep this short; a measured number never belongs here.
ALLOWED: dict[str, str] = {
    "25000": "the paper's batches: about 25,000 source and 25,000 target tokens (its section 5.1)",
    "100000": "the paper's base model trained for 100,000 steps (its section 5.2 and Table 3)",
    "37000": "the paper's shared BPE vocabulary of about 37,000 tokens (its section 5.1)",
}


@dataclass(frozen=True)
class Number:
    line: int          # 1-based, in the page (for a notebook: in the markdown cell)
    text: str          # as written, e.g. "0.62", "1,200", "91.7 %"
    value: float       # its absolute value, commas dropped; a percentage as written (91.7)
    decimals: int
    percent: bool
    scale: float = 1.0  # 1e6 for "63 million": compared with the source divided by it


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    number: str
    sources: tuple[str, ...]
    context: str

    def __str__(self):
        where = ", ".join(self.sources) or "no source named (add <!-- numbers-from: ... -->)"
        return (f"{self.page}:{self.line}: {self.number!r} is backed by none of: {where}\n"
                f"    {self.context.strip()}\n"
                "    fix: update the number, or name the output or result it comes from")


# ---- numbers in prose ------------------------------------------------------------------------

LABEL_WORDS = (r"chapters?|sections?|tables?|figures?|parts?|layers?|heads?|sentences?|seeds?|"
               r"equations?|exercises?|appendix|rows?|columns?|positions?|steps?|numbers?|"
               r"python|version|item|items|task|line|lines|block|blocks|snapshot|test_|"
               r"PAD=|UNK=|BOS=|EOS=|Ch\.|§")
# a label word followed by one or more numbers: "layer 2", "sentences 0, 50, ..., 950",
# "chapters 1–3", "seeds 0, 1 and 2", "positions 16 to 47", "section 3.2.1"
# (a label is an integer or a section's number, never a decimal such as 0.45: "the same layer
# 0.45" and "layer 2 and 0.34 to 0.57" quote measurements after the label)
LABEL_NUMBER = r"(?:[1-9]\d*(?:\.\d+)*|0)(?!\.?\d)"
LABEL_SEPARATOR = r"\s*(?:,|–|-|to|and|or|\.\.\.|…)\s*(?:\.\.\.,?\s*)?"
LABEL = re.compile(
    rf"(?i)\b(?:{LABEL_WORDS})\s*({LABEL_NUMBER}(?:{LABEL_SEPARATOR}{LABEL_NUMBER})*)")
NUMBER = re.compile(r"(?<![\w.\-/+^_])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(\s?%)?(?![\w%]|[.,]\d)"
                    r"(\s+million\b)?")
RANGE_PERCENT = re.compile(r"\s*(?:–|-|to)\s*\d[\d,]*(?:\.\d+)?\s?%")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})\s*(\{[\w-]+\})?(.*)$")
# fenced blocks whose text is not prose; every other MyST directive (exercise, solution,
# glossary, admonitions, figure captions) holds prose and is read
CODE_FENCES = {"", "{code-cell}", "{code}", "{code-block}", "{raw}", "{math}", "{mermaid}"}


def _blank(m: re.Match) -> str:
    return " " * len(m.group(0))


def prose(text: str) -> list[tuple[int, str]]:
    """The lines of a markdown text with everything that is not prose blanked out: fenced code
    (not the text of MyST directives such as exercises), math, inline code and roles, links'
    targets, URLs, HTML comments and tags, directive options and labels' lines."""
    text = re.sub(r"<!--.*?-->", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    lines, out, fence, directives = text.split("\n"), [], None, []
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        closing = bool(m) and not m.group(3) and not m.group(4).strip()
        if fence is not None:
            if closing and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence):
                fence = None
            continue
        if closing and directives and m.group(2)[0] == directives[-1][0] \
                and len(m.group(2)) >= len(directives[-1]):
            directives.pop()                      # the end of a prose directive (exercise...)
            continue
        if m and (m.group(3) or "") in CODE_FENCES:
            fence = m.group(2)
            continue
        if m:
            directives.append(m.group(2))         # a directive whose text is prose
            continue
        if re.match(r"^\s*:[\w-]+:", line) or re.match(r"^\s*\([\w-]+\)=\s*$", line):
            continue
        line = re.sub(r"\\begin\{.*?\\end\{[^}]*\}", _blank, line)
        line = re.sub(r"(?<!\\)\$[^$]*\$", _blank, line)
        line = re.sub(r"`[^`]*`", _blank, line)
        line = re.sub(r"\]\([^)]*\)", _blank, line)
        line = re.sub(r"https?://\S+", _blank, line)
        line = re.sub(r"<[^>\n]*>", _blank, line)
        line = LABEL.sub(_blank, line)
        out.append((i, line))
    return out


def numbers(text: str) -> list[Number]:
    found = []
    for i, line in prose(text):
        for m in NUMBER.finditer(line):
            whole, frac, pct = m.group(1), m.group(2) or "", m.group(3) or ""
            if not pct and RANGE_PERCENT.match(line, m.end()):
                pct = "%"                                 # "97–99 %": a range of percentages
            scale = 1e6 if m.group(4) else 1.0
            value = float(whole.replace(",", "") + frac)
            if not frac and not pct and scale == 1 and (value < 14 or ("," not in whole and 1950 <= value <= 2030)):
                continue                                  # counts, chapter numbers, years
            found.append(Number(i, m.group(0).strip(), value, len(frac) - 1 if frac else 0,
                                bool(pct), scale))
    return found


# ---- numbers in sources ----------------------------------------------------------------------

SOURCE_NUMBER = re.compile(r"(?<![\w.])-?(\d{1,3}(?:,\d{3})+(?![\d])|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def numbers_in_text(text: str) -> set[float]:
    out = set()
    for m in SOURCE_NUMBER.finditer(text):
        token = m.group(1)
        try:
            out.add(abs(float(token.replace(",", ""))))
        except ValueError:
            continue
        if "," in token:
            out.update(abs(float(p)) for p in token.split(","))
    return out


# A list of more numbers than this is a series, every step's loss of a run: its thousands of
# values would back almost any number with three decimals, so they back none.
SERIES = 100


def numbers_in_json(obj) -> set[float]:
    out = set()
    if isinstance(obj, bool):
        return out
    if isinstance(obj, (int, float)):
        out.add(abs(float(obj)))
    elif isinstance(obj, str):
        out |= numbers_in_text(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out |= numbers_in_text(k) | numbers_in_json(v)
    elif isinstance(obj, list):
        if len(obj) > SERIES and all(isinstance(v, (int, float)) for v in obj):
            return out                         # a series (every step's loss), not quoted numbers
        for v in obj:
            out |= numbers_in_json(v)
    return out


def notebook_source_text(nb: dict) -> str:
    parts = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream" and o.get("name") == "stdout":
                parts.append("".join(o["text"]))
            else:     # a rendered table (attnbook.tables) is text/markdown, a repr text/plain
                for kind in ("text/markdown", "text/plain"):
                    text = "".join(o.get("data", {}).get(kind, ""))
                    if not FIGURE_REPR.fullmatch(text.strip()):   # a size in pixels backs nothing
                        parts.append(text)
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def source_numbers(name: str) -> frozenset[float]:
    """The numbers of one source (see the module's docstring); a missing source raises."""
    if name == PRESETS_SOURCE:
        from dataclasses import asdict

        from attnbook.training.recipe import PRESETS
        return frozenset(numbers_in_json({k: asdict(v) for k, v in PRESETS.items()}))
    if m := re.fullmatch(r"(.+\.py):(\w+)", name):
        return frozenset(numbers_in_json(_function(m.group(1), m.group(2))()))
    path = Path(name) if Path(name).is_absolute() else ROOT / name
    if not path.is_file():
        raise FileNotFoundError(f"numbers-from names {name}, which does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        return frozenset(numbers_in_text(notebook_source_text(json.loads(text))))
    if path.suffix == ".json":
        return frozenset(numbers_in_json(json.loads(text)))
    return frozenset(numbers_in_text(text))


def _function(file: str, name: str):
    """The function ``name`` of the module at ``file`` (tests/test_explorer.py), imported once."""
    import importlib.util
    import sys
    path = Path(file) if Path(file).is_absolute() else ROOT / file
    if not path.is_file():
        raise FileNotFoundError(f"numbers-from names {file}, which does not exist")
    module = sys.modules.get(path.stem)                  # already imported by pytest
    if getattr(module, "__file__", None) != str(path):
        spec = importlib.util.spec_from_file_location(f"drift_source_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.parent))
    return getattr(module, name)


def results_sources() -> tuple[str, ...]:
    return tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.json")))


def is_backed(n: Number, sources: tuple[str, ...]) -> bool:
    if n.text.replace(",", "").replace(" ", "").rstrip("%") in ALLOWED:
        return True
    for name in sources:
        for s in source_numbers(name):
            for v in ((s, s * 100) if n.percent else (s / n.scale,)):
                if abs(round(v, n.decimals) - n.value) < 10 ** -(n.decimals + 3):
                    return True
    return False


# ---- pages -----------------------------------------------------------------------------------

def declared(text: str) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first line, last line, sources) of every numbers-from comment of a text. A comment holds
    from its line to the end of the section it sits in: up to the next heading of the same or a
    higher level than the last heading above it (the whole page, under the title)."""
    headings = [(i, len(m.group(1))) for i, line in prose(text)
                if (m := re.match(r"^(#{1,6})\s", line))]
    end = text.count("\n") + 1
    out = []
    for m in DECLARE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        above = [lvl for i, lvl in headings if i <= line]
        level = above[-1] if above else 0
        last = next((i - 1 for i, lvl in headings if i > line and lvl <= level), end)
        out.append((line, last, tuple(m.group(1).split())))
    return out


def check_text(text: str, page: str, base: tuple[str, ...] = (), offset: int = 0) -> list[Problem]:
    """Problems of one markdown text: ``base`` sources hold everywhere, a numbers-from comment's
    in its section (see :func:`declared`)."""
    marks = declared(text)
    lines = text.split("\n")
    problems = []
    for n in numbers(text):
        named = tuple(x for first, last, s in marks if first <= n.line <= last for x in s)
        sources = tuple(dict.fromkeys(base + named))
        if not is_backed(n, sources):
            problems.append(Problem(page, n.line + offset, n.text, sources, lines[n.line - 1]))
    return problems


def check_page(path: Path, page: str | None = None) -> list[Problem]:
    """A markdown page (book/*.md, README.md)."""
    page = page or str(path.resolve().relative_to(ROOT))
    return check_text(path.read_text(encoding="utf-8"), page)


def check_notebook(path: Path, page: str | None = None) -> list[Problem]:
    """The markdown cells of a notebook, backed by the notebook itself and results/**; a
    Problem's line is "cell N, line L" folded into N * 1000 + L."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    page = page or str(path.relative_to(ROOT))
    own = (str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),)
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            problems += check_text("".join(cell["source"]), page, own + results_sources(),
                                   offset=i * 1000)
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python tests/drift.py PAGE ...``: the unbacked numbers of each page (book/*.md,
    README.md or a notebook's markdown); no page: every page the test checks. Exit status 1 if
    any."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if any(a.startswith("-") for a in argv):
        print(main.__doc__.strip())
        return 2
    paths = [Path(a).resolve() for a in argv] or sorted(
        [*(ROOT / "book").glob("*.md"), ROOT / "README.md", *(ROOT / "notebooks").glob("*.ipynb")])
    count = 0
    for path in paths:
        if not path.is_file():
            print(f"{path}: no such page", file=sys.stderr)
            return 2
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        if path.suffix == ".ipynb":
            problems = check_notebook(path, rel)
            for p in problems:                      # a notebook's line is cell * 1000 + line
                print(str(p).replace(f"{rel}:{p.line}:",
                                     f"{rel}, cell {p.line // 1000}, line {p.line % 1000}:", 1))
        else:
            problems = check_page(path, rel)
            for p in problems:
                print(p)
        count += len(problems)
    print(f"{count} unbacked number(s) in {len(paths)} page(s)")
    return 1 if count else 0


if __name__ == "__main__":
    raise SystemExit(main())
