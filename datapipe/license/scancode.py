"""Optional accurate path: scancode-toolkit's licence detection (offline, heavy).

Not a datapipe dependency.  Install in its own environment:
    pip install scancode-toolkit-mini 'pluggy<1.7'
It matches against ~40k rules (notices, references, partial texts) where the default
phrase matcher knows ~50 full texts and common notices; it is ~100x slower and loads a
~5 s index per process.  Its SPDX spelling (GPL-3.0-only, LicenseRef-scancode-*) passes
through; ids the class table does not know are classed `unknown`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from datapipe.license.detection import Detection
from datapipe.license.expression import combine
from datapipe.license.spdx import UNKNOWN

# scancode keys for language halves of texts we report under the SPDX id.
_ALIASES = {
    "LicenseRef-scancode-cecill-2.1-fr": "CECILL-2.1",
    "LicenseRef-scancode-mulanpsl-2.0-en": "MulanPSL-2.0",
}


def available() -> bool:
    try:
        import licensedcode  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=1)
def load_scancode() -> tuple[Any, Any, Any, Any]:
    """scancode's licence index and helpers, loaded once (slow: the first detection pays it otherwise)."""
    from licensedcode.cache import build_spdx_license_expression, get_index, get_licensing
    from licensedcode.detection import detect_licenses

    return get_index(), get_licensing(), detect_licenses, build_spdx_license_expression


def detect_text_scancode(text: str, where: str = "text") -> Detection:
    index, licensing, detect_licenses, to_spdx = load_scancode()
    from license_expression import combine_expressions

    exprs = [d.license_expression for d in detect_licenses(index=index, query_string=text) if d.license_expression]
    if not exprs:
        return Detection(UNKNOWN, "", where)
    expr = combine_expressions(exprs, relation="AND", unique=True, licensing=licensing)
    spdx = str(to_spdx(str(expr), licensing=licensing))
    for key, spdx_id in _ALIASES.items():
        spdx = spdx.replace(key, spdx_id)
    # "MulanPSL-2.0 AND MulanPSL-2.0" after aliasing: dedupe through our combiner.
    spdx = combine(re.split(r" AND (?![^(]*\))", spdx))
    return Detection(spdx, f"scancode: {expr}", where)
