"""How long ``datapipe view``'s pages take on a run of millions of documents: first page under 1 s, any
page under 2 s (issue 49).

    python -m bench.perf.view_pages [--docs 5000000] [--tasks 500] [--keep DIR] [--repeats 3] [--json PATH]

Writes a synthetic run folder in the real layout (``--keep DIR`` keeps it, and reuses one already
there): two sources, ``--tasks`` map tasks, each with its kept file (``docs/<source>/<task>.parquet``),
one rejected file per stage that dropped some of its documents (langid, length, quality, dedup) and
its copies index file, in row groups of 1,000 documents as the map tasks write them; synthetic text
(random words, log-normal lengths); ``stats.duckdb`` with the index tables ``datapipe run`` writes at
its end (document files with id ranges, layouts, columns, copies files, stages and reasons, the shard
manifest, the views); a shard manifest whose last shard is a real file (the others only counted, so
naming a row's documents walks the whole stream before it).

Each map task's aggregate file is then written by the task code itself (``audit.aggregates.task_aggregates``
over the task's files) and the files merged into the ``agg_`` tables as the end of a run merges them,
so the Overview reads what a real run gives it (a run folder kept by an earlier version of this bench
gets them added).

Then starts the viewer's server in this process (as ``datapipe view`` does, with its warm-up: the
time until it prints its URL is reported) and requests each page: the first time (what a user who
opens it gets) and ``--repeats`` more. Per page: wall seconds of the request and CPU seconds of the
process (the server's threads) during it. The machines here are shared and noisy: wall times vary
with the load, CPU times less. The SQL page runs the user's query (a scan of ``documents`` costs what
the query costs); it is shown apart, with a small query.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT

ROW_GROUP = 1000
EN_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you "
    "were her she there been one all we their has would when if so no will more out up into do any your what can some "
    "data model river city music history team season album village station school church county species film year"
).split()
ZH_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自"
    "二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变"
    "条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指"
    "几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安"
    "场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连"
    "断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属"
    "圆包火住调满县局照参红细引听该铁价严"
)


def _pool(rng: np.random.Generator, words: list[str], sep: str, chars: int) -> str:
    """A long string of random words: documents are windows of it (fast, and no two alike)."""
    picks = rng.integers(0, len(words), size=chars // 4)
    return sep.join(words[i] for i in picks)[:chars]


def _write(path: Path, table: pa.Table) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=ROW_GROUP, compression="zstd")
    ids = table["id"]
    return {"rows": table.num_rows, "min_id": min(ids.to_pylist()), "max_id": max(ids.to_pylist())}


def build_run(root: Path, docs: int, tasks: int, seed: int = 0) -> dict:
    """Write the synthetic run folder; returns facts the pages are then asked about."""
    import duckdb

    from datapipe.audit.views import create_table_views, document_views
    from datapipe.engine.finish import document_columns

    rng = np.random.default_rng(seed)
    pools = {"web_en": _pool(rng, EN_WORDS, " ", 8_000_000), "web_zh": _pool(rng, list(ZH_CHARS), "", 4_000_000)}
    per_task = docs // tasks
    files, copies, reasons = [], [], {}
    facts: dict = {"kept": [], "rejected": [], "survivors": []}
    layouts: dict[str, pa.Schema] = {}
    kept_counts: dict[str, int] = {}
    for t in range(tasks):
        source = "web_en" if t % 2 == 0 else "web_zh"
        key = f"{t // 2:05d}"
        pool = pools[source]
        n = per_task
        lengths = np.clip(rng.lognormal(6.0, 0.9, n).astype(np.int64), 5, 20_000)
        starts = rng.integers(0, len(pool) - 20_001, n)
        texts = [pool[s : s + k] for s, k in zip(starts.tolist(), lengths.tolist())]
        ids = [f"{source}/data/{source}-{key}.jsonl#L{j}" for j in range(1, n + 1)]
        main, other = ("en", ["de", "fr", "es"]) if source == "web_en" else ("zh", ["ja", "en", "ko"])
        langs = np.where(rng.random(n) < 0.95, main, rng.choice(other, n))
        lang_score = np.clip(rng.beta(8, 1.5, n), 0, 1).astype(np.float32)
        words = (lengths / (5 if source == "web_en" else 1.6)).astype(np.int32)
        stop = rng.poisson(words / 10).astype(np.int32)
        mean_len = rng.normal(5, 0.8, n).astype(np.float32)
        zh_chars = np.where(source == "web_zh", lengths, 0).astype(np.int32)
        split = np.where(rng.random(n) < 0.95, "train", "val")
        base = {
            "id": pa.array(ids),
            "source": pa.array([source] * n).dictionary_encode(),
            "kind": pa.array(["web"] * n).dictionary_encode(),
            "url": pa.array([f"https://example.com/{source}/{key}/{j}" for j in range(n)]),
            "text": pa.array(texts),
            "n_chars": pa.array(lengths),
            "lang": pa.array(langs),
            "lang_score": pa.array(lang_score),
        }
        quality = {
            "quality_rules": pa.array([f"{main}_web"] * n),
            "gopher_words": pa.array(words),
            "gopher_stop_words": pa.array(stop),
            "gopher_mean_word_len": pa.array(mean_len),
            "zh_chars": pa.array(zh_chars),
        }
        lang_bad = (langs != main) | (lang_score < 0.5)
        short = ~lang_bad & (lengths < 50)
        qual_bad = ~lang_bad & ~short & ((words < 50) | (stop < 2))
        alive = ~lang_bad & ~short & ~qual_bad
        alive_idx = np.flatnonzero(alive)
        dup = np.zeros(n, bool)
        dup_pick = alive_idx[rng.random(len(alive_idx)) < 0.02]
        dup_pick = dup_pick[dup_pick > alive_idx[0]]
        dup[dup_pick] = True
        kept = alive & ~dup
        kept_idx = np.flatnonzero(kept)
        # each copy names an earlier kept document of its task as its survivor
        survivor = {int(i): int(kept_idx[max(0, np.searchsorted(kept_idx, i) - 1)]) for i in np.flatnonzero(dup)}

        def table(mask: np.ndarray, cols: dict) -> pa.Table:
            idx = pa.array(np.flatnonzero(mask))
            return pa.table({k: v.take(idx) for k, v in cols.items()})

        def reject(
            stage: str,
            pos: int,
            mask: np.ndarray,
            cols: dict,
            reason: list[str],
            detail: list[str],
            extra: dict | None = None,
            source: str = source,
            key: str = key,
            ids: list[str] = ids,
        ) -> None:
            if not mask.any():
                return
            t_ = table(mask, cols)
            t_ = t_.append_column("stage", pa.array([stage] * t_.num_rows))
            t_ = t_.append_column("reason", pa.array(reason)).append_column("detail", pa.array(detail))
            for k, v in (extra or {}).items():
                t_ = t_.append_column(k, pa.array(v))
            rel = f"rejected/{source}/{key}.{pos:02d}-{stage}.parquet"
            files.append({"path": rel, "status": "rejected", "schema": t_.schema, **_write(root / rel, t_)})
            for r in reason:
                reasons[(pos, stage, r)] = reasons.get((pos, stage, r), 0) + 1
            facts["rejected"].append((rel, ids[int(np.flatnonzero(mask)[0])], stage, reason[0]))

        li = np.flatnonzero(lang_bad)
        reject(
            "langid",
            1,
            lang_bad,
            base,
            ["language_not_kept" if langs[i] != main else "low_language_score" for i in li],
            [f"lang={langs[i]} score={lang_score[i]:.3g}" for i in li],
        )
        si = np.flatnonzero(short)
        reject("length", 2, short, base, ["too_short"] * len(si), [f"chars={lengths[i]}" for i in si])
        qi = np.flatnonzero(qual_bad)
        reject(
            "quality",
            3,
            qual_bad,
            {**base, **quality},
            ["gopher_quality:min_words" if words[i] < 50 else "gopher_quality:stop_words" for i in qi],
            [f"gopher_words={words[i]} < 50" if words[i] < 50 else f"gopher_stop_words={stop[i]} < 2" for i in qi],
        )
        di = np.flatnonzero(dup)
        reject(
            "dedup",
            5,
            dup,
            {**base, **quality},
            ["exact_duplicate"] * len(di),
            [f"same normalized text as {ids[survivor[int(i)]]}" for i in di],
            {"dup_of": [ids[survivor[int(i)]] for i in di]},
        )
        if len(di):
            c = pa.table(
                {
                    "dup_of": [ids[survivor[int(i)]] for i in di],
                    "id": [ids[int(i)] for i in di],
                    "reason": ["exact_duplicate"] * len(di),
                    "detail": [f"same normalized text as {ids[survivor[int(i)]]}" for i in di],
                }
            ).sort_by("dup_of")
            rel = f"copies/{source}/{key}.05-dedup.parquet"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(c, root / rel)
            copies.append(
                {
                    "path": rel,
                    "stage": "dedup",
                    "rows": c.num_rows,
                    "min_dup_of": c["dup_of"][0].as_py(),
                    "max_dup_of": c["dup_of"][-1].as_py(),
                }
            )
            facts["survivors"].append(c["dup_of"][0].as_py())
        tokens = (lengths / (4 if source == "web_en" else 1.5)).astype(np.int64) + 1
        k_t = table(
            kept,
            {
                **base,
                **quality,
                "dup_count": pa.array(np.ones(n, np.int64)),
                "split": pa.array(split),
                "n_tokens": pa.array(tokens),
            },
        )
        rel = f"docs/{source}/{key}.parquet"
        files.append({"path": rel, "status": "kept", "schema": k_t.schema, **_write(root / rel, k_t)})
        kept_counts[source] = kept_counts.get(source, 0) + k_t.num_rows
        facts["kept"].append(ids[int(kept_idx[len(kept_idx) // 2])])
        facts.setdefault("tokens", {}).setdefault(source, 0)
        facts["tokens"][source] += int(np.asarray(tokens)[kept & (split == "train")].sum())
        facts.setdefault("train_docs", {}).setdefault(source, 0)
        facts["train_docs"][source] += int((kept & (split == "train")).sum())
        if t % 50 == 0:
            print(f"  wrote task {t + 1} of {tasks}", flush=True)

    manifest = _shards(root, facts)
    for f in files:
        key = repr([(x.name, str(x.type)) for x in f["schema"]])
        layouts.setdefault(key, f["schema"])
        f["layout"] = list(layouts).index(key)
    con = duckdb.connect(str(root / "stats.duckdb"))
    ordered = document_columns(con, list(layouts.values()))
    con.register(
        "f", pa.Table.from_pylist([{k: f[k] for k in ("path", "status", "layout", "rows", "min_id", "max_id")} for f in files])
    )
    con.execute(
        "CREATE TABLE document_files AS SELECT path, status, layout::INTEGER AS layout, rows, min_id, max_id FROM f ORDER BY path"
    )
    con.register(
        "l",
        pa.table(
            {
                "layout": pa.array(range(len(layouts)), pa.int32()),
                "schema": [s.serialize().to_pybytes() for s in layouts.values()],
            }
        ),
    )
    con.execute("CREATE TABLE document_layouts AS SELECT * FROM l")
    con.register(
        "c",
        pa.table(
            {
                "position": pa.array(range(len(ordered)), pa.int32()),
                "name": [c for c, _ in ordered],
                "type": [t for _, t in ordered],
            }
        ),
    )
    con.execute("CREATE TABLE document_columns AS SELECT * FROM c")
    con.register("cf", pa.Table.from_pylist(copies))
    con.execute("CREATE TABLE copies_files AS SELECT * FROM cf ORDER BY path")
    total = sum(f["rows"] for f in files)
    stage_rows, docs_in = [], total
    for pos, name in [(0, "read"), (1, "langid"), (2, "length"), (3, "quality"), (5, "dedup")]:
        dropped = sum(v for (p, _, _), v in reasons.items() if p == pos)
        stage_rows.append({"position": pos, "stage": name, "docs_in": docs_in, "skipped": 0, "dropped": dropped, "changed": None})
        docs_in -= dropped
    con.register("s", pa.Table.from_pylist(stage_rows))
    con.execute("CREATE TABLE stages AS SELECT * FROM s ORDER BY position")
    funnel = [{"position": p, "stage": s, "docs_in": 0, "reason": r, "dropped": v} for (p, s, r), v in sorted(reasons.items())]
    con.register("r", pa.Table.from_pylist(funnel))
    con.execute("CREATE TABLE stage_reasons AS SELECT * FROM r ORDER BY position, reason")
    con.execute("CREATE TABLE stage_edits (position BIGINT, stage VARCHAR, signal VARCHAR, what VARCHAR, total BIGINT)")
    con.register("m", manifest)
    con.execute("CREATE TABLE shard_files AS SELECT * FROM m ORDER BY path")
    con.execute("CREATE TABLE run AS SELECT ? AS root, 'synthetic' AS fingerprint, '[]' AS stages", [str(root)])
    create_table_views(con)
    views = document_views(con, {c for c, _ in ordered}, ())
    con.register(
        "v", pa.table({"position": pa.array(range(len(views)), pa.int32()), "name": list(views), "sql": list(views.values())})
    )
    con.execute("CREATE TABLE audit_views AS SELECT * FROM v ORDER BY position")
    con.execute("CHECKPOINT")
    con.close()
    tokenizer = ROOT / "tokenizer" / "demo.json"
    run = {
        "name": "view_bench",
        "status": "complete",
        "fingerprint": "synthetic",
        "started": "",
        "finished": "",
        "config": {
            "sources": [
                {"name": s, "kind": "web", "paths": [f"data/{s}-*.jsonl"], "format": "jsonl"} for s in ("web_en", "web_zh")
            ],
            "stages": [
                {"langid": {"keep": ["zh", "en"], "min_score": 0.5}},
                {"length": {"min_chars": 50}},
                {"quality": {"rules": "auto"}},
                {"pii": {}},
                {"dedup": {"exact": True}},
            ],
            "tokenize": {
                "tokenizer": str(tokenizer),
                "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
                "seq_len": 2048,
                "packing": "concat",
            },
            "mixture": {"web_en": 0.6, "web_zh": 0.4},
        },
        "inputs": [],
        "resources": [],
    }
    (root / "run.json").write_text(json.dumps(run))
    facts["documents"] = total
    facts["files"] = len(files)
    write_aggregates(root)
    (root / "facts.json").write_text(json.dumps(facts))
    return facts


def write_aggregates(root: Path) -> None:
    """Each map task's aggregate file (``aggregates/<task>.map0.parquet``) from its kept and rejected
    files, by the task code, and the ``agg_`` tables merged from them as ``engine/finish.py`` merges
    them; nothing where the database has them already."""
    import duckdb
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    from datapipe.audit import aggregates, schema
    from datapipe.view.runs import _KEPT, _REJECTED

    con = duckdb.connect(str(root / "stats.duckdb"))
    try:
        if aggregates.has_tables(con):
            return
        t0 = time.perf_counter()
        tasks: dict[str, list[tuple[Path, str]]] = {}
        for path, status in con.execute("SELECT path, status FROM document_files ORDER BY path").fetchall():
            m = (_KEPT if status == "kept" else _REJECTED).match(path)
            assert m is not None, path
            tasks.setdefault(f"{m['source']}/{m['key']}", []).append((root / path, status))
        types = aggregates.stage_types(json.loads((root / "run.json").read_text()))
        files = []
        for task, parts in tasks.items():
            table = aggregates.task_aggregates(parts, types)
            assert table is not None
            rel = f"aggregates/{task}.map0.parquet"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, root / rel, compression="zstd")
            files.append({"path": rel, "rows": table.num_rows})
        columns = {name for (name,) in con.execute("SELECT name FROM document_columns").fetchall()}
        declared = aggregates.run_aggregates(types, columns)
        rows = ds.FileSystemDataset.from_paths(
            [str(root / f["path"]) for f in files],
            schema=aggregates.file_schema(declared),
            format=ds.ParquetFileFormat(),
            filesystem=pafs.LocalFileSystem(),
        )
        con.register("__aggregate_rows", rows)
        aggregates.create_tables(con, "__aggregate_rows", declared)
        con.unregister("__aggregate_rows")
        schema.write_table(con, schema.AGGREGATE_FILES, files)
        con.execute("CHECKPOINT")
        print(f"wrote {len(files):,} aggregate files and the agg_ tables in {time.perf_counter() - t0:.0f} s")
    finally:
        con.close()


def _shards(root: Path, facts: dict) -> pa.Table:
    """The manifest of web_en's train stream; only its last shard is written (the others are counted)."""
    from datapipe.tokens.shard_format import ShardMeta, file_sha256
    from datapipe.tokens.shard_writer import write_shard

    seq_len, rows_per_shard = 2048, 8192
    tokens, docs = facts["tokens"]["web_en"], facts["train_docs"]["web_en"]
    rows = math.ceil(tokens / seq_len)
    n = math.ceil(rows / rows_per_shard)
    per_shard_docs = docs // n
    recs = []
    rng = np.random.default_rng(1)
    for k in range(n):
        r = rows_per_shard if k < n - 1 else rows - rows_per_shard * (n - 1)
        d = per_shard_docs if k < n - 1 else docs - per_shard_docs * (n - 1)
        rel = f"shards/web_en/train-{k:05d}.arrow"
        sha = "0" * 64
        if k == n - 1:  # the one real shard: random tokens, d documents spread over its rows
            ids = rng.integers(3, 20_000, size=(r, seq_len), dtype=np.uint16)
            starts = np.sort(rng.choice(r * seq_len, size=d, replace=False))
            row_of = starts // seq_len
            splits = np.searchsorted(row_of, np.arange(r + 1))
            meta = ShardMeta("demo", 32000, seq_len, seq_len, 0, 1, None, "concat", "web_en", "train", "uint16", documents=d)
            write_shard(root / rel, ids, splits, (starts % seq_len).astype(np.int32), np.full(r, seq_len, np.int32), meta)
            sha = file_sha256(root / rel)
        recs.append(
            {
                "path": rel,
                "source": "web_en",
                "split": "train",
                "rows": r,
                "tokens": r * seq_len,
                "documents": d,
                "sha256": sha,
                "tokenizer_fingerprint": "demo",
                "seq_len": seq_len,
                "row_len": seq_len,
                "packing": "concat",
            }
        )
    facts["shard"] = recs[-1]["path"]
    facts["shard_rows"] = recs[-1]["rows"]
    table = pa.Table.from_pylist(recs)
    pq.write_table(table, root / "shards" / "manifest.parquet")
    return table


def pages(facts: dict) -> list[tuple[str, str]]:
    kept = facts["kept"]
    rej = {stage: doc for _, doc, stage, _ in facts["rejected"]}
    mid = facts["files"] // 2

    def q(to: str, /, **p: str) -> str:
        return to + ("?" + urllib.parse.urlencode(p) if p else "")

    def doc(i: str) -> str:
        return "/documents/" + urllib.parse.quote(i, safe="/")

    return [
        ("overview (first page)", "/"),
        ("documents, no filter", "/documents"),
        ("documents, rejected by quality", q("/documents", status="rejected", stage="quality")),
        ("documents, reason too_short", q("/documents", reason="too_short")),
        ("documents, lang=zh and lang_score >= 0.99", q("/documents", lang="zh", lang_score_min="0.99", hist="lang_score")),
        ("documents, kept, n_chars 2000-2500", q("/documents", status="kept", n_chars_min="2000", n_chars_max="2500")),
        ("documents, text contains a rare word (time-bounded)", q("/documents", q="zzyzx")),
        ("documents, a page deep in the run", q("/documents", after=f"{mid}:500")),
        ("document, kept (the middle of the run)", doc(kept[len(kept) // 2])),
        ("document, kept with copies", doc(facts["survivors"][len(facts["survivors"]) // 2])),
        ("document, rejected by quality", doc(rej["quality"])),
        ("document, dropped as a duplicate", doc(rej["dedup"])),
        ("shards (manifest)", "/shards"),
        (
            "shard row, the stream's last (names its documents)",
            q("/shards", path=facts["shard"], row=str(facts["shard_rows"] - 1)),
        ),
        ("compare (the run against itself)", "/compare"),
        ("sql, the funnel view", q("/sql", q="select * from funnel")),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=5_000_000)
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--keep", type=Path, help="write the run folder here and keep it (reused when already built)")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("view_pages", args, libs=["duckdb", "jinja2"])
    tmp = None
    root = args.keep
    if root is None:
        tmp = tempfile.mkdtemp(prefix="view-bench-")
        root = Path(tmp) / "run"
    try:
        if (root / "facts.json").is_file():
            facts = json.loads((root / "facts.json").read_text())
            print(f"reusing the run folder in {root}: {facts['documents']:,} documents in {facts['files']:,} files")
            write_aggregates(root)
        else:
            t0 = time.perf_counter()
            facts = build_run(root, args.docs, args.tasks)
            print(f"wrote {facts['documents']:,} documents in {facts['files']:,} files in {time.perf_counter() - t0:.0f} s")
        measure(h, root, facts)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def measure(h: Harness, root: Path, facts: dict) -> None:
    from datapipe.runtime.arrow_pandas import arrow_without_pandas
    from datapipe.view.launch import make_server
    from datapipe.view.server import serve_in_thread

    arrow_without_pandas()  # as `datapipe view` does
    c0, t0 = time.process_time(), time.perf_counter()
    server = make_server([root, root], port=0)
    ready = time.process_time(), time.perf_counter()
    start_wall, start_cpu = ready[1] - t0, ready[0] - c0
    serve_in_thread(server)
    base = server.url.rstrip("/")
    results = {}
    try:
        for label, path in pages(facts):
            walls, cpus = [], []
            for visit in range(1 + h.repeats):
                # The first page's first visit is timed from the moment the server is ready: the warm-up
                # it starts in the background (the Overview's sample) is counted in it.
                c, t = ready if not results and visit == 0 else (time.process_time(), time.perf_counter())
                with urllib.request.urlopen(base + path) as r:
                    body = r.read()
                    status = r.status
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
            assert status == 200 and body, (label, status)
            target = "< 1 s" if label.startswith("overview") else "< 2 s"
            results[label] = {"first_wall": walls[0], "first_cpu": cpus[0], "walls": walls, "cpus": cpus, "bytes": len(body)}
            print(
                f"{label:<52} first {walls[0]:6.2f} s wall {cpus[0]:6.2f} s CPU; then {statistics.median(walls[1:]):6.2f} s "
                f"wall {statistics.median(cpus[1:]):6.2f} s CPU (median of {h.repeats})  target {target}"
            )
            # the table's figure: CPU seconds of the process per visit (the server's threads), first visit included
            h.figure(f"{label}, CPU s per visit", cpus, "s", show=False, target=target)
    finally:
        server.shutdown()
        server.server_close()
    h.figure("server start until its URL is printed, wall s", start_wall, "s")
    h.figure("server start, CPU s (imports, templates, the index)", start_cpu, "s")
    walls = [w for r in results.values() for w in r["walls"]]
    h.figure("slowest visit of any page, wall s (a loaded, shared machine)", max(walls), "s")
    h.finish(documents=facts["documents"], files=facts["files"], pages=results)


if __name__ == "__main__":
    main()
