"""Code licences in real-world layouts: README sections, REUSE LICENSES/, HTML licence
files, BSD with the holder in the clause, MIT's optional paragraph, GPL headers without a
version, modified licences, COPYING.LESSER + COPYING; and the whole real-world set."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from datapipe.license import detect_code_file, detect_repository
from datapipe.stages.base import StageContext
from datapipe.stages.license import LicenseOptions, LicenseTagger
from tests.support.ingest_helpers import read_all
from tests.support.license_layouts import LAYOUTS, detect_case, load_cases, score
from tests.support.license_variants import load_choosealicense
from tests.support.shared_data import shared_path

CASES = {c.name: c for c in load_cases()}


def test_real_world_set_right_unknown_wrong() -> None:
    results = {name: score(c.expected, detect_case(c, detect_repository, detect_code_file)) for name, c in CASES.items()}
    n = len(results)
    right, wrong = [k for k, v in results.items() if v == "right"], [k for k, v in results.items() if v == "wrong"]
    print(
        f"\nreal-world licence layouts: n={n} right={len(right)} unknown={n - len(right) - len(wrong)} wrong={len(wrong)} {wrong}"
    )
    assert n >= 50
    assert len(wrong) / n < 0.02
    assert len(right) / n >= 0.9


@pytest.mark.parametrize(
    "name, want",
    [
        # a README "License" section is the only statement
        ("readme-mit-research", "MIT"),
        ("readme-mit-bare", "MIT"),
        ("readme-mit-zh", "MIT"),
        ("readme-mit-or-apache", "MIT OR Apache-2.0"),
        ("readme-bsd-3", "BSD-3-Clause"),
        ("readme-gpl-3-notice", "GPL-3.0-or-later"),
        ("readme-no-name", "unknown"),
        # REUSE: LICENSES/<id>.txt without and with a root LICENSE
        ("reuse-licenses-folder-only", "MIT"),
        ("reuse-licenses-folder-and-root", "MIT"),
        # licence text in HTML paragraphs
        ("readme-mit-html-paragraphs", "MIT"),
        ("header-mit-javadoc-paragraphs", "MIT"),
        # BSD with the holder named in the disclaimer clause
        ("header-bsd-2-author-in-disclaimer", "BSD-2-Clause"),
        ("licensee-bsd-3-the-name-of", "BSD-3-Clause"),
        ("licensee-bsd-3-org-name-disclaimer", "BSD-3-Clause"),
        # MIT with its optional "(including the next paragraph)"
        ("header-mit-next-paragraph-c", "MIT"),
        ("header-mit-next-paragraph-python", "MIT"),
        # a modified licence is not its base licence
        ("modified-mit-good-not-evil-js", "LicenseRef-modified-MIT"),
        # GNU convention: COPYING.LESSER + COPYING is the LGPL
        ("copying-lesser-and-copying", "LGPL-3.0"),
        # SPDX lines and expressions in licence files and manifests
        ("licensee-spdx-license-or", "MIT OR Apache-2.0"),
        ("scancode-apache-or-mit-expression", "Apache-2.0 OR MIT"),
        ("licensee-npm-license-expression", "MIT OR Apache-2.0 OR AGPL-3.0-or-later"),
        ("header-gpl-terms-of-version-2-suse", "GPL-2.0-only"),
        ("header-lgpl-terms-and-conditions", "LGPL-2.0-or-later"),
        # issue 50 item 9: a file offering two licences is an OR (it was "MIT AND NCSA"); a GNU notice
        # whose version is named only further down is that version (it was GPL-1.0-or-later); bzip2's
        # four clauses are not BSD-3-Clause
        ("emscripten-available-under-two", "MIT OR NCSA"),
        ("debian-gpl-version-only-in-text", "GPL-2.0-only"),
        ("debian-bzip2-four-clauses", "bzip2-1.0.6"),
        # a licence text with its exception is that licence WITH the exception (it was bare Apache-2.0)
        ("llvm-apache-with-exceptions", "Apache-2.0 WITH LLVM-exception AND BSD-3-Clause AND NCSA"),
    ],
)
def test_layout(name: str, want: str) -> None:
    c = CASES[name]
    assert detect_case(c, detect_repository, detect_code_file) == want


def test_modified_licence_is_not_permissive() -> None:
    c = CASES["modified-mit-good-not-evil-js"]
    d = detect_code_file(c.files[c.file], detect_repository({}))
    assert d.license_class == "unknown" and "good not evil" in d.evidence


def test_unversioned_gnu_header_takes_the_version_of_copying() -> None:
    # A real GPL-3.0 COPYING (go-ethereum fork) and LGPL-3.0 COPYING.LESSER beside headers
    # that name no version: the shipped text says which version.
    copying = CASES["copying-lesser-and-copying"].files
    gpl_repo = detect_repository({"COPYING": copying["COPYING"]})
    assert gpl_repo.license == "GPL-3.0"
    header = (
        "/*\n * This program is free software; you can redistribute it and/or modify\n"
        " * it under the terms of the GNU General Public License as published by\n"
        " * the Free Software Foundation.\n */\nint main(void) { return 0; }\n"
    )
    d = detect_code_file(header, gpl_repo)
    assert d.license == "GPL-3.0" and "no version" in d.evidence and "COPYING" in d.where
    lib = CASES["header-lgpl-library-unversioned"]
    assert detect_code_file(lib.files[lib.file], detect_repository({})).license == "LGPL-2.0-or-later"
    lgpl_repo = detect_repository({"COPYING.LESSER": copying["COPYING.LESSER"]})
    assert detect_code_file(lib.files[lib.file], lgpl_repo).license == "LGPL-3.0"
    # a versioned header keeps its own version
    versioned = CASES["header-gpl-2-only-linux"]
    assert detect_code_file(versioned.files[versioned.file], gpl_repo).license == "GPL-2.0-only"


def test_license_html_file() -> None:
    refs = dict(load_choosealicense(shared_path("licenses", "choosealicense", "_licenses")))
    paras = [p.strip().replace('"', "&quot;") for p in refs["MIT"].strip().split("\n\n")]
    page = (
        "<!DOCTYPE html>\n<html><head><title>License</title><style>p{margin:0}</style></head><body>\n"
        + "\n".join(f"<p>{p}</p>" for p in paras)
        + "\n</body></html>\n"
    )
    d = detect_repository({"license.html": page})
    assert (d.license, d.where) == ("MIT", "file:license.html")


def test_repo_reader_carries_readme_section_and_reuse_folder(tmp_path: Path) -> None:
    """End to end: a repository folder with only a README License section (and one with only
    LICENSES/MIT.txt) is read, carried on every row, and tagged by the license stage."""
    readme_repo, reuse_repo = tmp_path / "readme-repo", tmp_path / "reuse-repo"
    (readme_repo / "src").mkdir(parents=True)
    (readme_repo / "README.md").write_text(CASES["readme-mit-zh"].files["README.md"], encoding="utf-8")
    (readme_repo / "src" / "app.py").write_text("print('hi')\n")
    (reuse_repo / "LICENSES").mkdir(parents=True)
    (reuse_repo / "LICENSES" / "MIT.txt").write_text(CASES["reuse-licenses-folder-only"].files["LICENSES/MIT.txt"])
    (reuse_repo / "main.go").write_text("package main\n")
    stage = LicenseTagger(LicenseOptions.model_validate({"policy": {"code": {"deny": ["unknown"]}}}), StageContext(".", "."))
    stage.setup()
    for repo, carried, evidence in [
        (readme_repo, "README.md", "README.md:license-section"),
        (reuse_repo, "LICENSES/MIT.txt", "file:LICENSES/MIT.txt"),
    ]:
        docs, _ = read_all(repo, "code")
        assert docs and all(carried in json.loads(d["repo_license_files"]) for d in docs)
        if carried == "README.md":  # only the section travels, not the whole README
            section = json.loads(docs[0]["repo_license_files"])["README.md"]
            assert section.startswith("## License") and "pod install" not in section
        batch = stage.compute(pa.Table.from_pylist(docs))
        assert set(batch["license"].to_pylist()) == {"MIT"}
        assert all(e.startswith(evidence) for e in batch["license_evidence"].to_pylist())
        assert stage.decide(batch).reason.to_pylist() == [None] * len(docs)


def test_layout_set_is_small_and_sourced() -> None:
    size = sum(p.stat().st_size for p in LAYOUTS.rglob("*") if p.is_file())
    assert size < 2_000_000
    sources = (LAYOUTS / "SOURCES.md").read_text(encoding="utf-8")
    assert all(f"| {name} |" in sources for name in CASES)
