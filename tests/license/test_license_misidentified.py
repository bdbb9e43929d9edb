"""Layouts that gave a wrong SPDX id (issue 35, item 4), built from the real choosealicense texts.

Each is a form seen in held-out packages (bench/quality/license_heldout.py): a "Modified BSD License"
heading, BSD + a Facebook PATENTS file, a root LICENSE beside a REUSE LICENSES/ folder, a GNU
notice whose version comes after it (or from COPYING), and a header offering a choice of several
licences. Plus package metadata whose licence list holds non-strings (it raised TypeError).
"""

from __future__ import annotations

import json

import pytest

from datapipe.license import detect_code_file, detect_header, detect_metadata, detect_repository
from datapipe.readers.code_repos import is_repo_meta_file
from tests.support.license_variants import load_choosealicense
from tests.support.shared_data import shared_path

# Facebook's PATENTS file as shipped beside BSD-3-Clause (react <= 15, immutable-js, ...), first lines.
FB_PATENTS = """Additional Grant of Patent Rights Version 2

"Software" means the React software distributed by Facebook, Inc.

Facebook, Inc. ("Facebook") hereby grants to each recipient of the Software
("you") a perpetual, worldwide, royalty-free, non-exclusive, irrevocable
(subject to the termination provision below) license under any Necessary
Claims, to make, have made, use, sell, offer to sell, import, and otherwise
transfer the Software. For avoidance of doubt, no license is granted under
Facebook's rights in any patent claims that are infringed by (i) modifications
to the Software made by you or any third party or (ii) the Software in
combination with any software or other technology.

The license granted hereunder will terminate, automatically and without notice,
if you (or any of your subsidiaries, corporate affiliates or agents) initiate
directly or indirectly, or take a direct financial interest in, any Patent
Assertion: (i) against Facebook or any of its subsidiaries or corporate
affiliates, ...
"""


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return dict(load_choosealicense(shared_path("licenses", "choosealicense", "_licenses")))


def _holder(text: str) -> str:
    return text.replace("[year]", "2013").replace("[fullname]", "Jupyter Development Team")


def test_modified_bsd_heading_is_bsd_3_clause(texts) -> None:
    # IPython/Jupyter's LICENSE.md: the common name of BSD-3-Clause as its title.
    md = "# Licensing terms\n\n## Modified BSD License\n\n" + _holder(texts["BSD-3-Clause"])
    assert detect_repository({"LICENSE.md": md}).license == "BSD-3-Clause"
    # A real modification is still one (the marker is not switched off).
    changed = "Modified MIT License\n\n" + texts["MIT"] + "\nThe Software shall be used for Good, not Evil.\n"
    assert detect_repository({"LICENSE": changed}).license.startswith("LicenseRef-modified-")


def test_bsd_plus_facebook_patents_is_not_plain_bsd(texts) -> None:
    found = detect_repository({"LICENSE": _holder(texts["BSD-3-Clause"]), "PATENTS": FB_PATENTS})
    assert found.license == "BSD-3-Clause AND LicenseRef-scancode-facebook-patent-rights-2"
    assert found.license_class == "unknown"  # never reported as usable as plain BSD
    assert "file:PATENTS" in found.where
    assert is_repo_meta_file("PATENTS")  # the repository reader carries it to the license stage


def test_root_license_beside_reuse_folder_names_both(texts) -> None:
    files = {"LICENSE.md": texts["Apache-2.0"], "LICENSES/MIT.txt": texts["MIT"], "README.md": "# tool\n"}
    assert detect_repository(files).license == "Apache-2.0 AND MIT"
    # The same licence in both places is named once.
    assert detect_repository({"LICENSE": texts["MIT"], "LICENSES/MIT.txt": texts["MIT"]}).license == "MIT"


GNU_NO_VERSION = """/*
 * This program is free software; you can redistribute it and/or modify
 * it under the terms of the GNU General Public License as published by
 * the Free Software Foundation.
 *
 * This program is distributed in the hope that it will be useful,
 * but WITHOUT ANY WARRANTY; without even the implied warranty of
 * MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.{later}
 */
#include <linux/module.h>
"""


def test_gnu_notice_takes_the_version_given_further_down_or_in_copying(texts) -> None:
    later = GNU_NO_VERSION.format(later="  See the\n * GNU General Public License version 2 for more details.")
    assert detect_header(later).license == "GPL-2.0-only"
    plain = GNU_NO_VERSION.format(later="")
    repo = detect_repository({"COPYING": texts["GPL-2.0"], "LICENSE-docs": texts["CC-BY-4.0"]})
    # The file is GPL-2.0 (COPYING's version); the docs licence beside it is not this file's.
    assert detect_code_file(plain, repo).license == "GPL-2.0"
    assert detect_header(plain).license == "GPL-1.0-or-later"  # nothing says which: any version, as the GPL says


# Linux crypto/jitterentropy-kcapi.c (2015), the licence part of its header (index id 13596168).
JITTERENTROPY = """/*
 * Copyright Stephan Mueller <smueller@chronox.de>, 2015
 *
 * Redistribution and use in source and binary forms, with or without
 * modification, are permitted provided that the following conditions
 * are met:
 * 1. Redistributions of source code must retain the above copyright
 *    notice, and the entire permission notice in its entirety,
 *    including the disclaimer of warranties.
 * 2. Redistributions in binary form must reproduce the above copyright
 *    notice, this list of conditions and the following disclaimer in the
 *    documentation and/or other materials provided with the distribution.
 * 3. The name of the author may not be used to endorse or promote
 *    products derived from this software without specific prior
 *    written permission.
 *
 * ALTERNATIVELY, this product may be distributed under the terms of
 * the GNU General Public License, in which case the provisions of the GPL2 are
 * required INSTEAD OF the above restrictions.  (This clause is
 * necessary due to a potential bad interaction between the GPL and
 * the restrictions contained in a BSD-style copyright.)
 */
"""


def test_gnu_version_written_as_gpl2_after_the_notice() -> None:
    # It was GPL-1.0-or-later ("any version"): "the provisions of the GPL2" names the version.
    assert detect_header(JITTERENTROPY).license == "GPL-2.0-only"


def test_header_offering_several_licences_is_an_or_of_all(texts) -> None:
    header = (
        "// Copyright 2021 The Contributors.\n"
        "//\n"
        "// This file is licensed under your choice of one of: Apache-2.0, BSD-2-Clause, MIT,\n"
        "// ISC or Zlib. The licence texts are in the LICENSES folder.\n\n"
        "package main\n"
    )
    found = detect_header(header)
    assert found is not None
    assert found.license == "Apache-2.0 OR BSD-2-Clause OR MIT OR ISC OR Zlib"
    # The Rust form with names rather than ids, and the GNU "any later version" is no choice of licences.
    rust = "// Licensed under the Apache License, Version 2.0 <LICENSE-APACHE> or the MIT license\n// <LICENSE-MIT>, at your option.\n"
    assert detect_header(rust).license == "Apache-2.0 OR MIT"
    gnu = "# under the terms of the GNU General Public License as published by the Free Software Foundation,\n# either version 3 of the License, or (at your option) any later version.\n"
    assert detect_header(gnu).license == "GPL-3.0-or-later"


def test_licence_file_offering_a_choice_is_an_or(texts) -> None:
    # node-forge's LICENSE: the offer, then both texts.
    offer = "You may use the Forge project under the terms of either the BSD License or the\nGNU General Public License (GPL) Version 2.\n\n"
    found = detect_repository({"LICENSE": offer + _holder(texts["BSD-3-Clause"]) + "\n\n" + texts["GPL-2.0"]})
    assert found.license == "BSD-3-Clause OR GPL-2.0"


@pytest.mark.parametrize(
    "licenses",
    [
        [{"type": "MIT"}, {"type": {"name": "Apache 2"}}],
        ["MIT", 3, ["BSD"]],
    ],
)
def test_metadata_licence_list_with_non_strings_keeps_the_strings(licenses) -> None:
    found = detect_metadata("package.json", json.dumps({"name": "x", "licenses": licenses}))
    assert found is not None and found.license == "MIT"
    assert "non-string values skipped" in found.evidence


def test_metadata_licence_list_without_strings_is_unknown_with_a_reason() -> None:
    found = detect_metadata("package.json", json.dumps({"name": "x", "licenses": [{"type": {"name": "MIT"}}, 7]}))
    assert found is not None and not found.known
    assert found.evidence == "no licence string, only dict, int values"
