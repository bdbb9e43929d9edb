"""Which lines are Markdown/LaTeX structure (datapipe/text/markup.py): the cases a line walk can get
wrong. The real-data check is tests/stages/test_boilerplate.py (TiDB docs and OI-wiki)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from datapipe.text.markup import structure_lines


def marked(*docs: str) -> list[list[str]]:
    """The structure lines of each document."""
    lines = [line for d in docs for line in d.split("\n")]
    doc = np.repeat(np.arange(len(docs)), [len(d.split("\n")) for d in docs])
    out = structure_lines(pa.array(lines, pa.string()), doc)
    return [[line for line, m, k in zip(lines, out, doc) if m and k == i] for i in range(len(docs))]


def test_code_blocks_close_only_on_their_own_fence_and_open_ones_end_with_the_document() -> None:
    md = "Intro\n````markdown\n```sql\nSELECT 1;\n````\nprose | not a table\n  ~~~\n  code\n"
    assert marked(md, "after") == [["````markdown", "```sql", "SELECT 1;", "````", "  ~~~", "  code", ""], []]
    # "```a```" is inline code, not a fence; a quoted fence is one
    assert marked("x ```a``` y\n```a```\n> ```sh\n> ls\n> ```\nz") == [["> ```sh", "> ls", "> ```"]]


def test_math_blocks_tables_tags_and_containers() -> None:
    tex = "设 $x$ 为\n$$\nx = 1\n$$\n\\begin{aligned}\na &= b \\\\\n\\begin{cases}1\\end{cases}\n\\end{aligned}\n后文"
    assert marked(tex)[0] == tex.split("\n")[1:-1]
    table = "Home | About\n\n| 参数 | 说明 |\n| --- | :-: |\n| a | b |\nnext\n| x |"
    assert marked(table) == [["| 参数 | 说明 |", "| --- | :-: |", "| a | b |"]]
    html = '<SimpleTab groupId="language">\n<div label="SQL">\ntext\n</div>\n<b>bold</b> words\n=== "C++"\n??? note "证明"\n!!!'
    assert marked(html) == [['<SimpleTab groupId="language">', '<div label="SQL">', "</div>", '=== "C++"', '??? note "证明"']]


def test_paragraph_blocks_end_tables_and_documents_reset_open_blocks() -> None:
    lines = ["a | b", "|---|", "c | d", "e | f"]
    # the third line starts a paragraph (a blank line before it): the table ended there
    out = structure_lines(pa.array(lines), np.zeros(4, np.int64), block_start=np.array([True, False, True, False]))
    assert out.tolist() == [True, True, False, False]
    assert marked("```\nopen", "plain\n$$", "next") == [["```", "open"], ["$$"], []]
