"""Code licences: package metadata, repository combination, per-file SPDX/header overrides,
expressions."""

from __future__ import annotations

import pytest

from datapipe.license import (
    combine,
    detect_code_batch,
    detect_code_file,
    detect_metadata,
    detect_repository,
    expression_classes,
    spdx_identifiers,
)
from datapipe.license.expression import ExpressionError, normalize, parse
from tests.support.license_variants import load_choosealicense
from tests.support.shared_data import shared_path


@pytest.mark.parametrize(
    "path, text, want, where",
    [
        ("package.json", '{"name": "x", "license": "MIT"}', "MIT", "package.json:license"),
        ("package.json", '{"license": "(MIT OR Apache-2.0)"}', "MIT OR Apache-2.0", "package.json:license"),
        ("package.json", '{"licenses": [{"type": "MIT"}, {"type": "GPL-2.0"}]}', "MIT OR GPL-2.0", "package.json:licenses"),
        (
            "pyproject.toml",
            '[project]\nname = "x"\nlicense = "Apache-2.0 AND BSD-3-Clause"\n',
            "Apache-2.0 AND BSD-3-Clause",
            "pyproject.toml:project.license",
        ),
        (
            "pyproject.toml",
            '[project]\nlicense = {text = "BSD License"}\n',
            "BSD-3-Clause",
            "pyproject.toml:project.license.text",
        ),
        (
            "pyproject.toml",
            '[tool.poetry]\nlicense = "GPL-3.0-or-later"\n',
            "GPL-3.0-or-later",
            "pyproject.toml:tool.poetry.license",
        ),
        (
            "pyproject.toml",
            '[project]\nclassifiers = ["License :: OSI Approved :: MIT License"]\n',
            "MIT",
            "pyproject.toml:classifiers",
        ),
        ("setup.cfg", "[metadata]\nname = x\nlicense = Apache 2.0\n", "Apache-2.0", "setup.cfg:license"),
        (
            "x-1.0/PKG-INFO",
            "Metadata-Version: 2.4\nName: x\nLicense-Expression: MIT OR Apache-2.0\n",
            "MIT OR Apache-2.0",
            "PKG-INFO:License-Expression",
        ),
        (
            "PKG-INFO",
            "Metadata-Version: 2.1\nName: x\nLicense: UNKNOWN\n"
            "Classifier: License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)\n",
            "GPL-3.0-or-later",
            "PKG-INFO:Classifier",
        ),
        ("Cargo.toml", '[package]\nname = "x"\nlicense = "MIT OR Apache-2.0"\n', "MIT OR Apache-2.0", "Cargo.toml:license"),
        ("Cargo.toml", '[package]\nlicense = "MIT/Apache-2.0"\n', "MIT OR Apache-2.0", "Cargo.toml:license"),
        ("foo.gemspec", "Gem::Specification.new do |s|\n  s.license = 'MIT'\nend\n", "MIT", "gemspec:licenses"),
        (
            "foo.gemspec",
            'Gem::Specification.new do |s|\n  s.licenses = ["Ruby", "BSD-2-Clause"]\nend\n',
            "BSD-2-Clause",
            "gemspec:licenses",
        ),
    ],
)
def test_metadata(path, text, want, where):
    d = detect_metadata(path, text)
    assert d is not None and (d.license, d.where) == (want, where)


@pytest.mark.parametrize(
    "path, text",
    [
        ("package.json", "{not json"),
        ("package.json", '{"license": "SEE LICENSE IN LICENSE.txt"}'),
        ("Cargo.toml", "[package\n"),
        ("setup.cfg", "[metadata]\nname = x\n"),
        ("README.md", "MIT"),
    ],
)
def test_metadata_absent_or_broken(path, text):
    assert detect_metadata(path, text) is None


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return dict(load_choosealicense(shared_path("licenses", "choosealicense", "_licenses")))


def test_repository_license_file_and_metadata(texts):
    repo = detect_repository(
        {"LICENSE": texts["MIT"], "package.json": '{"license": "MIT"}', "src/vendor/LICENSE": texts["GPL-3.0"]}
    )  # nested: not the repo's
    assert repo.license == "MIT" and repo.license_class == "permissive"


def test_repository_dual_licence_keeps_or_from_metadata(texts):
    files = {
        "LICENSE-MIT": texts["MIT"],
        "LICENSE-APACHE": texts["Apache-2.0"],
        "Cargo.toml": '[package]\nlicense = "MIT OR Apache-2.0"\n',
    }
    assert detect_repository(files).license == "MIT OR Apache-2.0"
    del files["Cargo.toml"]
    assert detect_repository(files).license == "Apache-2.0 AND MIT"


def test_repository_conflict_is_conservative(texts):
    d = detect_repository({"COPYING": texts["GPL-3.0"], "setup.cfg": "[metadata]\nlicense = MIT\n"})
    assert d.license == "GPL-3.0 AND MIT" and d.license_class == "strong_copyleft"


def test_repository_or_later_metadata_refines_text(texts):
    d = detect_repository({"COPYING": texts["GPL-3.0"], "pyproject.toml": '[project]\nlicense = "GPL-3.0-or-later"\n'})
    assert d.license == "GPL-3.0-or-later"


def test_repository_nothing():
    assert detect_repository({"README.md": "hello", "main.py": "print(1)"}).license == "unknown"


def test_spdx_lines_override_repository(texts):
    repo = detect_repository({"LICENSE": texts["MIT"]})
    files = [
        "// SPDX-License-Identifier: GPL-2.0-only WITH Linux-syscall-note\nint x;\n",
        "# SPDX-License-Identifier: Apache-2.0 OR MIT\nimport os\n",
        "/* SPDX-License-Identifier: BSD-3-Clause */\n/* SPDX-License-Identifier: CC0-1.0 */\n",
        "<!-- SPDX-License-Identifier: MPL-2.0 -->\n<html/>",
        "print('no header')\n",
    ]
    got = [(d.license, d.where) for d in detect_code_batch(files, repo)]
    assert got == [
        ("GPL-2.0-only WITH Linux-syscall-note", "header:spdx"),
        ("Apache-2.0 OR MIT", "header:spdx"),
        ("BSD-3-Clause AND CC0-1.0", "header:spdx"),
        ("MPL-2.0", "header:spdx"),
        ("MIT", "file:LICENSE"),
    ]


def test_header_comment_overrides_repository(texts):
    repo = detect_repository({"LICENSE": texts["MIT"]})
    src = (
        "/*\n * Copyright (C) 2020 Foo\n *\n * This program is free software: you can redistribute it\n"
        " * and/or modify it under the terms of the GNU General Public License as published by\n"
        " * the Free Software Foundation, either version 3 of the License, or\n"
        " * (at your option) any later version.\n */\n#include <stdio.h>\n"
    )
    d = detect_code_file(src, repo)
    assert (d.license, d.where, d.license_class) == ("GPL-3.0-or-later", "header", "strong_copyleft")


def test_spdx_identifier_garbage_is_ignored():
    assert spdx_identifiers("# SPDX-License-Identifier: (MIT AND\n") is None


def test_expressions():
    assert normalize("mit OR (apache-2.0 AND bsd-2-clause)") == "MIT OR (Apache-2.0 AND BSD-2-Clause)"
    assert normalize("GPL-2.0+") == "GPL-2.0-or-later"
    assert combine(["MIT", "mit", "unknown", "Apache-2.0 OR MIT"]) == "MIT AND (Apache-2.0 OR MIT)"
    assert combine([]) == "unknown"
    assert expression_classes("MIT OR GPL-3.0-only") == {"permissive"}
    assert expression_classes("MIT AND GPL-3.0-only") == {"permissive", "strong_copyleft"}
    assert expression_classes("CC-BY-NC-ND-4.0") == {"non_commercial", "no_derivatives"}
    assert expression_classes("LicenseRef-foo") == {"unknown"}
    with pytest.raises(ExpressionError):
        parse("MIT AND")
