"""Licence identification on held-out real packages: right / unknown / wrong per repository and file.

Layouts datapipe was never tuned on: source packages from the registries, with the registry's
declared licence as the reference (npm: package.json ``license``; PyPI: ``License-Expression``, else
the licence classifiers, else a ``License`` field that is an SPDX id), checked by hand where they
disagree with the files (``HAND_CHECKED`` below, with the reason). Fetch them first (not committed):

    mkdir -p /tmp/license-heldout/npm /tmp/license-heldout/pypi
    cd /tmp/license-heldout/npm && for p in $(python BENCH --names npm); do npm pack --silent "$p"; done
    cd /tmp/license-heldout/pypi && for p in $(python BENCH --names pypi); do
        pip download --no-deps --no-binary :all: --no-build-isolation -d . "$p"; done

(BENCH: this script's path; the names are ``NPM`` and ``PYPI`` below, the packages of the reported numbers; pip's
``--no-build-isolation`` needs setuptools, hatchling, flit_core, poetry-core, pdm-backend and
setuptools_scm in the environment, or drop it and wait longer).

    python -m bench.quality.license_heldout [--root /tmp/license-heldout] [--show wrong|unknown|all]
    python -m bench.quality.license_heldout --debian /usr/share/doc     # no download needed

``--debian``: the licence paragraphs of a Debian system's machine-readable copyright files
(``/usr/share/doc/*/copyright``, DEP-5): each ``License: <short name>`` paragraph holding text is
one answer, its short name (GPL-2+, Expat, BSD-3-clause, ...) the reference, texts counted once.
Notices and texts packagers copied from thousands of upstreams, never tuned on; where the label
disagrees with the text (``DEBIAN_HAND_CHECKED``, with the reason), the text wins.

Repositories: the files the repository reader keeps (root licence files, LICENSES/, README licence
section; package metadata only with ``--with-metadata``, since the reference comes from it) go
through ``detect_repository``. Files: every source file whose header gives a licence
(``detect_header``) is compared with the package's reference; a header that differs is counted
``differs`` and listed (vendored code legitimately does), since the registry says nothing per file.
Scoring as tests/support/license_layouts.py: licence families (GPL-2.0 = GPL-2.0-only =
GPL-2.0-or-later), any of a reference's accepted readings.
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import zipfile
from collections import Counter
from email.parser import HeaderParser
from pathlib import Path

from datapipe.license import detect_header, detect_repository, detect_text
from datapipe.license.expression import normalize
from datapipe.license.metadata import is_metadata_file
from datapipe.license.readme import is_readme, license_section
from datapipe.readers.code_repos import is_repo_meta_file
from tests.support.license_layouts import families

NPM = (
    "lodash express react chalk debug commander yargs axios moment underscore async request uuid minimist glob semver "
    "rimraf mkdirp inherits once lru-cache ws body-parser cookie qs source-map esprima estraverse escodegen uglify-js "
    "terser rxjs tslib dompurify node-forge jszip pako caniuse-lite spdx-exceptions spdx-license-ids argparse sprintf-js "
    "highlight.js handlebars three d3 leaflet ol protobufjs long google-protobuf bn.js elliptic tweetnacl big-integer "
    "json-schema sax jackspeak path-scurry mysql pg node-gyp npm readable-stream graceful-fs ajv prettier rollup vue "
    "svelte jquery bootstrap font-awesome @fortawesome/fontawesome-free mongodb @grpc/grpc-js eventemitter3 "
    "hoist-non-react-statics prop-types regenerator-runtime core-js jsbn hammerjs node-fetch cross-spawn which shelljs "
    "json5 yaml js-yaml markdown-it marked showdown codemirror chart.js socket.io mqtt ioredis redis cheerio mocha chai "
    "sinon istanbul nyc c8 gl-matrix immutable mobx redux ramda xregexp punycode emoji-regex hls.js video.js "
    "libphonenumber-js lz-string fflate pdfkit exceljs jspdf konva openpgp sjcl crypto-js log4js winston pino bunyan "
    "mathjs node-red gun @ckeditor/ckeditor5-core tinymce ffmpeg-static jsxgraph sql.js pdf-lib jquery-ui select2 "
    "summernote swiper gsap katex mermaid libsodium-wrappers bcryptjs ua-parser-js atob cldr-core wicked-good-xpath"
).split()
PYPI = (
    "requests flask click jinja2 markupsafe werkzeug itsdangerous six attrs pyyaml chardet certifi idna urllib3 "
    "python-dateutil pytz packaging toml tomli typing-extensions mypy-extensions docutils pygments babel pycparser "
    "paramiko pymysql sqlalchemy alembic mako beautifulsoup4 html5lib bleach markdown mistune nltk networkx mpmath tqdm "
    "rich colorama termcolor tabulate docopt pexpect ptyprocess pyparsing decorator cachetools simplejson pyasn1 rsa "
    "ecdsa pyjwt oauthlib requests-oauthlib httplib2 httpx h11 anyio sniffio trio outcome jsonschema marshmallow "
    "starlette uvicorn gunicorn eventlet celery kombu redis pymongo pyserial scapy fabric invoke pylint astroid flake8 "
    "pycodestyle pyflakes autopep8 yapf isort mccabe pluggy coverage mock hypothesis tox virtualenv sh netaddr "
    "dnspython python-gnupg pypdf xlrd openpyxl xlsxwriter python-docx feedparser bottle tornado cherrypy mutagen urwid "
    "blessed prompt_toolkit jedi parso yt-dlp rdiff-backup pyxdg python-xlib zope.interface astor gitpython smmap "
    "pyelftools pefile capstone fonttools reportlab chameleon pycairo"
).split()

# PyPI licence classifiers -> the SPDX ids they may mean (a classifier is often vaguer than an id).
CLASSIFIERS = {
    "MIT License": ["MIT"],
    "MIT No Attribution License (MIT-0)": ["MIT-0"],
    "Apache Software License": ["Apache-2.0"],
    "BSD License": ["BSD-2-Clause", "BSD-3-Clause"],
    "ISC License (ISCL)": ["ISC"],
    "Mozilla Public License 2.0 (MPL 2.0)": ["MPL-2.0"],
    "Python Software Foundation License": ["PSF-2.0", "Python-2.0"],
    "GNU General Public License v2 (GPLv2)": ["GPL-2.0"],
    "GNU General Public License v2 or later (GPLv2+)": ["GPL-2.0"],
    "GNU General Public License v3 (GPLv3)": ["GPL-3.0"],
    "GNU General Public License v3 or later (GPLv3+)": ["GPL-3.0"],
    "GNU Lesser General Public License v2 (LGPLv2)": ["LGPL-2.0", "LGPL-2.1"],
    "GNU Lesser General Public License v2 or later (LGPLv2+)": ["LGPL-2.0", "LGPL-2.1"],
    "GNU Lesser General Public License v3 (LGPLv3)": ["LGPL-3.0"],
    "GNU Lesser General Public License v3 or later (LGPLv3+)": ["LGPL-3.0"],
    "GNU Library or Lesser General Public License (LGPL)": ["LGPL-2.0", "LGPL-2.1", "LGPL-3.0"],
    "GNU Affero General Public License v3": ["AGPL-3.0"],
    "GNU Affero General Public License v3 or later (AGPLv3+)": ["AGPL-3.0"],
    "Zope Public License": ["ZPL-2.1"],
    "The Unlicense (Unlicense)": ["Unlicense"],
    "Historical Permission Notice and Disclaimer (HPND)": ["HPND"],
}

# Where the registry's licence and the files disagree, read by hand: package -> (accepted readings, why).
# The readings are what the package's licence files say; where they name more than the registry, the
# extra licences are of code the package ships (bundled, ported or data), so naming them is right.
HAND_CHECKED: dict[str, tuple[list[str], str]] = {
    "libphonenumber-js": (["MIT AND Apache-2.0"], "LICENSE (MIT) and LICENSE.Apache (Google's metadata) are both shipped"),
    "marked": (["MIT AND BSD-3-Clause"], "LICENSE.md: marked under MIT, the Markdown code it derives from under BSD-3"),
    "rollup": (["MIT AND ISC AND 0BSD"], "LICENSE.md: rollup under MIT, then the licences of its bundled dependencies"),
    "pako": (["MIT", "MIT AND Zlib"], "the only licence file is MIT; Zlib is stated in the ported files' own headers"),
    "fonttools": (["MIT AND Apache-2.0 AND BSD-3-Clause AND OFL-1.1"], "LICENSE (MIT) + LICENSE.external (bundled code)"),
    "python_dateutil": (["BSD-3-Clause AND Apache-2.0"], "LICENSE: BSD-3 for contributions before 2017-12, Apache-2.0 after"),
    "requests-oauthlib": (["ISC"], "LICENSE is the ISC licence; the 'BSD License' classifier is the registry's error"),
    "docutils": (
        ["BSD-2-Clause AND 0BSD AND GPL-3.0"],
        "licenses/ ships BSD-0-Clause, BSD-2-Clause and gpl-3-0 texts for its parts",
    ),
    "typing_extensions": (["PSF-2.0", "Python-2.0"], "LICENSE is Python's: PSF-2.0 with its history (0BSD is for Python's docs)"),
    "argparse": (["PSF-2.0", "Python-2.0"], "LICENSE is Python's licence, PSF-2.0 with its history"),
    "parso": (["MIT AND PSF-2.0"], "LICENSE.txt: MIT, and PSF-2.0 (text included) for files taken from the standard library"),
}

# Debian short licence names (DEP-5 section "License specification") -> SPDX.
DEBIAN_NAMES = {
    "expat": "MIT",
    "mit": "MIT",
    "apache-2.0": "Apache-2.0",
    "isc": "ISC",
    "zlib": "Zlib",
    "cc0-1.0": "CC0-1.0",
    "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "bsd-4-clause": "BSD-4-Clause",
    "mpl-2.0": "MPL-2.0",
    "bsl-1.0": "BSL-1.0",
    "unlicense": "Unlicense",
    "wtfpl": "WTFPL",
    "0bsd": "0BSD",
}
# Where a label disagrees with its paragraph's own text (read by hand): (label, words of the
# paragraph) -> (what the text says, why; the package it was seen in). The text wins.
DEBIAN_HAND_CHECKED: dict[tuple[str, str], tuple[str, str]] = {
    ("BSD-4-Clause", "origin of this software"): ("bzip2-1.0.6", "cmake-data: bzip2's clauses, no advertising clause"),
    ("LGPL-2.1+", "Library General Public License version 2"): ("LGPL-2.0-or-later", "heaptrack: LGPL v2 or later"),
    ("LGPL-2+", "either version 2.1 of the License"): ("LGPL-2.1-or-later", "libacl1: LGPL v2.1 or later"),
    ("Expat", "Permission to use, copy, modify, and distribute"): ("ISC", "libarchive13: the ISC text"),
    ("LGPL-3+", "GNU General Public License as published"): ("GPL-3.0-or-later", "libde265-0: the GPL v3+ notice"),
    ("Expat", "Neither the name of Intel"): ("BSD-3-Clause", "libipt2: the BSD-3-Clause text"),
    ("LGPL-2.1+", "either\nversion 2 of the License"): ("LGPL-2.0-or-later", "libisl23: LGPL v2 or later"),
    ("LGPL-2.1+", "GNU General Public License as published"): ("GPL-3.0-or-later", "gir1.2-handy-1: the GPL v3+ notice"),
    ("GPL-3+", "either version 2, or"): ("GPL-2.0-or-later", "libio-html-perl: GPL v2 or later; v3 is the Debian path"),
}


def _debian_spdx(name: str) -> str | None:
    """A DEP-5 licence name (``GPL-2+ or Artistic``) as SPDX, or None when a part has no SPDX id here."""
    parts = re.split(r"\s+(or|and)\s+", name.strip().lower())
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part.upper())
            continue
        part = part.strip()
        if (m := re.fullmatch(r"(a?gpl|lgpl)-?v?(\d(?:\.\d)?)(\+)?", part)) is not None:
            version = m.group(2) if "." in m.group(2) else m.group(2) + ".0"
            out.append(f"{m.group(1).upper()}-{version}-{'or-later' if m.group(3) else 'only'}")
        elif part in DEBIAN_NAMES:
            out.append(DEBIAN_NAMES[part])
        else:
            return None
    return " ".join(out)


def evaluate_debian(doc: Path) -> list[tuple[str, str, list[str], str]]:
    """(package, our answer, accepted readings, verdict) per distinct licence paragraph text."""
    seen: dict[str, tuple[str, str]] = {}
    for path in sorted(doc.glob("*/copyright")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "Format:" not in text[:300]:
            continue  # not machine-readable: no reliable label per paragraph
        for para in re.split(r"\n\s*\n", text):
            m = re.search(r"^License:[ \t]*([^\n]*)\n((?:[ \t][^\n]*\n?)+)", para, re.M)
            if m is None:
                continue
            body = "\n".join("" if ln.strip() == "." else ln[1:] for ln in m.group(2).splitlines())
            if _debian_spdx(m.group(1)) is not None:  # the first label with an SPDX reading
                seen.setdefault(body, (path.parent.name, m.group(1).strip()))
    rows = []
    for body, (pkg, label) in seen.items():
        readings = [str(_debian_spdx(label))]
        for (lab, words), (reading, _why) in DEBIAN_HAND_CHECKED.items():
            if lab == label and words in body:
                readings = [reading]
        got = detect_text(body).license
        rows.append((f"{pkg} ({label})", got, readings, _match(readings, got)))
    return rows


SOURCE_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts", ".c", ".h")
HEADER_CHARS = 8_000


def _members(path: Path) -> list[tuple[str, bytes]]:
    """(path inside the package with its top folder removed, bytes) of every regular file."""
    out = []
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.is_dir() and info.file_size < 4 << 20:
                    out.append((info.filename, z.read(info)))
    else:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile() and m.size < 4 << 20 and (f := t.extractfile(m)) is not None:
                    out.append((m.name, f.read()))
    return [(n.split("/", 1)[1], b) for n, b in out if "/" in n]


def _text(data: bytes) -> str:
    return data[: 64 << 10].decode("utf-8", "replace")


def _pypi_reference(files: dict[str, str]) -> list[str] | None:
    """Accepted readings of PKG-INFO's licence: License-Expression, classifiers, an SPDX License field."""
    if "PKG-INFO" not in files:
        return None
    msg = HeaderParser().parsestr(files["PKG-INFO"])
    if (expr := msg.get("License-Expression")) and normalize(expr) != "unknown":
        return [normalize(expr)]
    readings: list[list[str]] = []
    for c in msg.get_all("Classifier") or []:
        name = c.rsplit("::", 1)[-1].strip()
        if c.startswith("License ::") and name in CLASSIFIERS:
            readings.append(CLASSIFIERS[name])
    if readings:
        if len(readings) == 1:
            return readings[0]
        return [" OR ".join(r[0] for r in readings)]  # several classifiers: the project's choices
    lic = (msg.get("License") or "").strip()
    if lic and "\n" not in lic and normalize(lic) != "unknown" and all(c.isalnum() or c in ".-+ ()" for c in lic):
        return [normalize(lic)]
    return None


def _npm_reference(files: dict[str, str]) -> list[str] | None:
    try:
        data = json.loads(files.get("package.json", ""))
    except ValueError:
        return None
    lic = data.get("license")
    if isinstance(lic, dict):
        lic = lic.get("type")
    if isinstance(lic, str) and normalize(lic) != "unknown" and not lic.upper().startswith("SEE "):
        return [normalize(lic)]
    return None


def _match(readings: list[str], got: str) -> str:
    have = families(got)[0]
    if not have:
        return "unknown"
    return "right" if any(families(r)[0] == have for r in readings) else "wrong"


def evaluate(
    root: Path, with_metadata: bool, raw_registry: bool = False
) -> tuple[list[tuple[str, str, list[str], str]], list[tuple[str, str, str, str]]]:
    repos, headers = [], []
    for pkg in sorted([*root.glob("npm/*.tgz"), *root.glob("pypi/*.tar.gz"), *root.glob("pypi/*.zip")]):
        try:
            members = _members(pkg)
        except (tarfile.TarError, zipfile.BadZipFile, OSError):
            continue
        name = re.sub(r"-\d[\w.]*(\.tar\.gz|\.tgz|\.zip)$", "", pkg.name)
        meta = {p: _text(b) for p, b in members if p in ("package.json", "PKG-INFO")}
        readings = _npm_reference(meta) if pkg.suffix == ".tgz" else _pypi_reference(meta)
        if name in HAND_CHECKED and not raw_registry:
            readings = HAND_CHECKED[name][0]
        if not readings:
            continue  # no usable reference: not counted
        files = {}
        for p, b in members:
            if not is_repo_meta_file(p) or (is_metadata_file(p) and not with_metadata):
                continue
            text = _text(b)
            if is_readme(p):
                if (section := license_section(text)) is None:
                    continue
                text = section
            files[p] = text
        got = detect_repository(files).license
        repos.append((name, got, readings, _match(readings, got)))
        for p, b in members:
            if p.endswith(SOURCE_SUFFIXES) and "/" in p and (head := detect_header(_text(b[:HEADER_CHARS]))) is not None:
                verdict = _match(readings, head.license)
                headers.append((name, p, head.license, "agrees" if verdict == "right" else "differs"))
    return repos, headers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/license-heldout"))
    ap.add_argument("--with-metadata", action="store_true", help="also give detect_repository the package metadata")
    ap.add_argument("--registry-only", action="store_true", help="the registry's licence as the reference, no hand checks")
    ap.add_argument("--show", choices=("wrong", "unknown", "all", "none"), default="wrong")
    ap.add_argument("--names", choices=("npm", "pypi"), help="print the package names to fetch, one a line, and stop")
    ap.add_argument("--debian", type=Path, metavar="DOC", help="score the DEP-5 licence paragraphs under DOC (/usr/share/doc)")
    args = ap.parse_args()
    if args.debian:
        rows = evaluate_debian(args.debian)
        counts = Counter(v for *_, v in rows)
        for name, got, readings, verdict in rows:
            if args.show == "all" or verdict == args.show:
                print(f"  {verdict:7s} {name}: got {got!r}, label {readings}")
        n = len(rows)
        print(
            f"Debian licence paragraphs: n={n}  right {counts['right']}  unknown {counts['unknown']}  "
            f"wrong {counts['wrong']} ({counts['wrong'] / max(n, 1):.1%})"
        )
        return
    if args.names:
        print("\n".join(NPM if args.names == "npm" else PYPI))
        return
    repos, headers = evaluate(args.root, args.with_metadata, args.registry_only)
    counts = Counter(v for *_, v in repos)
    n = len(repos)
    for name, got, readings, verdict in repos:
        if args.show == "all" or verdict == args.show:
            print(f"  {verdict:7s} {name}: got {got!r}, registry {readings}")
    print(
        f"repositories ({'with' if args.with_metadata else 'without'} metadata"
        f"{', registry only' if args.registry_only else ', hand-checked'}): n={n}  right {counts['right']}  "
        f"unknown {counts['unknown']}  wrong {counts['wrong']} ({counts['wrong'] / max(n, 1):.1%})"
    )
    hc = Counter(v for *_, v in headers)
    for name, path, got, verdict in headers:
        if verdict == "differs" and args.show != "none":
            print(f"  header differs {name}/{path}: {got}")
    print(f"file headers with a licence: n={len(headers)}  agree with the package {hc['agrees']}  differ {hc['differs']}")


if __name__ == "__main__":
    main()
