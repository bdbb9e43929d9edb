"""Creative Commons detection on web pages: constructed snippets and a real WARC record."""

from __future__ import annotations

import gzip

import pytest

from datapipe.license import detect_web
from tests.support.shared_data import shared_path


@pytest.mark.parametrize(
    "page, want, where",
    [
        ('<link rel="license" href="https://creativecommons.org/licenses/by-sa/3.0/">', "CC-BY-SA-3.0", "html:link[rel=license]"),
        (
            '<a rel="nofollow license" href="//creativecommons.org/licenses/by-nc-nd/4.0/deed.zh">x</a>',
            "CC-BY-NC-ND-4.0",
            "html:a[rel=license]",
        ),
        ('<a href="http://creativecommons.org/publicdomain/zero/1.0/">CC0</a>', "CC0-1.0", "html:a[href]"),
        ('<img src="https://i.creativecommons.org/l/by/2.5/88x31.png">', "CC-BY-2.5", "html:img[src]"),
        ('<img src="https://licensebuttons.net/l/by-nc/3.0/80x15.png">', "CC-BY-NC-3.0", "html:img[src]"),
        ('<a href="https://creativecommons.org/licenses/by-nd-nc/1.0/">old</a>', "CC-BY-NC-ND-1.0", "html:a[href]"),
        ("<footer>© 2023 Foo. Content licensed under CC BY-NC-SA 4.0.</footer>", "CC-BY-NC-SA-4.0", "text"),
        ("Text is available under the Creative Commons Attribution-ShareAlike License 4.0;", "CC-BY-SA-4.0", "text"),
        (
            "Licensed under a Creative Commons Attribution-NonCommercial-NoDerivatives 4.0 International License.",
            "CC-BY-NC-ND-4.0",
            "text",
        ),
        ("本作品采用<a>知识共享署名-非商业性使用-相同方式共享 4.0 国际许可协议</a>进行许可。", "CC-BY-NC-SA-4.0", "text"),
        ("本站的全部文字在知识共享 署名-相同方式共享 4.0协议之条款下提供", "CC-BY-SA-4.0", "text"),
        ("Content is available under CC BY-SA unless otherwise noted.", "LicenseRef-CC-BY-SA", "text"),
        ("Licensed under CC-BY-SA-4.0.", "CC-BY-SA-4.0", "text"),
        ("This work is licensed under a Creative Commons Attribution-Share Alike 3.0 License.", "CC-BY-SA-3.0", "text"),
        (
            "licensed under the Creative Commons Attribution-Non-Commercial-No Derivative Works 2.5 licence",
            "CC-BY-NC-ND-2.5",
            "text",
        ),
        ("本文采用 創用CC 姓名標示-非商業性-相同方式分享 3.0 授權", "CC-BY-NC-SA-3.0", "text"),
    ],
)
def test_cc_snippets(page, want, where):
    d = detect_web(page)
    assert (d.license, d.where) == (want, where)
    assert d.evidence


@pytest.mark.parametrize(
    "page",
    [
        # A variant word we cannot read follows the match: unknown, never the laxer CC BY.
        "Licensed under Creative Commons Attribution, share-alike terms apply.",
        "© 2020 released under CC BY, non-commercial use only",
    ],
)
def test_never_laxer_than_stated(page):
    assert detect_web(page).license_class != "permissive"


def test_rel_license_outranks_text():
    page = '<p>Photos licensed under CC BY-NC 2.0.</p><link rel="license" href="https://creativecommons.org/licenses/by/4.0/">'
    assert detect_web(page).license == "CC-BY-4.0"


def test_two_licences_at_same_level_are_combined():
    page = (
        '<a href="https://creativecommons.org/licenses/by/4.0/">text</a>'
        '<a href="https://creativecommons.org/licenses/by-nc/4.0/">images</a>'
    )
    d = detect_web(page)
    assert d.license == "CC-BY-4.0 AND CC-BY-NC-4.0"
    assert d.license_class == "non_commercial"


@pytest.mark.parametrize(
    "page",
    [
        "Creative Commons was founded in 2001. Its licenses include CC BY-SA and CC BY-NC.",
        '<a href="https://creativecommons.org/about/">About CC</a>',
        "<p>Copyright 2024 Example Inc. All rights reserved.</p>",
        "",
    ],
)
def test_unknown(page):
    assert detect_web(page).license == "unknown"


def test_real_wikipedia_warc_record():
    raw = gzip.open(shared_path("web", "warc", "whirlwind_whirlwind.warc.gz")).read()
    start = raw.lower().find(b"<!doctype html")
    assert start > 0
    html = raw[start:].decode("utf-8", "replace")
    d = detect_web(html)
    assert d.license == "CC-BY-SA-4.0"
    assert d.where == "html:link[rel=license]"
    assert "creativecommons.org/licenses/by-sa/4.0" in d.evidence
    # The footer alone (no <link rel=license>) gives the same answer from its <a href>.
    footer = html[html.find('id="footer-info-copyright"') :]
    assert detect_web(footer).license == "CC-BY-SA-4.0"
