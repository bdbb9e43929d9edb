"""PII redaction: real PII replaced with typed placeholders and counted; look-alikes untouched."""

from __future__ import annotations

import pyarrow as pa
import pytest

from datapipe.stages.base import StageContext
from datapipe.stages.pii import Pii, PiiOptions, id_card_valid

STAGE = Pii(PiiOptions(), StageContext(".", "."))


def redact(text: str) -> tuple[str, dict[str, int]]:
    return STAGE.redact(text)


@pytest.mark.parametrize(
    "text, placeholder, kind",
    [
        ("联系 zhang.san+news@mail.example.com.cn 获取", "<EMAIL>", "email"),
        ("手机：13812345678。", "<PHONE>", "phone"),
        ("call +86 138-1234-5678 now", "<PHONE>", "phone"),
        ("office +1 (415) 555-2671", "<PHONE>", "phone"),
        ("tel +44 20 7946 0958.", "<PHONE>", "phone"),
        ("身份证号 11010519491231002X 已登记", "<ID_CARD>", "id_card"),
        ("server at 192.168.10.254, port 22", "<IP>", "ip"),
        ("v6 host 2a00:1450:4001:82b::200e up", "<IP>", "ip"),
        ("link-local fe80::1ff:fe23:4567:890a on eth0", "<IP>", "ip"),
        ("Fax: 860-286-0787 - E-Mail", "<PHONE>", "phone"),  # North American numbers (issue 16)
        ("Tel: 1-888-691-8281.", "<PHONE>", "phone"),
        ("call (415) 555-2671 today", "<PHONE>", "phone"),
        ("phone 415.555.2671", "<PHONE>", "phone"),
        ("DNS 8.8.8.8 answered", "<IP>", "ip"),  # small parts, but an address word nearby
        ("ssh tidb@10.0.1.1", "<IP>", "ip"),
        ("Dörte@Sörensen.example.com writes", "<EMAIL>", "email"),
    ],
)
def test_pii_replaced_and_counted(text: str, placeholder: str, kind: str) -> None:
    out, counts = redact(text)
    assert placeholder in out, out
    assert counts[kind] == 1 and sum(counts.values()) == 1, counts


@pytest.mark.parametrize(
    "text",
    [
        "Released version 1.2.3.4 and v2.10.3 today",  # versions, including a 4-part one
        "Python 3.11.7, numpy 2.4.6",
        "会议于2023-01-15 14:30:45举行，12:30开始",  # dates and times
        "售价 ¥12800，$1,299.00 或 €49.99",  # prices
        "订单号 20231015123456789012 已发货",  # an ordinary long number
        "population 13812345678901",  # 14 digits: not a mobile number
        "ID 110105194912310021 has a wrong checksum",  # checksum fails
        "ID 110105194913310023 has month 13",  # impossible birth date
        "ratio 1:2:3 and MAC aa:bb",  # colons that are not IPv6
        "IP-like 999.1.1.1 and 1.2.3 are not addresses",
        "see section 3.1.4.1 of the paper",
        # issue 16: a film title, a Bible reference, loopback/documentation addresses, code
        'He scored Noel Clarke\'s new film "4.3.2.1" with Barnaby Robson.',
        "Gospel of John 1:26.28.48.51; 2:15-16; 11:40-52; 12:25.29.31.35; 17:24-26",
        "访问主机中 http://127.0.0.1:8000 或 0.0.0.0，示例地址 192.0.2.10、198.51.100.7、203.0.113.9",
        "loopback ::1 only, docs use 2001:db8:85a3::8a2e:370:7334",
        "牠们的齿式是：上颚1-3.1.4.2；下颚3.1.4.2-3。",
        "containers-0.6.5.1 and // 17.4.1.2 Headers",
        "INET_ATON('255.255.255.0') and SELECT IS_IPV4_MAPPED(INET6_ATON('::ffff:127.0.0.1'))",
        "通过 A::f(x) 访问，或 B::f()，以及 s[::-1]",
        "git clone git@github.com:OI-wiki/OI-wiki.git",
        "systemctl start user@1000.service",
        "--schema-registry=https://username:password@schema-registry-uri.com",
        "principal alice/for-kafka@example.com",
        "phone: '123-456-7890' is a placeholder; +30 24630 an area code; tail -n +123457",
        '| $13384966760$ | and ["system memory total"=14388137984]',
        "ISBN 978-90-277-2440-3, FR-2010-314-003, years 2019 2018 2017",
    ],
)
def test_lookalikes_untouched(text: str) -> None:
    out, counts = redact(text)
    assert out == text and sum(counts.values()) == 0, (out, counts)


def test_id_card_checksum() -> None:
    assert id_card_valid("11010519491231002X")
    assert id_card_valid("440524188001010014")
    assert not id_card_valid("440524188001010015")


def test_stage_columns_typed_and_text_replaced() -> None:
    batch = pa.table({"id": ["a", "b"], "text": ["mail me: a@b.co, 13912345678", "nothing here 1.2.3"]})
    out = STAGE.compute(batch)
    assert out["text"].to_pylist() == ["mail me: <EMAIL>, <PHONE>", "nothing here 1.2.3"]
    assert out.schema.field("pii_email").type == pa.int32()
    assert out["pii_email"].to_pylist() == [1, 0] and out["pii_phone"].to_pylist() == [1, 0]
    assert out["pii_id_card"].to_pylist() == [0, 0] and out["pii_ip"].to_pylist() == [0, 0]
    assert STAGE.decide(out).reason.null_count == 2  # redaction drops nothing


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Questions? Call +1 415 555 0134.", "Questions? Call <PHONE>."),
        ("The server is at 10.0.0.1.", "The server is at <IP>."),
        ("请致电13800138000。", "请致电<PHONE>。"),
        ("请发邮件至zhang.wei@example.cn。", "请发邮件至<EMAIL>。"),
        ("Pi is 3.14159 and the build is 10.0.0.1.2", "Pi is 3.14159 and the build is 10.0.0.1.2"),
    ],
)
def test_sentence_final_full_stop_does_not_hide_pii(text: str, expected: str) -> None:
    stage = Pii(PiiOptions(), StageContext(".", "."))
    out = stage.compute(pa.table({"text": [text]}))
    assert out["text"][0].as_py() == expected


# Precision/recall floors on the hand-labelled sample of real candidates (442 strings from
# ../shared/data; tests/fixtures/make_pii_sample.py). Measured (bench/quality/pii_eval.py) before issue 16:
# email 0.64/0.74, phone 0.09/0.20, ip 0.70/1.00; after: email 1.00/0.94, phone 1.00/0.60,
# ip 1.00/1.00. The floors sit a little under the measured values. Phone recall is low because
# national formats without a country code ((062) 200-7606, 0800 221 221) are not matched.
@pytest.mark.parametrize("kind, precision, recall", [("email", 0.95, 0.9), ("phone", 0.75, 0.6), ("ip", 0.97, 0.97)])
def test_precision_recall_on_labelled_sample(kind: str, precision: float, recall: float) -> None:
    from tests.support.pii_sample import load, scores

    rows = load()
    assert len(rows) >= 300
    s = scores(STAGE.redact, rows)[kind]
    assert s["precision"] >= precision and s["recall"] >= recall, s


def test_labelled_sample_contexts_are_real() -> None:
    # Every row's context is a verbatim slice of its source document in ../shared/data.
    import json

    from tests.support.pii_sample import load
    from tests.support.shared_data import shared_path

    rows = load()
    texts: dict[str, set[str]] = {}
    for rel in sorted({r["file"] for r in rows}):
        lines = shared_path(*rel.split("/")).read_text(encoding="utf-8").splitlines()
        texts[rel] = {json.loads(ln).get("text") or "" for ln in lines}
    for r in rows:
        assert any(r["context"] in t for t in texts[r["file"]] if r["match"] in t), r["id"]
        assert r["context"][r["start"] : r["end"]] == r["match"]
