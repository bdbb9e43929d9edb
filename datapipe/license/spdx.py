"""SPDX id table: canonical spelling and licence classes, loaded once from filters/licenses/classes.yaml."""

from __future__ import annotations

from functools import lru_cache

import yaml

from datapipe.assets.filters_dir import filter_file

UNKNOWN = "unknown"
# Rank used to pick the one `license_class` a document shows and to resolve AND / OR:
# a higher rank is more restrictive.  `unknown` ranks highest so that an AND with an
# unidentified part is never reported as more usable than it is.
CLASS_RANK: dict[str, int] = {
    "permissive": 0,
    "weak_copyleft": 1,
    "strong_copyleft": 2,
    "restricted": 3,
    "non_commercial": 4,
    "no_derivatives": 5,
    UNKNOWN: 6,
}
CLASSES = tuple(CLASS_RANK)


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    data = filter_file("licenses", "classes.yaml")
    raw = yaml.safe_load(data.read_text(encoding="utf-8"))
    canon: dict[str, str] = {}
    classes: dict[str, set[str]] = {}
    for cls, ids in raw.items():
        if cls not in CLASS_RANK:
            raise ValueError(f"{data}: unknown licence class {cls!r}")
        for spdx_id in ids:
            canon[spdx_id.lower()] = spdx_id
            classes.setdefault(spdx_id, set()).add(cls)
    return canon, {k: frozenset(v) for k, v in classes.items()}


def canonical_id(spdx_id: str) -> str | None:
    """Known id in its SPDX spelling (ids are case-insensitive), else None.

    `GPL-2.0+` (old SPDX "or later" suffix) maps to `GPL-2.0-or-later`.
    """
    key = spdx_id.strip().lower()
    canon, _ = _table()
    if key in canon:
        return canon[key]
    if key.endswith("+") and f"{key[:-1]}-or-later" in canon:
        return canon[f"{key[:-1]}-or-later"]
    return None


def id_classes(spdx_id: str) -> frozenset[str]:
    """Classes of one id; unknown ids (and LicenseRef-* we do not list) are `unknown`."""
    canon = canonical_id(spdx_id)
    if canon is None:
        return frozenset({UNKNOWN})
    return _table()[1][canon]


def primary_class(classes: frozenset[str] | set[str]) -> str:
    """The most restrictive class of a set: what a single `license_class` field shows."""
    return max(classes, key=CLASS_RANK.__getitem__) if classes else UNKNOWN


def known_ids() -> list[str]:
    return sorted(_table()[1])
