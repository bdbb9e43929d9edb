"""arXiv licence URLs and the allow/deny policy."""

from __future__ import annotations

import pytest
import yaml

from datapipe.license import Detection, Policy, detect_arxiv, detect_web


@pytest.mark.parametrize(
    "url, want, cls",
    [
        ("http://creativecommons.org/licenses/by/4.0/", "CC-BY-4.0", "permissive"),
        ("http://creativecommons.org/licenses/by-sa/4.0/", "CC-BY-SA-4.0", "weak_copyleft"),
        ("http://creativecommons.org/licenses/by-nc-sa/4.0/", "CC-BY-NC-SA-4.0", "non_commercial"),
        ("http://creativecommons.org/licenses/by-nc-nd/4.0/", "CC-BY-NC-ND-4.0", "no_derivatives"),
        ("http://creativecommons.org/licenses/by-nc-sa/3.0/", "CC-BY-NC-SA-3.0", "non_commercial"),
        ("http://creativecommons.org/publicdomain/zero/1.0/", "CC0-1.0", "permissive"),
        ("http://arxiv.org/licenses/nonexclusive-distrib/1.0/", "LicenseRef-arXiv-nonexclusive-distrib-1.0", "restricted"),
        ("http://arxiv.org/licenses/assumed-1991-2003/", "LicenseRef-arXiv-nonexclusive-distrib-1.0", "restricted"),
        ("https://example.org/my-license", "unknown", "unknown"),
        (None, "unknown", "unknown"),
    ],
)
def test_arxiv(url, want, cls):
    d = detect_arxiv(url)
    assert (d.license, d.license_class, d.where) == (want, cls, "arxiv-metadata")


CONFIG = yaml.safe_load("""
license:
  policy:
    code: {deny: [strong_copyleft, non_commercial, unknown]}
    web: {deny: [non_commercial, no_derivatives]}
    paper: {allow: [permissive, weak_copyleft]}
""")


def test_policy_decisions():
    policy = Policy.from_config(CONFIG["license"])
    assert policy.decide("code", Detection("MIT")) == (True, "")
    assert policy.decide("code", Detection("MIT OR GPL-3.0-only"))[0]  # may choose MIT
    keep, reason = policy.decide("code", Detection("GPL-3.0", "gnu general public license", "file:COPYING"))
    assert not keep and "strong_copyleft" in reason and "file:COPYING" in reason
    assert not policy.decide("code", Detection())[0]  # unknown denied for code
    assert not policy.decide("web", Detection("CC-BY-NC-ND-4.0"))[0]
    assert policy.decide("web", Detection("CC-BY-SA-4.0"))[0]
    assert policy.decide("web", Detection())[0]  # unknown not denied for web
    keep, reason = policy.decide("paper", Detection("LicenseRef-arXiv-nonexclusive-distrib-1.0"))
    assert not keep and "restricted" in reason and "not in allow list" in reason
    assert policy.decide("other-kind", Detection("CC-BY-NC-4.0")) == (True, "")


def test_policy_apply_tags_and_records_drops():
    policy = Policy.from_config(CONFIG["license"])
    docs = [
        {"id": 1, "html": '<link rel="license" href="https://creativecommons.org/licenses/by/4.0/">'},
        {"id": 2, "html": "<p>Licensed under CC BY-NC 4.0</p>"},
        {"id": 3, "html": "<p>no licence</p>"},
    ]
    kept, dropped = policy.apply("web", docs, [detect_web(d["html"]) for d in docs])
    assert [d["id"] for d in kept] == [1, 3]
    assert kept[0]["license"] == "CC-BY-4.0" and kept[0]["license_class"] == "permissive"
    assert kept[0]["license_evidence"].startswith("html:link[rel=license]: creativecommons.org")
    assert kept[1]["license"] == "unknown"
    assert dropped[0]["id"] == 2 and "non_commercial" in dropped[0]["drop_reason"]
    assert "license" not in docs[0]  # inputs untouched


@pytest.mark.parametrize("bad", [{"code": {"deny": ["copyleft"]}}, {"code": {"block": ["unknown"]}}])
def test_policy_rejects_typos(bad):
    with pytest.raises(ValueError):
        Policy.from_config(bad)
