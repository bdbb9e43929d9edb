"""Declared licences in package metadata: package.json, pyproject.toml, setup.cfg,
PKG-INFO/METADATA, Cargo.toml, *.gemspec.  Each parser returns a Detection or None."""

from __future__ import annotations

import configparser
import json
import re
from collections.abc import Callable
from email.parser import HeaderParser
from pathlib import PurePosixPath
from typing import Any

import tomllib

from datapipe.license.detection import Detection
from datapipe.license.expression import ExpressionError, parse, render
from datapipe.license.spdx import UNKNOWN, canonical_id
from datapipe.license.textmatch import normalize

# Free-text values seen in the wild -> SPDX id.  Keys are textmatch-normalized.  GNU names
# without "only"/"or later" keep the bare id (same class either way).
_ALIASES = {
    "mit license": "MIT",
    "the mit license": "MIT",
    "mit": "MIT",
    "expat": "MIT",
    "apache 2 0": "Apache-2.0",
    "apache license 2 0": "Apache-2.0",
    "apache 2": "Apache-2.0",
    "apache license version 2 0": "Apache-2.0",
    "apache software license": "Apache-2.0",
    "asl 2 0": "Apache-2.0",
    "bsd": "BSD-3-Clause",
    "new bsd": "BSD-3-Clause",
    "bsd license": "BSD-3-Clause",
    "3 clause bsd": "BSD-3-Clause",
    "simplified bsd": "BSD-2-Clause",
    "2 clause bsd": "BSD-2-Clause",
    "isc license": "ISC",
    "gplv2": "GPL-2.0",
    "gplv3": "GPL-3.0",
    "gpl v3": "GPL-3.0",
    "gpl v2": "GPL-2.0",
    "lgplv3": "LGPL-3.0",
    "lgplv2 1": "LGPL-2.1",
    "agplv3": "AGPL-3.0",
    "mpl 2 0": "MPL-2.0",
    "mozilla public license 2 0": "MPL-2.0",
    "public domain": "Unlicense",
    "psf": "PSF-2.0",
    "zlib license": "Zlib",
}
# Trove classifiers (PKG-INFO, pyproject): the most common ones.
_CLASSIFIERS = {
    "MIT License": "MIT",
    "Apache Software License": "Apache-2.0",
    "BSD License": "BSD-3-Clause",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "GNU General Public License v2 (GPLv2)": "GPL-2.0-only",
    "GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "GNU General Public License v3 (GPLv3)": "GPL-3.0-only",
    "GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0-only",
    "GNU Lesser General Public License v2 or later (LGPLv2+)": "LGPL-2.0-or-later",
    "GNU Affero General Public License v3": "AGPL-3.0-only",
    "The Unlicense (Unlicense)": "Unlicense",
    "Python Software Foundation License": "PSF-2.0",
}


def declared(value: str, op: str = "OR") -> str | None:
    """SPDX expression for a declared value: an expression, an alias, or a Cargo-style
    "MIT/Apache-2.0" (which Cargo documents as OR).  None if we cannot tell."""
    value = value.strip()
    if not value or len(value) > 200:
        return None
    if "/" in value and " " not in value:
        value = " OR ".join(value.split("/"))
    try:
        node = parse(value)
        expr = render(node)
        if all(
            canonical_id(tok)
            for tok in re.findall(r"[A-Za-z0-9.\-+:]+", expr)
            if tok not in ("AND", "OR", "WITH") and not tok.endswith("exception") and not tok.endswith("-note")
        ):
            return expr
    except ExpressionError:
        pass
    return _ALIASES.get(normalize(value).strip())


def _values(values: list[Any], where: str) -> Detection | None:
    """values as the manifest has them: package.json "licenses" may hold anything (mappings whose
    "type" is itself a mapping, numbers, nested lists); only strings can declare a licence."""
    strings = [v for v in values if isinstance(v, str)]
    others = sorted({type(v).__name__ for v in values if not isinstance(v, str) and v is not None})
    exprs = [e for e in (declared(v) for v in strings) if e]
    if not exprs:
        # Nothing usable: unknown, saying why (a malformed manifest must not stop the crawl).
        return Detection(UNKNOWN, f"no licence string, only {', '.join(others)} values", where) if others else None
    # Several declared licences (package.json "licenses", gemspec "licenses") are offered
    # as alternatives by convention: OR.
    expr = exprs[0] if len(exprs) == 1 else render(("OR", [parse(e) for e in dict.fromkeys(exprs)]))
    skipped = f" ({len(values) - len(strings)} non-string values skipped)" if others else ""
    return Detection(expr, ", ".join(strings)[:120] + skipped, where)


_JSON_LICENSE = re.compile(r'"license"\s*:\s*"([^"]{1,200})"')


def _package_json(text: str) -> Detection | None:
    try:
        data = json.loads(text)
    except ValueError:
        # Hand-edited manifests break (a missing comma); the "license" string still says it.
        m = _JSON_LICENSE.search(text)
        return _values([m.group(1)], "package.json:license") if m else None
    lic = data.get("license")
    if isinstance(lic, dict):
        lic = lic.get("type")
    if isinstance(lic, str):
        return _values([lic], "package.json:license")
    lics = data.get("licenses")
    if isinstance(lics, list):
        return _values([x.get("type") if isinstance(x, dict) else x for x in lics], "package.json:licenses")
    return None


def _classifiers(items: list[str], where: str) -> Detection | None:
    ids = [
        _CLASSIFIERS[c.rsplit("::", 1)[-1].strip()]
        for c in items
        if c.startswith("License ::") and c.rsplit("::", 1)[-1].strip() in _CLASSIFIERS
    ]
    return _values(ids, where) if ids else None


def _pyproject(text: str) -> Detection | None:
    data = tomllib.loads(text)
    project = data.get("project", {})
    lic = project.get("license")
    if isinstance(lic, str):  # PEP 639: an SPDX expression
        return _values([lic], "pyproject.toml:project.license")
    if isinstance(lic, dict) and isinstance(lic.get("text"), str):
        if found := _values([lic["text"]], "pyproject.toml:project.license.text"):
            return found
    poetry = data.get("tool", {}).get("poetry", {}).get("license")
    if isinstance(poetry, str):
        return _values([poetry], "pyproject.toml:tool.poetry.license")
    return _classifiers(project.get("classifiers", []), "pyproject.toml:classifiers")


def _setup_cfg(text: str) -> Detection | None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    for key in ("license_expression", "license"):
        if cfg.has_option("metadata", key):
            return _values([cfg.get("metadata", key)], f"setup.cfg:{key}")
    if cfg.has_option("metadata", "classifiers"):
        return _classifiers(cfg.get("metadata", "classifiers").splitlines(), "setup.cfg:classifiers")
    return None


def _pkg_info(text: str) -> Detection | None:
    msg = HeaderParser().parsestr(text)
    for key in ("License-Expression", "License"):
        if msg.get(key) and msg[key].strip().upper() != "UNKNOWN":
            if found := _values([msg[key]], f"PKG-INFO:{key}"):
                return found
    return _classifiers(msg.get_all("Classifier") or [], "PKG-INFO:Classifier")


def _cargo(text: str) -> Detection | None:
    lic = tomllib.loads(text).get("package", {}).get("license")
    return _values([lic], "Cargo.toml:license") if isinstance(lic, str) else None


_GEM = re.compile(r"\.licen[cs]es?\s*=\s*(\[[^\]]*\]|%w[\[(][^\])]*[\])]|\"[^\"]*\"|'[^']*')")


def _gemspec(text: str) -> Detection | None:
    m = _GEM.search(text)
    if not m:
        return None
    raw = m.group(1)
    items = re.findall(r"[\"']([^\"']+)[\"']", raw) if not raw.startswith("%w") else raw[3:-1].split()
    return _values(items, "gemspec:licenses")


_PARSERS: dict[str, Callable[[str], Detection | None]] = {
    "package.json": _package_json,
    "pyproject.toml": _pyproject,
    "setup.cfg": _setup_cfg,
    "PKG-INFO": _pkg_info,
    "METADATA": _pkg_info,
    "Cargo.toml": _cargo,
}


def is_metadata_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return name in _PARSERS or name.endswith(".gemspec")


def detect_metadata(path: str, text: str) -> Detection | None:
    """Declared licence of one metadata file, or None (not metadata, none declared, or
    malformed: a broken manifest must not stop a crawl)."""
    name = PurePosixPath(path).name
    parser = _gemspec if name.endswith(".gemspec") else _PARSERS.get(name)
    if parser is None:
        return None
    try:
        return parser(text)
    except (ValueError, tomllib.TOMLDecodeError, configparser.Error):
        return None
