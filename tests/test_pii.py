"""PII redaction: real PII replaced with typed placeholders and counted; look-alikes untouched."""

from __future__ import annotations

import pyarrow as pa
import pytest

from datapipe.stages.base import StageContext
from datapipe.stages.pii import Pii, PiiOptions, id_card_valid

STAGE = Pii(PiiOptions(), StageContext(".", "."))


def redact(text: str) -> tuple[str, dict[str, int]]:
    return STAGE.redact(text)


@pytest.mark.parametrize("text, placeholder, kind", [
    ("联系 zhang.san+news@mail.example.com.cn 获取", "<EMAIL>", "email"),
    ("手机：13812345678。", "<PHONE>", "phone"),
    ("call +86 138-1234-5678 now", "<PHONE>", "phone"),
    ("office +1 (415) 555-2671", "<PHONE>", "phone"),
    ("tel +44 20 7946 0958.", "<PHONE>", "phone"),
    ("身份证号 11010519491231002X 已登记", "<ID_CARD>", "id_card"),
    ("server at 192.168.10.254, port 22", "<IP>", "ip"),
    ("v6 host 2001:db8:85a3::8a2e:370:7334 up", "<IP>", "ip"),
    ("loopback ::1 only", "<IP>", "ip"),
])
def test_pii_replaced_and_counted(text: str, placeholder: str, kind: str) -> None:
    out, counts = redact(text)
    assert placeholder in out, out
    assert counts[kind] == 1 and sum(counts.values()) == 1, counts


@pytest.mark.parametrize("text", [
    "Released version 1.2.3.4 and v2.10.3 today",        # versions, including a 4-part one
    "Python 3.11.7, numpy 2.4.6",
    "会议于2023-01-15 14:30:45举行，12:30开始",            # dates and times
    "售价 ¥12800，$1,299.00 或 €49.99",                    # prices
    "订单号 20231015123456789012 已发货",                   # an ordinary long number
    "population 13812345678901",                          # 14 digits: not a mobile number
    "ID 110105194912310021 has a wrong checksum",          # checksum fails
    "ID 110105194913310023 has month 13",                  # impossible birth date
    "ratio 1:2:3 and MAC aa:bb",                           # colons that are not IPv6
    "IP-like 999.1.1.1 and 1.2.3 are not addresses",
    "see section 3.1.4.1 of the paper",
])
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


@pytest.mark.parametrize("text,expected", [
    ("Questions? Call +1 415 555 0134.", "Questions? Call <PHONE>."),
    ("The server is at 10.0.0.1.", "The server is at <IP>."),
    ("请致电13800138000。", "请致电<PHONE>。"),
    ("请发邮件至zhang.wei@example.cn。", "请发邮件至<EMAIL>。"),
    ("Pi is 3.14159 and the build is 10.0.0.1.2", "Pi is 3.14159 and the build is 10.0.0.1.2"),
])
def test_sentence_final_full_stop_does_not_hide_pii(text: str, expected: str) -> None:
    stage = Pii(PiiOptions(), StageContext(".", "."))
    out = stage.compute(pa.table({"text": [text]}))
    assert out["text"][0].as_py() == expected
