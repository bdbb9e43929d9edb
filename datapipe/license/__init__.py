"""Licence detection and licence policy for datapipe documents.

Web pages: detect_web(html_or_text).  Code: detect_repository(files) once per repository,
then detect_code_file(text, repo) per file (SPDX lines / header notices override).
Papers: detect_arxiv(license_url).  Policy.from_config(cfg).apply(kind, docs, detections)
tags documents and splits kept / dropped.  Optional accurate path: datapipe.license.scancode.
"""

from datapipe.license.arxiv import detect_arxiv
from datapipe.license.code_repos import (
    detect_code_batch,
    detect_code_file,
    detect_header,
    detect_repository,
    detect_text,
    spdx_identifiers,
)
from datapipe.license.detection import Detection
from datapipe.license.expression import combine, expression_classes
from datapipe.license.metadata import detect_metadata
from datapipe.license.policy import Policy, Rule
from datapipe.license.spdx import CLASSES, UNKNOWN
from datapipe.license.web import detect_hints, detect_web, detect_web_batch

__all__ = [
    "CLASSES",
    "UNKNOWN",
    "Detection",
    "Policy",
    "Rule",
    "combine",
    "detect_arxiv",
    "detect_code_batch",
    "detect_code_file",
    "detect_header",
    "detect_metadata",
    "detect_hints",
    "detect_repository",
    "detect_text",
    "detect_web",
    "detect_web_batch",
    "expression_classes",
    "spdx_identifiers",
]
