"""Dedup and license stages inside real pipeline runs: distributed MinHash equals the in-memory
clustering, URL dedup, and license tagging with a policy."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.audit.sql import connect as connect_stats
from datapipe.dedup import near_duplicates
from datapipe.dedup.evalset import build
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.stages.base import StageContext
from datapipe.stages.license import LicenseOptions, LicenseTagger
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def run(pipeline: Path, out: Path):
    return run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)


def rows(out: Path, sql: str) -> list[tuple]:
    with connect_stats(out) as con:
        return con.execute(sql).fetchall()


def test_distributed_minhash_equals_in_memory_clustering(ray_local, tmp_path: Path) -> None:
    texts, groups, _ = build(
        [
            (shared_path("corpus", "zh_wikipedia.jsonl"), "zh", 60, 300),
            (shared_path("corpus", "en_wikipedia.jsonl"), "en", 60, 600),
        ],
        seed=3,
    )
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)  # copies land in other files than their originals
    texts = [texts[i] for i in order]
    groups = groups[order]
    (tmp_path / "data").mkdir()
    per_file = len(texts) // 3 + 1
    for f in range(3):
        chunk = texts[f * per_file : (f + 1) * per_file]
        (tmp_path / "data" / f"part-{f}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in chunk))
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "near",
            "sources": [{"name": "wiki", "paths": ["data/*.jsonl"]}],
            "stages": [{"minhash": {"threshold": 0.7, "partitions": 4}}],
        },
    )
    out = tmp_path / "out"
    run(pipeline, out)

    expected = near_duplicates(texts, threshold=0.7)  # same order as the run: files in order, lines in order
    ids = [f"wiki/data/part-{i // per_file}.jsonl#L{i % per_file + 1}" for i in range(len(texts))]
    dropped = {
        r[0]: r[1:] for r in rows(out, "select id, dup_of, dup_cluster, detail from documents where reason = 'near_duplicate'")
    }
    assert set(dropped) == {ids[i] for i in np.flatnonzero(expected.duplicate)}
    for i in np.flatnonzero(expected.duplicate):
        dup_of, cluster, detail = dropped[ids[i]]
        assert dup_of == ids[expected.survivor[i]] and cluster == ids[expected.cluster[i]]
        assert "estimated Jaccard" in detail
    # Most edited copies are found, and what is dropped really is a copy of its survivor.
    truth = {i: g for i, g in enumerate(groups)}
    id_index = {d: i for i, d in enumerate(ids)}
    assert all(truth[id_index[d]] == truth[id_index[s[0]]] for d, s in dropped.items())
    assert len(dropped) >= 0.8 * (len(texts) - len(set(groups.tolist())))
    survivors = {s[0] for s in dropped.values()}
    kept = {r[0] for r in rows(out, "select id from documents where status = 'kept'")}
    assert survivors <= kept
    # Rehydration: every kept document carries the size of the cluster it survived (1 alone),
    # so sum(dup_count) over kept documents is every input document.
    counts = dict(rows(out, "select id, dup_count from documents where status = 'kept'"))
    sizes = np.bincount(expected.cluster, minlength=len(texts))
    assert all(counts[ids[i]] == sizes[expected.cluster[i]] for i in range(len(texts)) if ids[i] in kept)
    assert sum(counts.values()) == len(texts) and max(counts.values()) > 1
    # Signatures are only needed by the reduce: they do not bloat the kept documents.
    assert "minhash_sig" not in pq.read_table(out / "docs").column_names


def test_url_dedup_keeps_the_earliest_page_and_never_chains(ray_local, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    docs = [
        {"text": "alpha page about rivers", "url": "https://Example.com/rivers/"},
        {"text": "alpha page about rivers, reposted", "url": "http://example.com/rivers#top"},  # same URL
        {"text": "alpha page about rivers", "url": "https://example.com/other"},  # same text as doc 1
        {"text": "beta page", "url": "https://example.com/other"},  # URL of a dropped page: kept
        {"text": "gamma page", "url": None},
    ]
    (tmp_path / "data" / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "urls",
            "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
            "stages": [{"dedup": {"exact": True, "url": True}}],
        },
    )
    run(pipeline, tmp_path / "out")
    got = dict((r[0].split("#")[1], r[1:]) for r in rows(tmp_path / "out", "select id, status, reason, dup_of from documents"))
    assert got["L1"] == ("kept", None, None)
    assert got["L2"] == ("rejected", "duplicate_url", "web/data/a.jsonl#L1")
    assert got["L3"] == ("rejected", "exact_duplicate", "web/data/a.jsonl#L1")
    assert got["L4"] == ("kept", None, None)
    assert got["L5"] == ("kept", None, None)


def test_license_stage_tags_all_kinds_and_applies_the_policy() -> None:
    stage = LicenseTagger(
        LicenseOptions.model_validate({"policy": {"code": {"deny": ["strong_copyleft"]}, "paper": {"allow": ["permissive"]}}}),
        StageContext(".", "."),
    )
    stage.setup()  # the engine calls it once per worker
    mit = shared_path("licenses", "choosealicense", "_licenses", "mit.txt").read_text().split("---", 2)[2]
    code = pa.table(
        {
            "kind": ["code"] * 3,
            "text": ["def f():\n    return 1\n", "// SPDX-License-Identifier: GPL-3.0-only\nint main() {}\n", "print('x')\n"],
            "repo_license_files": [json.dumps({"LICENSE": mit})] * 2
            + [json.dumps({"package.json": '{"license": "Apache-2.0"}'})],
        }
    )
    code = stage.compute(code)
    assert code["license"].to_pylist() == ["MIT", "GPL-3.0-only", "Apache-2.0"]
    decision = stage.decide(code)
    assert decision.reason.to_pylist() == [None, "license_strong_copyleft", None]
    assert "GPL-3.0-only" in decision.detail.to_pylist()[1]

    papers = stage.compute(
        pa.table(
            {
                "kind": ["paper"] * 3,
                "text": ["\\section{Intro} ..."] * 3,
                "license_url": [
                    "http://creativecommons.org/licenses/by/4.0/",
                    "http://arxiv.org/licenses/nonexclusive-distrib/1.0/",
                    None,
                ],
            }
        )
    )
    assert papers["license_class"].to_pylist() == ["permissive", "restricted", "unknown"]
    assert stage.decide(papers).reason.to_pylist() == [None, "license_restricted", "license_unknown"]

    web = stage.compute(
        pa.table(
            {
                "kind": ["web"] * 2,
                "text": ["A page.", "Another page."],
                "license_hints": [json.dumps(["https://creativecommons.org/licenses/by-nc-sa/4.0/"]), None],
            }
        )
    )
    assert web["license"].to_pylist() == ["CC-BY-NC-SA-4.0", "unknown"]
    assert stage.decide(web).reason.to_pylist() == [None, None]  # no policy for web: tagged, kept


def test_exact_dedup_normal_form_equals_its_definition_on_real_text() -> None:
    """normalize_for_hash takes shortcuts (ASCII rows skip NFKC, only whitespace that changes is
    replaced); the text it hashes must stay NFKC -> lower -> each \\s+ run one space -> trimmed."""
    import pyarrow.compute as pc

    from datapipe.stages.dedup import normalize_for_hash

    texts: list[str | None] = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl", "zh_pingcap_docs.jsonl"):
        with shared_path("corpus", name).open(encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for _, line in zip(range(400), f)]
    texts += [None, "", " \t\n", "ＡＢ\u3000c\v\fd\r\n", "ﬁ  x"]  # full-width, ideographic space, \v (not RE2's \s)
    arr = pa.chunked_array([texts[:700], texts[700:]])
    definition = pc.utf8_trim_whitespace(
        pc.replace_substring_regex(pc.utf8_lower(pc.utf8_normalize(pc.fill_null(arr, ""), "NFKC")), r"\s+", " ")
    )
    got = normalize_for_hash(arr)
    assert got.to_pylist() == definition.to_pylist()
    assert sum(t is not None and t.isascii() for t in texts) > 100  # both paths taken
    assert sum(t is not None and not t.isascii() for t in texts) > 100
