"""Licence-text matching: choosealicense texts exactly, generated variants >=95% right, <1% wrong."""

from __future__ import annotations

import json

import pytest

from datapipe.license import detect_text
from datapipe.license.expression import parse
from tests.support.license_variants import load_choosealicense, variants
from tests.support.shared_data import shared_path


@pytest.fixture(scope="module")
def refs() -> list[tuple[str, str]]:
    refs = load_choosealicense(shared_path("licenses", "choosealicense", "_licenses"))
    assert len(refs) == 47
    return refs


def _ids(expr: str) -> frozenset[str]:
    def walk(node) -> set[str]:
        if isinstance(node, str):
            return {node}
        if node[0] == "WITH":
            return walk(node[1])
        return set().union(*(walk(n) for n in node[1]))

    return frozenset() if expr == "unknown" else frozenset(walk(parse(expr)))


def test_all_choosealicense_texts_exact(refs):
    wrong = [(spdx, d.license) for spdx, body in refs if (d := detect_text(body, "file:LICENSE")).license != spdx]
    assert wrong == []


def test_detection_fields(refs):
    spdx, body = next(r for r in refs if r[0] == "GPL-3.0")
    d = detect_text(body, "file:COPYING")
    assert (d.license, d.license_class, d.where) == ("GPL-3.0", "strong_copyleft", "file:COPYING")
    assert 0 < len(d.evidence) <= 200


def test_variants_accuracy(refs):
    vs = variants(refs)
    right = wrong = 0
    failures = []
    for name, text, want in vs:
        got = _ids(detect_text(text).license)
        if got == want:
            right += 1
        elif got:
            wrong += 1
            failures.append((name, sorted(got)))
    n = len(vs)
    print(
        f"\nlicence variants: {n} total, {right / n:.1%} right, {wrong / n:.1%} wrong, "
        f"{(n - right - wrong) / n:.1%} unknown; wrong: {failures[:10]}"
    )
    assert right / n >= 0.95
    assert wrong / n < 0.01


def test_unrelated_text_is_unknown():
    for text in [
        "",
        "def main():\n    return 42\n",
        "This licence is great. MIT is a university.",
        "Permission is hereby granted to attend the meeting.",
    ]:
        assert detect_text(text).license == "unknown"


def test_no_false_positives_on_real_prose():
    path = shared_path("corpus", "en_wikipedia.jsonl")
    hits = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 2000:
                break
            if (d := detect_text(json.loads(line)["text"])).known:
                hits.append(d.license)
    assert hits == []


@pytest.mark.parametrize(
    "notice, want",
    [
        ('# Licensed under the Apache License, Version 2.0 (the "License");\n# you may not use this file', "Apache-2.0"),
        (
            "/* This program is free software; you can redistribute it and/or modify it under the terms of\n"
            " * the GNU General Public License as published by the Free Software Foundation; either version 2\n"
            " * of the License, or (at your option) any later version. */",
            "GPL-2.0-or-later",
        ),
        (
            "// under the terms of the GNU Lesser General Public License as published by the Free Software\n"
            "// Foundation, version 3 of the License.",
            "LGPL-3.0-only",
        ),
        ("# This Source Code Form is subject to the terms of the Mozilla Public\n# License, v. 2.0.", "MPL-2.0"),
        ("Released under the MIT license.", "MIT"),
    ],
)
def test_header_notices(notice, want):
    assert detect_text(notice, "header").license == want


def test_gnu_text_without_title_is_not_or_later(refs):
    # Without its title the GPL text is still recognised by its sample "how to apply"
    # notice, which must not be read as the author choosing "or later".
    body = dict(refs)["GPL-3.0"]
    untitled = body.strip().split("\n\n", 1)[1]
    assert detect_text(untitled).license in ("GPL-3.0", "unknown")
    assert detect_text(untitled[len(untitled) // 2 :]).license in ("GPL-3.0", "unknown")
