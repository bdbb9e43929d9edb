"""SPDX licence expressions: parse, combine several findings, classify.

Kept dependency-free (the grammar is small); `license-expression` would add validation
against the full SPDX list, which we do not need to decide a class.
"""

from __future__ import annotations

import re

from datapipe.errors import DatapipeError
from datapipe.license.spdx import CLASS_RANK, UNKNOWN, canonical_id, id_classes, primary_class

# A parsed expression: an id string, ("WITH", id, exception), or ("AND"|"OR", [nodes]).
Node = str | tuple

_TOKEN = re.compile(r"\(|\)|[A-Za-z0-9.\-+:]+")


class ExpressionError(DatapipeError, ValueError):
    pass


def parse(text: str) -> Node:
    tokens = _TOKEN.findall(text)
    if not tokens:
        raise ExpressionError(f"empty licence expression: {text!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ExpressionError(f"unexpected end of {text!r}")
        pos += 1
        return tokens[pos - 1]

    def binary(op: str, sub) -> Node:
        items = [sub()]
        while (peek() or "").upper() == op:
            take()
            items.append(sub())
        return items[0] if len(items) == 1 else (op, items)

    def atom() -> Node:
        tok = take()
        if tok == "(":
            node = binary("OR", lambda: binary("AND", with_expr))
            if take() != ")":
                raise ExpressionError(f"unbalanced parentheses in {text!r}")
            return node
        if tok.upper() in ("AND", "OR", "WITH") or tok == ")":
            raise ExpressionError(f"unexpected {tok!r} in {text!r}")
        return canonical_id(tok) or tok

    def with_expr() -> Node:
        node = atom()
        if (peek() or "").upper() == "WITH":
            take()
            return ("WITH", node, take())
        return node

    node = binary("OR", lambda: binary("AND", with_expr))
    if pos != len(tokens):
        raise ExpressionError(f"trailing tokens in {text!r}")
    return node


def render(node: Node, parent: str | None = None) -> str:
    if isinstance(node, str):
        return node
    if node[0] == "WITH":
        return f"{render(node[1])} WITH {node[2]}"
    op, items = node
    out = f" {op} ".join(render(i, op) for i in items)
    # Parenthesize any nested compound: correct for OR-in-AND, and clearer for AND-in-OR.
    return f"({out})" if parent is not None and parent != op else out


def classify(node: Node) -> frozenset[str]:
    """Classes that apply to a work under this expression.

    AND: every part applies, so the union.  OR: the recipient may choose, so the
    alternative whose most restrictive class is least restrictive.  WITH: the exception
    (Classpath, LLVM, syscall note) concerns linking, not copying the file itself into a
    corpus, so the base licence's classes are kept.
    """
    if isinstance(node, str):
        return id_classes(node)
    if node[0] == "WITH":
        return classify(node[1])
    op, items = node
    parts = [classify(i) for i in items]
    if op == "AND":
        return frozenset().union(*parts)
    return min(parts, key=lambda s: CLASS_RANK[primary_class(s)])


def normalize(text: str) -> str:
    """Canonical spelling of an expression, or `unknown` if it does not parse."""
    try:
        return render(parse(text))
    except ExpressionError:
        return UNKNOWN


def ids(node: Node) -> list[str]:
    """The licence ids of an expression (exceptions after WITH are not licences)."""
    if isinstance(node, str):
        return [node]
    if node[0] == "WITH":
        return ids(node[1])
    return [i for item in node[1] for i in ids(item)]


def declared_expression(text: str) -> str:
    """A declared licence (a pipeline file's, a record's) in canonical spelling, or ExpressionError.

    Stricter than ``normalize``: every id must be one datapipe classifies (the SPDX ids of
    filters/licenses/classes.yaml) or a ``LicenseRef-``, so a typo ("CC-BY-SA-3") is an error
    instead of a licence whose class is silently ``unknown``."""
    node = parse(text)
    bad = [i for i in ids(node) if canonical_id(i) is None and not i.startswith("LicenseRef-")]
    if bad:
        raise ExpressionError(
            f"{', '.join(map(repr, dict.fromkeys(bad)))} in {text!r} is not an SPDX licence id datapipe knows "
            f"(filters/licenses/classes.yaml lists them; name others LicenseRef-...)"
        )
    return render(node)


def expression_classes(expr: str) -> frozenset[str]:
    if not expr or expr == UNKNOWN:
        return frozenset({UNKNOWN})
    try:
        return classify(parse(expr))
    except ExpressionError:
        return frozenset({UNKNOWN})


def combine(exprs: list[str], op: str = "AND") -> str:
    """Join several findings into one expression; duplicates and `unknown` are dropped.

    AND is the default: licence texts found side by side all apply unless the project
    says it is dual-licensed (then its metadata says OR and is passed through as is).
    """
    seen: list[str] = []
    for e in exprs:
        e = normalize(e) if e and e != UNKNOWN else UNKNOWN
        if e == UNKNOWN:
            continue
        # AND inside AND is one list: "MIT AND Apache-2.0" and "MIT" name MIT once.
        node = parse(e)
        parts = node[1] if op == "AND" and isinstance(node, tuple) and node[0] == "AND" else [node]
        for part in parts:
            if (r := render(part)) not in seen:
                seen.append(r)
    if not seen:
        return UNKNOWN
    if len(seen) == 1:
        return seen[0]
    return render((op, [parse(e) for e in seen]))
