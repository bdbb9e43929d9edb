"""A corpus with planted shared boilerplate: real zh/en articles, some wrapped in a site template.

Each templated page gets its site's navigation bar and cookie banner on top, a "related / share"
line inside the article, and a footer below, in Chinese for zh sites and English for en sites.
Like real templates they vary in digits (years, counts of the same width), spacing and
full-width punctuation from page to page. Every line is labelled template or article, so a
test or bench can score what boilerplate removal took: the share of template lines removed
and the share of article characters kept.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

SITES: dict[str, dict[str, list[str]]] = {
    "zh_news": {
        "top": [
            "首页 | 新闻 | 财经 | 科技 | 体育 | 娱乐 | 登录 | 注册",
            "本网站使用Cookie来改善您的浏览体验，继续浏览即表示您同意我们使用Cookie。 [接受] [了解更多]",
        ],
        "mid": ["相关阅读：更多精彩内容请关注我们的微信公众号"],
        "bottom": [
            "版权所有 © {year} 新华日报社 保留所有权利",
            "京ICP备{d8}号 | 联系我们 | 广告服务 | 网站地图",
            "违法和不良信息举报电话：010-{d8}",
        ],
    },
    "zh_forum": {
        "top": ["返回首页 > 技术论坛 > 讨论区", "您还没有登录，请先 登录 或 注册"],
        "mid": ["分享到：微博 微信 QQ空间"],
        "bottom": ["Powered by Discuz! X3.{d1} © 2001-{year} Comsenz Inc.", "手机版 | 小黑屋 | 联系我们"],
    },
    "zh_blog": {
        "top": ["博客首页   文章归档   关于我"],
        "mid": ["【广告】点击这里领取新用户专享优惠券"],
        "bottom": ["本文由作者授权发布，转载请注明出处。", "上一篇：无 | 下一篇：无", "阅读({d3}) 评论({d2})"],
    },
    "en_news": {
        "top": [
            "Home | World | Business | Tech | Sports | Sign in",
            "We use cookies to improve your experience. By continuing you agree to our Cookie Policy. Accept",
        ],
        "mid": ["Read more: Subscribe to our newsletter for the latest stories"],
        "bottom": [
            "© {year} Daily Herald Media Group. All rights reserved.",
            "Privacy Policy | Terms of Use | Contact Us | Advertise",
        ],
    },
    "en_shop": {
        "top": ["Skip to main content", "Free shipping on orders over $50 | Shop now"],
        "mid": ["Share this: Facebook Twitter Pinterest Email"],
        "bottom": ["Copyright {year} Acme Stores Inc. | Sitemap", "Follow us on Instagram, Facebook and YouTube"],
    },
    "en_blog": {
        "top": ["Menu   Home   About   Archive   Contact"],
        "mid": ["Posted in Uncategorized | Tagged news, updates | {d2} Comments"],
        "bottom": ["Proudly powered by WordPress | Theme: Twenty {year}", "Back to top ↑"],
    },
}
_FULL = str.maketrans({"|": "｜", ":": "：", ",": "，", "(": "（", ")": "）"})


@dataclass
class PlantedDoc:
    lang: str
    site: str | None
    lines: list[tuple[str, bool]]  # (line, is_template)

    @property
    def text(self) -> str:
        return "\n".join(line for line, _ in self.lines)


def _fill(line: str, rng: random.Random) -> str:
    line = line.format(
        year=rng.randint(2001, 2024),
        d1=rng.randint(1, 9),
        d2=rng.randint(10, 99),
        d3=rng.randint(100, 999),
        d8=rng.randint(10_000_000, 99_999_999),
    )
    r = rng.random()
    if r < 0.15:
        line = line.translate(_FULL)  # a page served with full-width punctuation
    elif r < 0.3:
        line = "  " + line.replace(" ", "  ") + " "  # another CMS version, other spacing
    return line


def _articles(path: Path, n: int, min_chars: int, max_chars: int, rng: random.Random) -> list[str]:
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    texts = [t for t in texts if len(t) >= min_chars]
    rng.shuffle(texts)
    out = []
    for t in texts[:n]:
        cut = t[:max_chars]
        out.append(cut[: cut.rfind("\n")] if len(t) > max_chars and "\n" in cut else cut)
    return out


def build(corpus: Path, n_per_lang: int = 300, share: float = 0.5, seed: int = 0) -> list[PlantedDoc]:
    """n_per_lang real articles per language, ``share`` of them templated by one of that language's sites."""
    rng = random.Random(seed)
    docs: list[PlantedDoc] = []
    for lang, name in (("zh", "zh_wikipedia.jsonl"), ("en", "en_wikipedia.jsonl")):
        sites = [s for s in SITES if s.startswith(lang)]
        for i, article in enumerate(_articles(corpus / name, n_per_lang, 200, 3000, rng)):
            body = [(line, False) for line in article.split("\n")]
            if rng.random() >= share:
                docs.append(PlantedDoc(lang, None, body))
                continue
            site = sites[i % len(sites)]
            t = SITES[site]
            mid = [(_fill(x, rng), True) for x in t["mid"]]
            at = rng.randint(1, max(1, len(body) - 1))
            lines = (
                [(_fill(x, rng), True) for x in t["top"]]
                + body[:at]
                + mid
                + body[at:]
                + [(_fill(x, rng), True) for x in t["bottom"]]
            )
            docs.append(PlantedDoc(lang, site, lines))
    rng.shuffle(docs)
    return docs


def score(docs: list[PlantedDoc], outputs: list[str | None]) -> dict[str, float]:
    """Template lines removed and article characters kept; ``None`` output = document dropped.

    The output of line removal is a subsequence of the input's lines: a greedy match tells which
    lines survived."""
    tpl_total = tpl_removed = art_total = art_kept = 0
    for doc, out in zip(docs, outputs):
        kept_lines = out.split("\n") if out is not None else []
        j = 0
        for line, is_tpl in doc.lines:
            survived = j < len(kept_lines) and kept_lines[j] == line
            j += survived
            if is_tpl:
                tpl_total += 1
                tpl_removed += not survived
            else:
                art_total += len(line)
                art_kept += len(line) if survived else 0
    return {
        "template_lines": tpl_total,
        "template_removed": tpl_removed / max(tpl_total, 1),
        "article_chars": art_total,
        "article_kept": art_kept / max(art_total, 1),
    }
