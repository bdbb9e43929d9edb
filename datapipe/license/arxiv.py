"""arXiv licence URLs (the `license` field of arXiv metadata / OAI-PMH) -> SPDX ids."""

from __future__ import annotations

import re

from datapipe.license.cc import spdx_for_url
from datapipe.license.detection import Detection
from datapipe.license.spdx import UNKNOWN

# arXiv's own licences: a grant to arXiv only.  "assumed-1991-2003" is what arXiv records
# for old submissions that predate licence selection; the terms are the same.
_ARXIV = re.compile(r"arxiv\.org/licenses/(nonexclusive-distrib/1\.0|assumed-1991-2003)", re.I)
ARXIV_NONEXCLUSIVE = "LicenseRef-arXiv-nonexclusive-distrib-1.0"


def detect_arxiv(license_url: str | None) -> Detection:
    """Detection for an arXiv metadata licence URL; missing or unrecognised -> unknown."""
    url = (license_url or "").strip()
    if not url:
        return Detection(UNKNOWN, "", "arxiv-metadata")
    if m := _ARXIV.search(url):
        return Detection(ARXIV_NONEXCLUSIVE, m.group(0), "arxiv-metadata")
    if found := spdx_for_url(url):
        return Detection(found[0], found[1], "arxiv-metadata")
    return Detection(UNKNOWN, url[:120], "arxiv-metadata")
