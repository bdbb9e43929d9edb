"""Creative Commons names: URL -> SPDX id, and the variant words used in prose."""

from __future__ import annotations

import re

from datapipe.license.spdx import canonical_id

# creativecommons.org/licenses/by-nc-sa/4.0/deed.zh, i.creativecommons.org/l/by/3.0/88x31.png,
# licensebuttons.net/l/by-sa/4.0/80x15.png, creativecommons.org/publicdomain/zero/1.0/
CC_URL = re.compile(
    r"(?:creativecommons\.org/(?:licenses|licences)|(?:i\.creativecommons\.org|licensebuttons\.net)/l)"
    r"/(by(?:-(?:nc|sa|nd)){0,2})(?:/(\d\.\d))?"
    r"|(?:creativecommons\.org/publicdomain|(?:i\.creativecommons\.org|licensebuttons\.net)/p)"
    r"/(zero|mark)(?:/(\d\.\d))?",
    re.I,
)


def spdx_for(variant: str, version: str | None) -> str | None:
    """SPDX id for a CC variant ("by-nc-sa") and version ("4.0").

    Unversioned mentions get `LicenseRef-CC-BY-SA` etc. so the class is still right.
    Jurisdiction ports (/3.0/de/) map to the unported id: same terms class.
    """
    parts = variant.lower().split("-")
    if parts[0] != "by" or len(set(parts)) != len(parts):
        return None
    rest = [p for p in ("nc", "sa", "nd") if p in parts[1:]]  # by-nd-nc (1.0) == by-nc-nd
    if "sa" in rest and "nd" in rest:
        return None
    name = "-".join(["CC", "BY", *[p.upper() for p in rest]])
    if version is None:
        return canonical_id(f"LicenseRef-{name}")
    return canonical_id(f"{name}-{version}")


def spdx_for_url(url: str) -> tuple[str, str] | None:
    """(SPDX id, matched URL part) for the first CC licence URL in `url`."""
    m = CC_URL.search(url)
    if not m:
        return None
    if m.group(1):
        lid = spdx_for(m.group(1), m.group(2))
    elif m.group(3).lower() == "zero":
        lid = "CC0-1.0"
    else:
        lid = canonical_id("LicenseRef-Public-Domain-Mark")
    return (lid, m.group(0)) if lid else None
