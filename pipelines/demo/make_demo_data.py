"""Write the demo pipeline's sample inputs (deterministic; the output is committed).

The sentences below were written for this project. Documents are random (seeded)
selections of them, plus planted problems so every stage has work: exact and
near-exact duplicates, documents too short to keep, documents in other languages,
a malformed JSON line and a record without text.

    python pipelines/demo/make_demo_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ZH = [
    "城市的早晨总是从一杯热豆浆和一根油条开始。", "地铁站里的人们低头看着手机，匆匆走向各自的目的地。",
    "图书馆在周末开放到晚上九点，很多学生在这里复习功课。", "这座古镇保留了明清时期的街道和建筑风格。",
    "春天来临的时候，山坡上的桃花和油菜花连成一片。", "研究人员发现，规律的睡眠有助于提高记忆力。",
    "新能源汽车的销量在过去五年里增长了好几倍。", "老师鼓励学生们多读书、多思考、多提问。",
    "这家餐馆的招牌菜是红烧肉和清蒸鲈鱼。", "天气预报说明天会有小雨，出门记得带伞。",
    "博物馆正在举办一场关于丝绸之路的展览。", "程序员们正在讨论如何提高系统的稳定性。",
    "农民们趁着晴天把稻谷晒在院子里。", "这本小说讲述了一个普通家庭三代人的故事。",
    "公园里有人在打太极拳，也有人在跳广场舞。", "科学家们用望远镜观测到了一颗新的彗星。",
    "高铁把两座城市之间的旅行时间缩短到了两个小时。", "孩子们在操场上踢足球，笑声传得很远。",
    "这项政策的目的是减轻中小企业的负担。", "他每天坚持跑步五公里，已经坚持了三年。",
    "茶叶的品质与产地的气候和土壤关系密切。", "志愿者们在社区里帮助老人学习使用智能手机。",
    "这座桥建于二十世纪五十年代，至今仍在使用。", "数据显示，今年的粮食产量比去年略有增加。",
    "音乐会结束后，观众们起立鼓掌了很久。", "学习一门外语需要耐心，也需要大量的练习。",
    "夜市上有各种各样的小吃，吸引了很多游客。", "医生建议人们少吃油炸食品，多吃蔬菜水果。",
    "这条河流经过三个省份，最后汇入大海。", "工厂引进了新的生产线，效率提高了百分之二十。",
]
EN = [
    "The morning train was late again, so most passengers read the news on their phones.",
    "A good dataset is one where every document can be traced back to its source.",
    "The museum opened a new wing dedicated to the history of printing.",
    "Researchers found that short walks after meals help regulate blood sugar.",
    "The city council voted to extend the bicycle lanes along the river.",
    "Compilers translate source code into instructions a processor can execute.",
    "Heavy rain is expected across the region for the rest of the week.",
    "The library offers free workshops on writing résumés and cover letters.",
    "Farmers planted the wheat early this year because of the mild winter.",
    "The novel follows three generations of a family living by the sea.",
    "Engineers tested the bridge with trucks loaded to twice the expected weight.",
    "Volunteers cleaned the beach and collected more than two hundred kilograms of plastic.",
    "The orchestra rehearsed the symphony for six weeks before the premiere.",
    "Astronomers observed a comet that will not return for another four thousand years.",
    "Learning a second language takes patience and a great deal of practice.",
    "The bakery on the corner sells out of bread by nine in the morning.",
    "A well-designed experiment controls for every variable except the one under study.",
    "The new policy aims to reduce paperwork for small businesses.",
    "Children played football in the park until the street lights came on.",
    "The database index cut the query time from minutes to milliseconds.",
    "Tea from the high mountains is prized for its delicate aroma.",
    "The hospital installed solar panels that cover a third of its electricity needs.",
    "Historians disagree about the exact date the old castle was built.",
    "The team shipped the release after fixing the last failing test.",
    "Migrating birds stop at the wetlands to rest and feed each spring.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Public transport ridership rose sharply after fares were reduced.",
    "A careful editor reads every sentence at least twice.",
    "The river floods every few years, so the houses are built on stilts.",
    "Open data lets anyone check the numbers behind a published study.",
]
FOOTERS = {
    "en": ("Text is available under the Creative Commons Attribution-ShareAlike 4.0 License.",
           "This article is licensed under CC BY-NC 4.0."),
    "zh": ("本站文字内容遵循知识共享 署名-相同方式共享 4.0 协议。", "本文采用 CC BY-NC 4.0 许可协议。"),
}
JUNK = {  # what the quality stage is for
    "en": ["Buy cheap watches now! Best price guaranteed!\n" * 25,
           "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
           "et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris."],
    "zh": ["点击这里免费领取大奖！立即注册，马上领取！\n" * 25,
           "首页 | 新闻 | 体育 | 娱乐 | 财经 | 科技 | 汽车 | 房产 | 游戏 | 教育 | 健康 | 旅游 | 时尚 | 登录 | 注册"],
}
CONTACT = {
    "en": "Questions? Write to jane.doe@example.org or call +1 415 555 0134.",
    "zh": "如有疑问，请发邮件至 zhang.wei@example.cn 或致电 138 0013 8000。",
}
OTHER_LANGUAGE = [
    "Le marché du samedi attire les habitants de tout le quartier, qui viennent acheter des légumes frais.",
    "Die Bibliothek bleibt während der Ferien geöffnet, aber nur am Vormittag.",
    "今日は朝から雨が降っていたので、私たちは家で映画を見ることにしました。",
    "El museo abrirá una nueva sala dedicada a la historia de la navegación en el siglo dieciséis.",
]


def documents(pool: list[str], n: int, joiner: str, rng: random.Random) -> list[str]:
    docs = []
    for _ in range(n):
        sentences = rng.sample(pool, rng.randint(6, 12))  # no sentence twice in one document
        cuts = sorted(rng.sample(range(1, len(sentences)), rng.randint(0, 2)))
        paragraphs = [sentences[a:b] for a, b in zip([0, *cuts], [*cuts, len(sentences)])]
        docs.append("\n\n".join(joiner.join(p) for p in paragraphs))
    return docs


def main() -> None:
    rng = random.Random(20261121)
    out = Path(__file__).parent / "data"
    out.mkdir(exist_ok=True)
    for name, pool, joiner, host in (("zh", ZH, "", "example.cn"), ("en", EN, " ", "example.com")):
        docs = documents(pool, 160, joiner, rng)
        # License notices, as page footers carry them: CC BY-SA on some pages, one non-commercial page.
        sa, nc = FOOTERS[name]
        docs = [d + "\n\n" + sa if i % 4 == 0 else d for i, d in enumerate(docs)]
        docs[9] += "\n\n" + nc
        rows = [{"text": t, "url": f"https://{host}/articles/{i}"} for i, t in enumerate(docs)]
        rows += [{"text": docs[3], "url": f"https://mirror.{host}/copy/3"},  # exact copy
                 {"text": "  " + docs[7].replace("\n\n", "\n \n") + "  ", "url": f"https://{host}/repost/7"},
                 {"text": docs[11].upper() if name == "en" else docs[11], "url": f"https://{host}/dup/11"},
                 # near-duplicates: a sentence added, a paragraph break moved (for the minhash stage)
                 {"text": docs[20] + joiner + pool[0], "url": f"https://{host}/near/20"},
                 {"text": docs[25].replace("\n\n", joiner, 1) + joiner + pool[1], "url": f"https://{host}/near/25"},
                 {"text": "OK", "url": f"https://{host}/short"},  # too short
                 {"text": "404 页面不存在" if name == "zh" else "404 Not Found", "url": f"https://{host}/404"}]
        rows += [{"text": t, "url": f"https://{host}/intl/{i}"} for i, t in enumerate(OTHER_LANGUAGE)]
        rows += [{"text": t, "url": f"https://{host}/junk/{i}"} for i, t in enumerate(JUNK[name])]
        contact = CONTACT[name]  # personal data the pii stage replaces
        rows.append({"text": docs[30] + "\n\n" + contact, "url": f"https://{host}/contact"})
        rng.shuffle(rows)
        lines = [json.dumps(r, ensure_ascii=False) for r in rows]
        lines.insert(17, '{"text": "this line is broken JSON", "url": ')  # malformed record
        lines.insert(42, json.dumps({"url": f"https://{host}/no-text"}))  # record without text
        half = len(lines) // 2
        for part, chunk in enumerate((lines[:half], lines[half:])):
            (out / f"web_{name}-{part}.jsonl").write_text("\n".join(chunk) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
