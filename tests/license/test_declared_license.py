"""A licence the pipeline file declares (issue 35, item 2): ``sources[i].license`` and a record's
``license_field`` reach the documents table, the mixture view, the license policy and every export;
detection still runs where nothing is declared, and its ``unknown`` says what it looked for.

Real data: the shared English Wikipedia (CC BY-SA 3.0, declared for the source), OI-wiki records
given their real licence (CC BY-SA 4.0) in a ``license`` field of a Parquet file, and TiDB docs with
nothing declared (their text names no licence: unknown, dropped by a policy that denies unknown).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datapipe.audit.sql import connect as audit_connect
from datapipe.export import export
from datapipe.pipeline.load import ConfigError, build_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

TOKENIZER = PROJECT_ROOT / "tokenizer" / "demo.json"


def _head(name: str, n: int) -> list[dict]:
    with shared_path("corpus", name).open(encoding="utf-8") as f:
        return [{**(r := json.loads(next(f))), "text": r["text"][:1200]} for _ in range(n)]


def _config(data: Path) -> dict:
    return {
        "name": "declared",
        "sources": [
            {"name": "wiki", "kind": "text", "paths": ["data/wiki.jsonl"], "license": "cc-by-sa-3.0"},
            {"name": "oiwiki", "kind": "text", "paths": ["data/oiwiki.parquet"], "license_field": "license"},
            {"name": "tidb", "kind": "text", "paths": ["data/tidb.jsonl"]},
        ],
        "stages": [{"length": {"min_chars": 20}}, {"license": {"policy": {"default": {"deny": ["unknown"]}}}}],
        "tokenize": {"tokenizer": str(TOKENIZER), "seq_len": 128, "rows_per_shard": 64},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    root = tmp_path_factory.mktemp("declared")
    data = root / "data"
    data.mkdir()
    (data / "wiki.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _head("en_wikipedia.jsonl", 40)), encoding="utf-8")
    oi = _head("zh_oiwiki.jsonl", 30)
    # The OI-wiki licence as a record would carry it; two records carry a value that is not SPDX.
    lics = ["CC-BY-SA-4.0"] * 28 + ["CC BY-SA 4.0", None]
    pq.write_table(pa.Table.from_pylist([{**r, "license": lic} for r, lic in zip(oi, lics)]), data / "oiwiki.parquet")
    (data / "tidb.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _head("zh_pingcap_docs.jsonl", 30)), encoding="utf-8")
    out = root / "run"
    run_pipeline(load_pipeline(write_pipeline(root, _config(data))), output=out, in_process=True, show_progress=False)
    return out


def _sql(run: Path, query: str) -> list[tuple]:
    with audit_connect(run) as con:
        return con.execute(query).fetchall()


def test_declared_licences_reach_the_documents_table_and_the_mixture(run: Path) -> None:
    rows = _sql(
        run,
        "SELECT source, license, license_class, license_evidence, count(*) FROM documents WHERE status = 'kept' GROUP BY ALL ORDER BY ALL",
    )
    by = {(s, lic, ev): n for s, lic, cls, ev, n in rows}
    wiki = ("wiki", "CC-BY-SA-3.0", "declared by source: cc-by-sa-3.0")
    assert set(by) == {("oiwiki", "CC-BY-SA-4.0", "record field: CC-BY-SA-4.0"), wiki}, rows
    assert by[("oiwiki", "CC-BY-SA-4.0", "record field: CC-BY-SA-4.0")] == 28 and by[wiki] > 30
    assert {cls for *_, cls, _, _ in rows} == {"weak_copyleft"}
    mixture = _sql(run, "SELECT source, license_class, documents FROM mixture ORDER BY source")
    assert {(s, c) for s, c, _ in mixture} == {("oiwiki", "weak_copyleft"), ("wiki", "weak_copyleft")}


def test_the_policy_drops_what_stays_unknown_and_says_what_was_looked_for(run: Path) -> None:
    dropped = _sql(
        run, "SELECT source, reason, detail FROM documents WHERE status = 'rejected' AND stage = 'license' ORDER BY id"
    )
    assert {s for s, _, _ in dropped} == {"tidb", "oiwiki"}
    assert {r for _, r, _ in dropped} == {"license_unknown"}
    assert sum(s == "tidb" for s, _, _ in dropped) == 30  # nothing declared, no notice in the text
    # The two OI-wiki records without a valid licence fall back to detection; the bad value is named.
    details = [d for s, _, d in dropped if s == "oiwiki"]
    assert len(details) == 2 and any("'CC BY-SA 4.0' is not an SPDX expression" in d for d in details), details
    assert all("none found in notices in the text's head and tail" in d for _, _, d in dropped), dropped[:2]
    assert sum("no sources[].license or license_field declared" in d for s, _, d in dropped if s == "tidb") == 30
    assert sum("the record's license_field is empty" in d for s, _, d in dropped if s == "oiwiki") == 1


@pytest.mark.parametrize("fmt", ["megatron", "hf", "mds", "jsonl"])
def test_every_export_carries_the_declared_licences(run: Path, tmp_path: Path, fmt: str) -> None:
    columns = None if fmt == "megatron" else ["id", "text", "license", "input_ids"]
    result = export(run, fmt, tmp_path / fmt, columns=columns, splits=["train"])
    manifest = json.loads((tmp_path / fmt / "export-manifest.json").read_text(encoding="utf-8"))
    licenses = {s: info["licenses"] for s, info in manifest["streams"].items()}
    assert set(licenses["wiki/train"]) == {"CC-BY-SA-3.0"} and set(licenses["oiwiki/train"]) == {"CC-BY-SA-4.0"}
    assert licenses["oiwiki/train"]["CC-BY-SA-4.0"]["docs"] == result.streams["oiwiki/train"]["docs"] == 28
    assert licenses["wiki/train"]["CC-BY-SA-3.0"]["tokens"] == result.streams["wiki/train"]["tokens"] > 0
    if fmt == "jsonl":
        rows = [json.loads(line) for f in sorted((tmp_path / fmt / "wiki").glob("*.jsonl")) for line in f.open()]
        assert rows and {r["license"] for r in rows} == {"CC-BY-SA-3.0"}


def test_a_declared_licence_is_checked_when_the_pipeline_loads(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "wiki.jsonl").write_text(json.dumps(_head("en_wikipedia.jsonl", 1)[0]) + "\n", encoding="utf-8")
    config = {"name": "bad", "sources": [{"name": "wiki", "paths": ["data/wiki.jsonl"], "license": "CC-BY-SA-3"}]}
    with pytest.raises(ConfigError) as err:
        build_pipeline({**config, "stages": [{"license": {}}]}, tmp_path)
    assert err.value.problems == [
        "sources[0].license: 'CC-BY-SA-3' in 'CC-BY-SA-3' is not an SPDX licence id datapipe knows "
        "(filters/licenses/classes.yaml lists them; name others LicenseRef-...); "
        "expected an SPDX expression such as CC-BY-SA-4.0 or MIT OR Apache-2.0"
    ]
    config["sources"][0]["license"] = "CC-BY-SA-3.0"
    with pytest.raises(ConfigError) as err:
        build_pipeline(config, tmp_path)  # no license stage: nothing would apply it
    assert err.value.problems[0].startswith("sources[0].license: declared licences are applied by the license stage")
