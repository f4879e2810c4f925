"""attnbook.tables: results as rendered tables. The Markdown it writes is parsed as the book
parses it (markdown-it with tables, as MyST does) into a table whose cells hold exactly the
text given, markup included as text; a malformed table is an error, not a broken page."""
import pytest
from markdown_it import MarkdownIt

from attnbook.tables import markdown_table

PARSER = MarkdownIt("commonmark").enable("table")


def cells(html: str) -> list[list[str]]:
    import re
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)
    unescape = lambda s: s.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")  # noqa: E731
    return [[unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)] for r in rows]


def test_a_table_renders_with_every_cell_as_given():
    text = markdown_table(["model", "BLEU", "note"],
                          [["GRU | wide", "23.1", "*best* of 3"], ["a_b_c", 35.9, "$x$ <b>y</b> [z](u)"]])
    html = PARSER.render(text)
    assert "<table>" in html and "<em>" not in html and "<b>" not in html and "<a " not in html
    assert cells(html) == [["model", "BLEU", "note"], ["GRU | wide", "23.1", "*best* of 3"],
                           ["a_b_c", "35.9", "$x$ <b>y</b> [z](u)"]]


def test_alignment_and_caption():
    text = markdown_table(["a", "b", "c"], [[1, 2, 3]], align="lcr", caption="Three columns")
    assert text.splitlines()[0] == "Three columns" and "|:--|:-:|--:|" in text
    assert 'style="text-align:right"' in PARSER.render(text)


def test_a_malformed_table_is_an_error_that_says_what():
    with pytest.raises(ValueError, match="row 1 has 2 cells for 3 columns"):
        markdown_table(["a", "b", "c"], [[1, 2, 3], [1, 2]])
    with pytest.raises(ValueError, match="l, r or c for each of the 2 columns"):
        markdown_table(["a", "b"], [[1, 2]], align="lx")


def test_columns_of_numbers_are_right_aligned_and_text_left():
    text = markdown_table(["model", "BLEU", "range", "kept?", "beam"],
                          [["GRU", "35.9 ± 0.4", "23.0–23.3", "yes", "–"], ["conv", "36.6", "1,200", "no", "38.5"]])
    assert text.splitlines()[1] == "|:--|--:|--:|:--|--:|"
