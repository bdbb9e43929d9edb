"""Does the cost per document stay flat, and the memory per task stay put, from 1x to 16x the corpus?

    python -m bench.scaling.scale [--base-docs 125000] [--scales 1,4,16] [--cpus 2]
        [--datatrove-python /tmp/dt/bin/python] [--json bench/results/scale.json]
    python -m bench.scaling.scale --base-docs 5000 --scales 1,4      # a quick check
    python -m bench.scaling.scale --base-docs 1000 --scales 1,4 --s3 # on a counting loopback S3
    python -m bench.scaling.scale --points 3724:64,3724:512,3724:2048   # the same 4,096 documents, x8 / x32 tasks
    python -m bench.scaling.scale --points 24096:64,24096:64:c20000 --plant-rate 0   # a planted cluster
    python -m bench.scaling.scale --report A.json B.json [--json OUT]   # --points' report over runs written apart

``--points DOCS:TASKS[:cK]`` runs the same documents (seed 0: the same DOCS give the same documents
at any TASKS) in TASKS input files (= map tasks = dedup and MinHash partitions), K of them near-copies
of one page (``add_cluster``), and prints a table (tree CPU split into tasks / driver / the rest), the fit
CPU = a + b*(tasks + partitions) + c*documents with each run's residual, the marginal CPU per added
task or partition, and the largest process's peak RSS against the fewest tasks and against the
distinct twin of a planted-cluster run.

Corpora (bench/_support/scale_corpus.py): real zh/en documents of ../shared/data/corpus, every copy
perturbed (a fifth of its Han characters and words replaced by ones drawn by corpus frequency),
so no two regular documents are exact or near duplicates (the script measures the MinHash
Jaccard of sampled copy pairs and prints it), plus 5% exact and 5% near planted copies of
regular documents. Scale s has s x ``--base-docs`` regular documents (16x at the default:
2,000,000, 2,200,000 lines with the plants) in ``--files-per-scale`` x s JSONL files, written
under ``--tmp`` and deleted after its run.

Each scale runs the whole pipeline of bench/perf/pipeline.py (langid zh/en -> quality auto -> exact
dedup -> MinHash 0.7 -> tokenize, demo tokenizer, seq_len 2048) with ``datapipe run`` on an
embedded Ray with ``--cpus`` CPUs. The work per task is the same at every scale: one input file is
one map task (split.target_bytes above the file size, no grouping), and exact dedup and MinHash
get ``--files-per-scale`` x s partitions, so a partition holds the same number of documents at
every scale. What is measured:

* wall seconds and process-tree CPU seconds of the whole run (bench/_support/proctree.py: Ray's raylet,
  GCS and workers included), docs/s per core (documents / wall / cpus, capped by what the shared
  machine gives) and documents per CPU second (does not depend on the load);
* per phase (from the completion markers): tasks, wall seconds, the tasks' CPU seconds, and the
  peak RSS of each task: VmHWM of its worker, reset when the task starts
  (datapipe/runtime/task_usage.py), so a reused worker's earlier tasks do not count; and the peak
  RSS of the whole process tree while the phase ran (sampled every ``--interval`` s and attributed
  by the phase's marker times; RSS sums count shared pages once per process);
* bytes each phase wrote (shuffle files, partition outputs, map outputs), per document;
* planted duplicates found: a pair counts when both its documents reached dedup (neither dropped
  by langid or quality) and exactly one of them was removed as a duplicate; false positives are
  regular documents (no plant of theirs) removed as a duplicate.

With ``--s3`` the inputs and the run folder are on a loopback moto S3 server that counts the
requests it answers (tests/support/counting_s3.py): GET, PUT, LIST, HEAD and bytes read and
written by the run, per document, and their ratio last scale / first.

Printed last: the per-document cost ratio last scale / first (flat = 1.0; tree CPU, task CPU and
wall), per-task peak RSS last / first (target <= 1.2), and the markdown rows for docs/scaling.md.
With ``--datatrove-python`` datatrove's equivalent pipeline (bench/_support/datatrove_pipeline.py) runs on
the 1x corpus (the first scale) with as many workers, and the ratios to datapipe's 1x run print
(datatrove / datapipe for wall and CPU: > 1 means datapipe is faster), with datatrove's own plant
recall (documents past its quality block and missing from its output).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from bench._support.proctree import run_tree
from bench._support.scale_corpus import Corpus, load_base, near_copy, similarity_check, write_corpus

DT_SCRIPT = ROOT / "bench" / "_support" / "datatrove_pipeline.py"
TOKENIZER = ROOT / "tokenizer" / "demo.json"
MIB = 1 << 20
PHASES = {  # marker folder -> what the phase does in this pipeline
    "lines": "newline pre-pass",
    "map0": "read + langid + quality + dedup keys",
    "shuffle0": "exact dedup partitions",
    "map1": "apply dedup + minhash signatures",
    "shuffle1": "minhash band partitions",
    "reduce1": "minhash combine",
    "merge0": "exact dedup: map tasks' shuffle files merged",
    "merge0d": "exact dedup: decisions merged",
    "merge1": "minhash: map tasks' shuffle files merged",
    "merge1d": "minhash: decisions merged",
    "map2": "apply minhash + tokenize",
    "pack": "pack ranges",
    "stats": "statistics, in the driver",
}
DUP_REASONS = {"exact_duplicate", "near_duplicate"}


def describe(phase: str) -> str:
    """What a phase does: PHASES, or a shuffle round (shuffle1r3) or its merge (merge1r3)."""
    if phase in PHASES:
        return PHASES[phase]
    m = re.fullmatch(r"(shuffle|merge)(\d+)r(\d+)", phase)
    if m:
        what = "exact dedup" if m.group(2) == "0" else "minhash"
        return f"{what}: round {m.group(3)}" + (" inputs merged" if m.group(1) == "merge" else " partitions")
    return phase


def phase_order(results: list[dict[str, Any]]) -> list[str]:
    """Every phase of any scale, in the order the largest run ran them (the table's rows)."""
    names: list[str] = []
    for r in reversed(results):
        names += [p for p in r["phases"] if p not in names]
    return names


def pipeline_config(inp: Path, partitions: int, target_bytes: int) -> dict[str, Any]:
    return {
        "name": "scale",
        "sources": [{"name": "web", "kind": "web", "format": "jsonl", "paths": [str(inp / "*.jsonl")]}],
        "stages": [
            {"langid": {"keep": ["zh", "en"]}},
            {"quality": {"rules": "auto"}},
            {"dedup": {"exact": True, "partitions": partitions}},
            {"minhash": {"threshold": 0.7, "partitions": partitions}},
        ],
        "tokenize": {"tokenizer": str(TOKENIZER), "seq_len": 2048},
        # One input file = one map task at every scale: tasks of the same size, more of them.
        "split": {"target_bytes": target_bytes, "min_tasks_per_cpu": 0, "group_small_files": False},
    }


# --- on a loopback S3 server that counts requests (--s3) --------------------------------------

S3_BUCKET = "dpscale"


def s3_env(s3: Any) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": s3.url,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def start_s3() -> Any:
    import logging

    import boto3

    from tests.support.counting_s3 import CountingS3

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = CountingS3()
    boto3.client("s3", endpoint_url=server.url, **_keys(server)).create_bucket(Bucket=S3_BUCKET)
    return server


def _keys(s3: Any) -> dict[str, str]:
    env = s3_env(s3)
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


def upload_inputs(s3: Any, files: list[Path], prefix: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3.url, **_keys(s3))
    for f in files:
        client.upload_file(str(f), S3_BUCKET, f"{prefix}/in/{f.name}")


def download_run(s3: Any, prefix: str, out: Path) -> None:
    """The run folder, from the store to ``out``, for the reads below (not counted: after the snapshot)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.url, **_keys(s3))
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix + "/")
    keys = sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))
    folders = {k.rsplit("/", i)[0] for k in keys for i in range(1, k.count("/") + 1)}
    for key in keys:
        if key in folders or key.endswith("/"):
            continue  # an empty object standing for a folder (the store has no folders)
        dest = out / key[len(prefix) + 1 :]
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(S3_BUCKET, key, str(dest))


def mirror(env: dict[str, str], uri: str) -> Path:
    """The local mirror of ``uri`` for the run's DATAPIPE_CACHE_DIR (where its tasks open files)."""
    from datapipe.storage.uri import mirror_of

    before = os.environ.get("DATAPIPE_CACHE_DIR")
    os.environ["DATAPIPE_CACHE_DIR"] = env.get("DATAPIPE_CACHE_DIR", before or "")
    try:
        return mirror_of(uri)
    finally:
        if before is not None:
            os.environ["DATAPIPE_CACHE_DIR"] = before


# --- after a run: markers, phases, bytes, plants ----------------------------------------------


def files_opened(trace: Path, run: Path, inputs: Path) -> dict[str, Any]:
    """Files the run's process tree opened for reading and created (bench/scaling/shuffle_files.py's counting of an
    ``strace -f -e trace=openat`` log): under the run folder (on S3: its local mirror, where downloaded
    objects are opened) and under the input folder (on S3: its mirror)."""
    from bench.scaling.shuffle_files import count

    by_folder = count(trace, run)
    run_total = {k: sum(v[k] for v in by_folder.values()) for k in ("opened", "written")}
    ins = count(trace, inputs)
    in_total = {k: sum(v[k] for v in ins.values()) for k in ("opened", "written")}
    return {
        "run": run_total,
        "inputs": in_total,
        "total": {k: run_total[k] + in_total[k] for k in run_total},
        "by_folder": by_folder,
    }


def read_markers(out: Path) -> dict[str, list[dict[str, Any]]]:
    root = out / "_work" / "markers"
    phases: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for path in root.glob("**/*.json"):
        m = json.loads(path.read_text())
        m["_end"] = path.stat().st_mtime
        phases[path.relative_to(root).parts[0]].append(m)
    return phases


def phase_windows(markers: dict[str, list[dict[str, Any]]], end: float) -> list[tuple[str, float, float]]:
    """(phase, start, end) in time.time(): from the first task start (marker time - task seconds) to
    the last marker; after the last one, the driver builds stats.duckdb until the run ends."""
    wins = [
        (p, min(m["_end"] - m.get("seconds", 0.0) for m in ms), max(m["_end"] for m in ms)) for p, ms in markers.items() if ms
    ]
    wins.sort(key=lambda w: w[1])
    if wins:
        wins.append(("stats", wins[-1][2], end))
    return wins


def phase_table(
    markers: dict[str, list[dict[str, Any]]],
    timings: dict[str, float],
    docs: int,
    timeline: list[tuple[float, int, int, int]],
    end: float,
) -> dict[str, dict[str, Any]]:
    windows = phase_windows(markers, end)
    table: dict[str, dict[str, Any]] = {}
    for phase, lo, hi in windows:
        ms = markers.get(phase, [])
        peaks = [m["peak_rss_mib"] for m in ms if "peak_rss_mib" in m]
        grew = [m["peak_rss_mib"] - m["rss_start_mib"] for m in ms if "peak_rss_mib" in m]
        cpu = sum(m.get("cpu_seconds", 0.0) for m in ms)
        in_window = [s for s in timeline if lo <= s[0] <= hi]
        table[phase] = {
            "tasks": len(ms),
            "wall_s": timings.get(phase, hi - lo),
            "task_cpu_s": round(cpu, 2),
            "task_cpu_s_max": max((m.get("cpu_seconds", 0.0) for m in ms), default=0.0),
            "cpu_us_per_doc": cpu / docs * 1e6 if docs else None,
            "task_peak_rss_mib_max": max(peaks, default=None),
            "task_peak_rss_mib_median": statistics.median(peaks) if peaks else None,
            "task_rss_growth_mib_max": max(grew, default=None),
            "peak_scope": sorted({m.get("peak_scope", "?") for m in ms if "peak_rss_mib" in m}),
            "tree_rss_mib_peak": max((s[1] for s in in_window), default=0) / MIB,
            "driver_rss_mib_peak": max((s[2] for s in in_window), default=0) / MIB,
            "largest_process_rss_mib_peak": max((s[3] for s in in_window), default=0) / MIB,
            "samples": len(in_window),
        }
    return table


def bytes_written(out: Path) -> dict[str, int]:
    """Bytes under each output folder (docs, rejected, shards) and each _work folder (map0, shuffle0,
    reduce0-parts, tokens, ...): what a phase writes and the next reads."""
    sizes: dict[str, int] = collections.Counter()
    for path in out.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(out).parts
        key = rel[0] if rel[0] != "_work" else f"_work/{rel[1]}"
        sizes[key] += path.stat().st_size
    return dict(sorted(sizes.items()))


def _status(url_table: Any) -> dict[str, dict[int, str]]:
    """{"doc"|"exact"|"near": {j: reason}} from a table with url and reason columns."""
    out: dict[str, dict[int, str]] = {"doc": {}, "exact": {}, "near": {}, "cluster": {}}
    for url, reason in zip(url_table["url"].to_pylist(), url_table["reason"].to_pylist()):
        host, _, j = url.removeprefix("https://").partition(".example/")
        out[host][int(j)] = reason
    return out


def rejected_reasons(out: Path) -> dict[str, dict[int, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [
        pq.read_table(f, columns=["url", "reason"])
        for f in sorted(glob.glob(str(out / "rejected" / "**" / "*.parquet"), recursive=True))
    ]
    return _status(pa.concat_tables(tables) if tables else pa.table({"url": [], "reason": []}))


def plants_found(corpus: Corpus, removed: dict[str, dict[int, str]], is_dup: Any) -> dict[str, Any]:
    """Recall of each kind of plant and false positives among the other regular documents.
    ``removed``: {"doc"|"exact"|"near": {j: reason}} of every document not kept; ``is_dup(reason)``."""
    result: dict[str, Any] = {}
    originals: set[int] = set()
    for kind, js in (("exact", corpus.exact), ("near", corpus.near)):
        reached = found = both = 0
        for j in js.tolist():
            originals.add(j)
            a, b = removed["doc"].get(j), removed[kind].get(j)
            if (a is not None and not is_dup(a)) or (b is not None and not is_dup(b)):
                continue  # one of the pair was dropped before dedup (langid, quality): not a test of dedup
            reached += 1
            n_dup = (a is not None) + (b is not None)
            found += n_dup == 1
            both += n_dup == 2
        result[kind] = {
            "planted": len(js),
            "reached_dedup": reached,
            "found": found,
            "both_removed": both,
            "recall": found / reached if reached else None,
        }
    reached_regular = sum(
        1 for j in range(corpus.regular) if j not in originals and (removed["doc"].get(j) is None or is_dup(removed["doc"][j]))
    )
    fp = sum(1 for j, r in removed["doc"].items() if j not in originals and is_dup(r))
    result["false_positives"] = {
        "regular_reached_dedup": reached_regular,
        "removed_as_duplicate": fp,
        "rate": fp / reached_regular if reached_regular else None,
    }
    return result


# --- datatrove ------------------------------------------------------------------------------


def run_datatrove(python: str, inp: Path, work: Path, files: int, workers: int, interval: float) -> dict[str, Any]:
    from datapipe.assets.models import ensure_lid_model

    lid = str(ensure_lid_model())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    subprocess.run(
        [
            python,
            "-c",
            "import sys; from datatrove.io import cached_asset_path_or_download as c; "
            "c(sys.argv[1], namespace='lid', subfolder='ft176')",
            lid,
        ],
        env=env,
        capture_output=True,
    )
    cfg = {
        "input": str(inp),
        "work": str(work / "dt-out"),
        "workers": workers,
        "files": files,
        "stages": "all",
        "tokenizer": str(TOKENIZER),
        "eos_token": "<|endoftext|>",
        "lid_model": lid,
    }
    (work / "dt-config.json").write_text(json.dumps(cfg))
    log = work / "datatrove.log"
    r = run_tree([python, str(DT_SCRIPT), str(work / "dt-config.json")], interval, env=env, log=log)
    if r["rc"] != 0:
        raise SystemExit(f"datatrove failed (rc {r['rc']}):\n" + log.read_text(errors="replace")[-3000:])
    lines = log.read_text(errors="replace").strip().splitlines()
    r["block_timings"] = next((json.loads(x)["timings"] for x in reversed(lines) if x.startswith("{")), {})
    return r


def datatrove_removed(dt_out: Path, corpus: Corpus) -> dict[str, dict[int, str]]:
    """What datatrove did not keep: "quality" for documents its filter block dropped, "duplicate" for
    those past it but missing from its final output (removed by exact dedup or MinHash)."""

    def urls(folder: Path) -> set[str]:
        found: set[str] = set()
        for f in sorted(glob.glob(str(folder / "*.jsonl*"))):
            with gzip.open(f, "rt", encoding="utf-8") if f.endswith(".gz") else open(f, encoding="utf-8") as fh:
                for line in fh:
                    d = json.loads(line)
                    found.add(d.get("metadata", {}).get("url") or d.get("url"))
        return found

    filtered, final = urls(dt_out / "filtered"), urls(dt_out / "final")
    removed: dict[str, dict[int, str]] = {"doc": {}, "exact": {}, "near": {}}
    for path in corpus.files:
        with open(path, encoding="utf-8") as fh:
            for raw in fh:
                url = json.loads(raw)["url"]
                if url not in final:
                    host, _, j = url.removeprefix("https://").partition(".example/")
                    removed[host][int(j)] = "duplicate" if url in filtered else "quality"
    return removed


# --- one scale --------------------------------------------------------------------------------


@dataclass
class Point:
    """One run: ``docs`` documents written (before the plants) into ``files`` input files (= map tasks =
    dedup and MinHash partitions), ``cluster`` of them near-copies of one page; ``seed`` picks the
    documents (the same seed and count: the same documents, however many files they are cut into)."""

    label: Any  # the scale (1, 4, 16) or "4096/64" (--points)
    docs: int
    files: int
    seed: int
    cluster: int = 0


def parse_points(text: str) -> list[Point]:
    """``DOCS:TASKS[:cK]`` comma-separated: e.g. ``4096:64,4096:512,34096:64:c30000``."""
    points = []
    for item in text.split(","):
        docs, tasks, *rest = item.split(":")
        cluster = int(rest[0].removeprefix("c")) if rest else 0
        label = f"{int(docs)}/{int(tasks)}" + (f"/c{cluster}" if cluster else "")
        points.append(Point(label, int(docs), int(tasks), 0, cluster))
    return points


def add_cluster(corpus: Corpus, copies: int, seed: int) -> None:
    """``copies`` near-copies of the corpus's first document (a boilerplate page copied across a crawl),
    one per file in turn at the files' ends: each the page with a short phrase inserted at two random
    points (so most are not exact copies of each other; shingle Jaccard to the page about 0.9).
    URLs ``https://cluster.example/<i>``."""
    rng = np.random.default_rng(seed + 1)
    first = corpus.files[0].open(encoding="utf-8").readline()
    page = json.loads(first)["text"]
    lang = "zh" if sum("\u4e00" <= ch <= "\u9fff" for ch in page) > len(page) // 10 else "en"
    handles = [f.open("a", encoding="utf-8") for f in corpus.files]
    try:
        for i in range(copies):
            text = near_copy(near_copy(page, lang, rng), lang, rng)
            line = json.dumps({"text": text, "url": f"https://cluster.example/{i}"}, ensure_ascii=False) + "\n"
            handles[i % len(handles)].write(line)
            corpus.bytes += len(line.encode())
    finally:
        for h in handles:
            h.close()
    corpus.cluster = copies


def run_scale(
    point: Point, args: argparse.Namespace, base: Any, work: Path, dt_python: str | None, s3: Any = None
) -> dict[str, Any]:
    scale, n, files = point.label, point.docs - point.cluster, point.files
    inp = work / "input"
    print(
        f"\n--- {scale}: writing {n:,} regular documents + plants"
        + (f" + {point.cluster:,} near-copies of one page" if point.cluster else "")
        + f" into {files} files under {inp}",
        flush=True,
    )
    corpus = write_corpus(inp, base, n, files, rate=args.plant_rate, p=args.perturb, seed=point.seed)
    if point.cluster:
        add_cluster(corpus, point.cluster, point.seed)
    largest = max(f.stat().st_size for f in corpus.files)
    partitions = files
    print(
        f"    {corpus.docs:,} documents, {corpus.bytes / 1e6:,.0f} MB, written in {corpus.seconds:.0f} s; "
        f"{len(corpus.files)} map tasks (largest file {largest / MIB:.1f} MiB), {partitions} partitions",
        flush=True,
    )
    import yaml

    config = pipeline_config(inp, partitions, largest + MIB)
    if args.fan_in is not None:  # merge levels at a scale where the default would not merge
        config["split"]["shuffle_fan_in"] = args.fan_in
    if args.partition_rows is not None:  # partition tasks of this many rows (default: the pipeline's)
        config["split"]["partition_rows"] = args.partition_rows
    out = work / "dp-out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    target = str(out)
    if s3 is not None:  # inputs and the run folder on the counting loopback S3 server
        env.update(s3_env(s3))
        prefix = f"scale-{str(scale).replace('/', '-')}-{os.getpid()}"
        upload_inputs(s3, corpus.files, prefix)
        config["sources"][0]["paths"] = [f"s3://{S3_BUCKET}/{prefix}/in/*.jsonl"]
        target = f"s3://{S3_BUCKET}/{prefix}/run"
        s3_before = s3.snapshot()
    (work / "pipeline.yaml").write_text(yaml.safe_dump(config))
    cmd = [
        sys.executable,
        "-m",
        "datapipe.cli",
        "run",
        str(work / "pipeline.yaml"),
        "-o",
        target,
        "--num-cpus",
        str(args.cpus),
        "--no-progress",
        "--fresh",
    ]
    timeline: list[tuple[float, int, int, int]] = []
    load = os.getloadavg()
    trace = work / "opens.trace"
    if args.count_opens:  # every successful openat of the tree; only stops the tracees on openat
        cmd = ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", str(trace), *cmd]
    r = run_tree(cmd, args.interval, env=env, log=work / "datapipe.log", timeline=timeline, wrapped=args.count_opens)
    end = time.time()
    if r["rc"] != 0:
        raise SystemExit(f"datapipe run failed (rc {r['rc']}):\n" + (work / "datapipe.log").read_text()[-3000:])
    if args.count_opens:
        r["cpu_s"] -= r["wrapper_cpu_s"]  # strace's own CPU is not the pipeline's
    opens = None
    if args.count_opens:
        opens = files_opened(
            trace,
            out if s3 is None else mirror(env, target),
            inp if s3 is None else mirror(env, f"s3://{S3_BUCKET}/{prefix}/in"),
        )
        trace.unlink()
    store = None
    if s3 is not None:
        store = s3.since(s3_before)  # before this bench's own download of the run folder
        download_run(s3, f"{prefix}/run", out)
    run = json.loads((out / "run.json").read_text())
    docs = run["counts"]["documents"]
    assert docs == corpus.docs, (docs, corpus.docs)
    markers = read_markers(out)
    phases = phase_table(markers, run["timings"], docs, timeline, end)
    task_peaks = [m["peak_rss_mib"] for ms in markers.values() for m in ms if "peak_rss_mib" in m]
    removed = rejected_reasons(out)
    found = plants_found(corpus, removed, lambda reason: reason in DUP_REASONS)
    sizes = bytes_written(out)
    task_cpu = sum(p["task_cpu_s"] for p in phases.values())
    res = {
        "scale": scale,
        "corpus": corpus.summary(),
        "map_tasks": run["split"]["map_tasks"],
        "partitions": partitions,
        "target_bytes": largest + MIB,
        "cpus": args.cpus,
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
        "wall_s": r["wall_s"],
        "tree_cpu_s": r["cpu_s"],
        "cpu_method": r["cpu_method"],
        "task_cpu_s": task_cpu,
        "tree_peak_rss_mib": r["peak_rss_mib"],
        "tree_peak_pss_mib": r["peak_pss_mib"],
        "docs": docs,
        "kept": run["counts"]["kept"],
        "tokens": sum(s["tokens"] for s in run["counts"]["sources"].values()),
        "docs_per_s_per_core": docs / r["wall_s"] / args.cpus,
        "docs_per_cpu_s": docs / r["cpu_s"],
        "tree_cpu_us_per_doc": r["cpu_s"] / docs * 1e6,
        "task_cpu_us_per_doc": task_cpu / docs * 1e6,
        "wall_us_per_doc": r["wall_s"] / docs * 1e6,
        "task_peak_rss_mib_max": max(task_peaks, default=None),
        "driver_peak_rss_mib": max((s[2] for s in timeline), default=0) / MIB,
        # The largest single process of the tree: the largest RSS of any process at any sample (driver,
        # raylet, GCS or a worker), or a task's own peak (VmHWM, between samples) where that is larger.
        "largest_process_rss_mib_peak": max(
            max((max(s[2], s[3]) for s in timeline), default=0) / MIB, max(task_peaks, default=0.0)
        ),
        "largest_process_rss_mib_sampled": max((max(s[2], s[3]) for s in timeline), default=0) / MIB,
        "driver_cpu_s": r["driver_cpu_s"],
        # Of it, Ray's own threads (submission, results, gRPC, timers: beside the driver's work, not in
        # turn) and the rest, the driver's own threads (bench/_support/proctree.py, sampled per thread).
        "driver_ray_threads_cpu_s": r["driver_threads_cpu_s"]["ray"],
        "driver_own_cpu_s": (r["driver_cpu_s"] or 0.0) - r["driver_threads_cpu_s"]["ray"],
        "driver_cpu_us_per_doc": (r["driver_cpu_s"] or 0.0) / docs * 1e6,
        # The driver's own threads' CPU by section of the run, as the driver itself recorded it in
        # run.json (runtime/own_cpu.py): "start" (imports, planning, Ray's start), "phase:<name>:<part>"
        # (plan: up to its first task handed over; submit: handing its tasks over; results: up to the
        # last marker adopted; commit: the rest), "executor_exit", "end" (checks, statistics, sweep).
        # Runs before 2026-11-27 17:30 UTC recorded each phase whole, as "phase:<name>".
        "driver_sections_s": run.get("driver_cpu_s"),
        "tasks": sum(len(ms) for ms in markers.values()),
        "wrapper_cpu_s": r["wrapper_cpu_s"],
        "phases": phases,
        "bytes": sizes,
        "bytes_per_doc": {k: v / docs for k, v in sizes.items()},
        "found": found,
        "stage_counts": run["counts"]["stages"],
    }
    if point.cluster:  # the planted cluster: all but one copy dropped as near (or exact) duplicates
        res["cluster"] = {
            "copies": point.cluster,
            "removed_as_duplicate": sum(1 for r in removed["cluster"].values() if r in DUP_REASONS),
            "removed_otherwise": sum(1 for r in removed["cluster"].values() if r not in DUP_REASONS),
        }
        print(f"    planted cluster: {res['cluster']}", flush=True)
    if opens is not None:
        res["opens"] = opens
        res["opens_per_doc"] = {k: v / docs for k, v in opens["total"].items()}
        print(
            f"    files opened per document: {opens['total']['opened'] / docs:.3f} (run folder "
            f"{opens['run']['opened'] / docs:.3f}, inputs {opens['inputs']['opened'] / docs:.3f}); written "
            f"{opens['total']['written'] / docs:.3f} (strace's own CPU {r['wrapper_cpu_s']:.0f} s left out)",
            flush=True,
        )
    if store is not None:
        res["s3"] = store
        res["s3_per_doc"] = {k: v / docs for k, v in store.items()}
        print(
            "    store per document: "
            + ", ".join(f"{k} {v / docs:.3f}" for k, v in store.items() if not k.startswith("bytes"))
            + f"; bytes read {store['bytes_read'] / docs:,.0f}, written {store['bytes_written'] / docs:,.0f}",
            flush=True,
        )
    print(
        f"    datapipe: wall {r['wall_s']:.0f} s, tree CPU {r['cpu_s']:.0f} s, {res['docs_per_s_per_core']:.0f} "
        f"docs/s per core, {res['docs_per_cpu_s']:.0f} docs per CPU s; largest task peak "
        f"{res['task_peak_rss_mib_max']:.0f} MiB, driver peak {res['driver_peak_rss_mib']:.0f} MiB, largest "
        f"process {res['largest_process_rss_mib_peak']:.0f} MiB; "
        f"tree peak RSS {r['peak_rss_mib']:.0f} MiB "
        f"(load average {load[0]:.1f} before, {res['loadavg_after'][0]:.1f} after)",
        flush=True,
    )
    print_found("datapipe", found)
    if dt_python:
        print(f"    datatrove on the same {scale}x corpus, {args.cpus} workers ...", flush=True)
        dt = run_datatrove(dt_python, inp, work, len(corpus.files), args.cpus, args.interval)
        removed = datatrove_removed(work / "dt-out", corpus)
        dt["found"] = plants_found(corpus, removed, lambda reason: reason == "duplicate")
        dt["kept"] = corpus.docs - sum(len(v) for v in removed.values())
        res["datatrove"] = {k: v for k, v in dt.items() if k != "rc"}
        print(
            f"    datatrove: wall {dt['wall_s']:.0f} s, tree CPU {dt['cpu_s']:.0f} s, tree peak RSS "
            f"{dt['peak_rss_mib']:.0f} MiB, kept {dt['kept']:,} (datapipe {res['kept']:,}); blocks: "
            + ", ".join(f"{k} {v:.0f}s" for k, v in dt["block_timings"].items()),
            flush=True,
        )
        print_found("datatrove", dt["found"])
    return res


def print_found(side: str, found: dict[str, Any]) -> None:
    e, nr, fp = found["exact"], found["near"], found["false_positives"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    print(
        f"    {side} plants found: exact {e['found']:,}/{e['reached_dedup']:,} ({pct(e['recall'])}), near "
        f"{nr['found']:,}/{nr['reached_dedup']:,} ({pct(nr['recall'])}); false positives "
        f"{fp['removed_as_duplicate']:,} of {fp['regular_reached_dedup']:,} regular documents ({pct(fp['rate'])})",
        flush=True,
    )


# --- report -----------------------------------------------------------------------------------


def _mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


# (measure, how to get it from one scale's result, format, the limit on last/first or None)
ACCEPTANCE: list[tuple[str, Any, str, float | None]] = [
    ("process-tree CPU us", lambda r: r["tree_cpu_us_per_doc"], "{:,.0f}", 1.15),
    ("tasks' own CPU us", lambda r: r["task_cpu_us_per_doc"], "{:,.0f}", None),
    ("store bytes read", lambda r: r.get("s3_per_doc", {}).get("bytes_read"), "{:,.0f}", 1.15),
    ("store bytes written", lambda r: r.get("s3_per_doc", {}).get("bytes_written"), "{:,.0f}", None),
    ("files opened", lambda r: r.get("opens_per_doc", {}).get("opened"), "{:.3f}", 1.15),
    ("files written", lambda r: r.get("opens_per_doc", {}).get("written"), "{:.3f}", None),
    ("store GET", lambda r: r.get("s3_per_doc", {}).get("GET"), "{:.4f}", 1.15),
    ("store PUT", lambda r: r.get("s3_per_doc", {}).get("PUT"), "{:.4f}", 1.15),
    ("store LIST", lambda r: r.get("s3_per_doc", {}).get("LIST"), "{:.4f}", 1.15),
    ("store HEAD", lambda r: r.get("s3_per_doc", {}).get("HEAD"), "{:.4f}", 1.15),
    ("driver CPU us", lambda r: r.get("driver_cpu_us_per_doc"), "{:,.0f}", None),
    ("driver peak RSS MiB (whole run)", lambda r: r["driver_peak_rss_mib"], "{:,.0f}", 1.2),
    ("largest task peak RSS MiB", lambda r: r["task_peak_rss_mib_max"], "{:,.0f}", 1.2),
]


def acceptance_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's acceptance measures, first and last scale and their ratio, plus tasks and plants found."""
    first, last = results[0], results[-1]
    rows: list[dict[str, Any]] = []
    for name, get, fmt, limit in ACCEPTANCE:
        a, b = get(first), get(last)
        if a is None or b is None:
            continue
        rows.append(
            {
                "measure": name,
                "first": fmt.format(a),
                "last": fmt.format(b),
                "ratio": b / a if a else None,
                "limit": limit,
            }
        )

    def plants(r: dict[str, Any]) -> str:
        f = r["found"]
        return (
            f"exact {f['exact']['found']:,}/{f['exact']['reached_dedup']:,}, near {f['near']['found']:,}/"
            f"{f['near']['reached_dedup']:,}, false positives {f['false_positives']['removed_as_duplicate']}"
        )

    def size(r: dict[str, Any]) -> str:
        return f"{r['docs']:,}; {r['map_tasks']} / {r['partitions']}; {r.get('tasks', 0):,}"

    rows.insert(0, {"measure": "documents; map tasks / partitions; tasks run", "first": size(first), "last": size(last)})
    rows.append({"measure": "planted duplicates found", "first": plants(first), "last": plants(last)})
    for row in rows:
        row.setdefault("ratio", None)
        row.setdefault("limit", None)
    return rows


def report(results: list[dict[str, Any]], h: Harness) -> dict[str, Any]:
    first, last = results[0], results[-1]
    s0, s1 = first["scale"], last["scale"]
    phases = phase_order(results)
    print("\nper phase: tasks, task CPU us per document, largest per-task peak RSS MiB (median), tree peak RSS MiB")
    head = f"{'phase':<44}" + "".join(
        f"{str(r['scale']) + 'x tasks':>9}{'us/doc':>8}{'task MiB':>14}{'tree':>7}" for r in results
    )
    print(head)
    for p in phases:
        cells = ""
        for r in results:
            ph = r["phases"].get(p)
            if ph is None:
                cells += f"{'-':>9}{'-':>8}{'-':>14}{'-':>7}"
                continue
            us = "-" if p == "stats" else f"{ph['cpu_us_per_doc']:.0f}"
            task = (
                "-"
                if ph["task_peak_rss_mib_max"] is None
                else f"{ph['task_peak_rss_mib_max']:.0f} ({ph['task_peak_rss_mib_median']:.0f})"
            )
            tree = f"{ph['tree_rss_mib_peak']:.0f}" if ph["samples"] else "-"  # shorter than the interval
            cells += f"{ph['tasks']:>9}{us:>8}{task:>14}{tree:>7}"
        print(f"{p + ' ' + describe(p):<44.44}{cells}")
    ratios = {
        "tree_cpu_per_doc": last["tree_cpu_us_per_doc"] / first["tree_cpu_us_per_doc"],
        "task_cpu_per_doc": last["task_cpu_us_per_doc"] / first["task_cpu_us_per_doc"],
        "wall_per_doc": last["wall_us_per_doc"] / first["wall_us_per_doc"],
        "task_peak_rss": last["task_peak_rss_mib_max"] / first["task_peak_rss_mib_max"],
        "driver_peak_rss": last["driver_peak_rss_mib"] / first["driver_peak_rss_mib"],
    }
    if "s3_per_doc" in first and "s3_per_doc" in last:  # --s3: store requests and bytes per document
        for k, v in first["s3_per_doc"].items():
            if v:
                ratios[f"s3_{k}_per_doc"] = last["s3_per_doc"][k] / v
    per_phase_peak = {
        p: last["phases"][p]["task_peak_rss_mib_max"] / first["phases"][p]["task_peak_rss_mib_max"]
        for p in phases
        if p in first["phases"]
        and p in last["phases"]
        and first["phases"][p]["task_peak_rss_mib_max"]
        and last["phases"][p]["task_peak_rss_mib_max"]
    }
    print()
    h.ratio(f"per-doc tree CPU {s1}x/{s0}x", [ratios["tree_cpu_per_doc"]], target="~1.0 (flat within noise)")
    h.ratio(f"per-doc task CPU {s1}x/{s0}x", [ratios["task_cpu_per_doc"]], target="~1.0 (flat within noise)")
    h.ratio(f"per-doc wall {s1}x/{s0}x", [ratios["wall_per_doc"]], target="~1.0 (load-dependent)")
    h.ratio(f"per-task peak RSS {s1}x/{s0}x (largest task of any phase)", [ratios["task_peak_rss"]], target="<= 1.2")
    h.ratio(f"driver peak RSS {s1}x/{s0}x (markers, planning, statistics)", [ratios["driver_peak_rss"]])
    for k in ("GET", "PUT", "LIST", "HEAD", "bytes_read", "bytes_written"):
        if f"s3_{k}_per_doc" in ratios:
            h.ratio(f"store {k} per doc {s1}x/{s0}x (--s3)", [ratios[f"s3_{k}_per_doc"]], target="<= 1.15")
    print("    per-task peak RSS by phase: " + ", ".join(f"{p} {v:.2f}" for p, v in per_phase_peak.items()))
    dt = first.get("datatrove")
    if dt:
        h.ratio(f"{s0}x wall datatrove/datapipe", [dt["wall_s"] / first["wall_s"]], target="> 1")
        h.ratio(f"{s0}x tree CPU datatrove/datapipe", [dt["cpu_s"] / first["tree_cpu_s"]], target="> 1")
        h.ratio(f"{s0}x peak tree RSS datapipe/datatrove", [first["tree_peak_rss_mib"] / dt["peak_rss_mib"]])
    acceptance = acceptance_rows(results)
    print(f"\nacceptance table ({s1}x against {s0}x, per document unless said):")
    print(f"| measure | {s0}x | {s1}x | {s1}x/{s0}x | limit | |")
    print("|---|---|---|---|---|---|")
    for row in acceptance:
        limit = f"<= {row['limit']}" if row["limit"] else "-"
        ok = "" if row["limit"] is None or row["ratio"] is None else ("ok" if row["ratio"] <= row["limit"] else "FAILS")
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"| {row['measure']} | {row['first']} | {row['last']} | {ratio} | {limit} | {ok} |")
    print("\nmarkdown rows for docs/scaling.md (scale table):")
    print(
        "| scale | documents | input MB | map tasks / partitions | wall s | tree CPU s | docs/s per core (wall) "
        "| docs per CPU s | largest task peak RSS MiB | driver peak RSS MiB | tree peak RSS MiB | exact / near found "
        "| false positives |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["found"]
        print(
            f"| {r['scale']}x | {r['docs']:,} | {r['corpus']['bytes'] / 1e6:,.0f} | {r['map_tasks']} / "
            f"{r['partitions']} | {r['wall_s']:,.0f} | {r['tree_cpu_s']:,.0f} | {r['docs_per_s_per_core']:,.0f} | "
            f"{r['docs_per_cpu_s']:,.0f} | {_mib(r['task_peak_rss_mib_max'])} | {_mib(r['driver_peak_rss_mib'])} | "
            f"{_mib(r['tree_peak_rss_mib'])} | "
            f"{f['exact']['found']:,}/{f['exact']['reached_dedup']:,} / {f['near']['found']:,}/"
            f"{f['near']['reached_dedup']:,} | {f['false_positives']['removed_as_duplicate']} |"
        )
    print(
        "\nmarkdown rows for docs/scaling.md (per phase: largest per-task peak RSS, MiB (stats: the driver's);"
        " task CPU us per document):"
    )
    print(
        "| phase | "
        + " | ".join(f"{r['scale']}x tasks | {r['scale']}x task MiB | {r['scale']}x us/doc" for r in results)
        + f" | task MiB {s1}x/{s0}x |"
    )
    print("|---|" + "---|" * (3 * len(results) + 1))
    for p in phases:
        cells = []
        for r in results:
            ph = r["phases"].get(p, {})
            us = "-" if p == "stats" or not ph else f"{ph['cpu_us_per_doc']:.0f}"
            peak = ph.get("driver_rss_mib_peak") if p == "stats" else ph.get("task_peak_rss_mib_max")
            cells.append(f"{ph.get('tasks', '-')} | {_mib(peak)} | {us}")
        ratio = f"{per_phase_peak[p]:.2f}" if p in per_phase_peak else "-"
        print(f"| {p} ({describe(p)}) | " + " | ".join(cells) + f" | {ratio} |")
    return {"ratios": ratios, "per_phase_peak_ratio": per_phase_peak, "acceptance": acceptance}


def fit_cpu(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Least squares CPU = a + b*(map tasks + partitions) + c*documents over the runs without a planted
    cluster (c left out when every run has the same documents), with each run's residual."""
    runs = [r for r in results if "cluster" not in r]
    x = np.array([r["map_tasks"] + r["partitions"] for r in runs], float)
    d = np.array([r["docs"] for r in runs], float)
    y = np.array([r["tree_cpu_s"] for r in runs], float)
    cols = [np.ones_like(x), x] + ([d] if len(set(d.tolist())) > 1 else [])
    coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), y, rcond=None)
    pred = np.stack(cols, axis=1) @ coef
    return {
        "a_s": float(coef[0]),
        "b_s_per_task_or_partition": float(coef[1]),
        "c_s_per_document": float(coef[2]) if len(coef) > 2 else None,
        "runs": [
            {
                "label": r["scale"],
                "x": int(xi),
                "docs": int(di),
                "cpu_s": float(yi),
                "fit_s": float(pi),
                "residual_s": float(yi - pi),
            }
            for r, xi, di, yi, pi in zip(runs, x, d, y, pred)
        ],
    }


def points_report(results: list[dict[str, Any]], h: Harness) -> dict[str, Any]:
    """--points: the table (tasks + partitions, CPU, wall, memory), the CPU fit, the marginal CPU per
    added task or partition between neighbouring runs of the same documents, and the memory ratios."""
    print(
        "\n| documents | map tasks / partitions | tasks run | tree CPU s | of it: tasks / driver / rest (Ray, worker "
        "starts) | wall s | largest process MiB | largest task MiB | driver MiB | load before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        driver = r.get("driver_cpu_s") or 0.0
        rest = r["tree_cpu_s"] - r["task_cpu_s"] - driver
        print(
            f"| {r['docs']:,}{' (cluster ' + format(r['cluster']['copies'], ',') + ')' if 'cluster' in r else ''} | "
            f"{r['map_tasks']} / {r['partitions']} | {r['tasks']:,} | {r['tree_cpu_s']:,.1f} | "
            f"{r['task_cpu_s']:,.1f} / {driver:,.1f} / {rest:,.1f} | {r['wall_s']:,.0f} | "
            f"{r['largest_process_rss_mib_peak']:,.0f} | {_mib(r['task_peak_rss_mib_max'])} | {r['driver_peak_rss_mib']:,.0f} | "
            f"{r['loadavg_before'][0]:.1f} / {r['loadavg_after'][0]:.1f} |"
        )
    fit = fit_cpu(results)
    c = fit["c_s_per_document"]
    print(
        f"\nfit: CPU = {fit['a_s']:.2f} s + {fit['b_s_per_task_or_partition'] * 1000:.1f} ms x (tasks + partitions)"
        + (f" + {c * 1e6:.0f} us x documents" if c is not None else " (one document count: c is in a)")
    )
    for run in fit["runs"]:
        print(f"    {run['label']}: {run['cpu_s']:.1f} s, fit {run['fit_s']:.1f} s, residual {run['residual_s']:+.1f} s")
    marginal = []
    same = [r for r in results if "cluster" not in r]
    for docs in sorted({r["docs"] for r in same}):
        runs = sorted((r for r in same if r["docs"] == docs), key=lambda r: r["map_tasks"])
        for a, b in zip(runs, runs[1:]):
            dx = (b["map_tasks"] + b["partitions"]) - (a["map_tasks"] + a["partitions"])
            m = (b["tree_cpu_s"] - a["tree_cpu_s"]) / dx
            marginal.append({"from": a["scale"], "to": b["scale"], "ms_per_task_or_partition": m * 1000})
            print(f"    marginal CPU {a['scale']} -> {b['scale']}: {m * 1000:.1f} ms per added task or partition")
    same_docs = sorted((r for r in same if r["docs"] == same[0]["docs"]), key=lambda r: r["map_tasks"])
    first = same_docs[0]["largest_process_rss_mib_peak"]
    per_point = {str(r["scale"]): r["largest_process_rss_mib_peak"] / first for r in same_docs[1:]}
    for label, ratio in per_point.items():
        h.ratio(f"largest process peak RSS: {label} / {same_docs[0]['scale']} (same documents)", [ratio], target="<= 1.25")
    mem = max(per_point.values(), default=1.0)
    out: dict[str, Any] = {"fit": fit, "marginal": marginal, "memory_ratio_tasks": mem, "memory_ratios": per_point}
    for r in results:
        if "cluster" not in r:
            continue
        twin = next((d for d in same if d["docs"] == r["docs"] and d["map_tasks"] == r["map_tasks"]), None)
        if twin is None:
            continue
        ratio = r["largest_process_rss_mib_peak"] / twin["largest_process_rss_mib_peak"]
        task_ratio = r["task_peak_rss_mib_max"] / twin["task_peak_rss_mib_max"]
        h.ratio(f"largest process peak RSS: {r['scale']} / {twin['scale']} (distinct)", [ratio], target="<= 1.25")
        h.ratio(f"largest task peak RSS: {r['scale']} / {twin['scale']} (distinct)", [task_ratio], target="<= 1.25")
        out.setdefault("cluster_ratios", []).append(
            {"cluster": r["scale"], "distinct": twin["scale"], "largest_process": ratio, "largest_task": task_ratio}
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-docs", type=int, default=125_000, help="regular documents at 1x (default 125,000)")
    ap.add_argument("--scales", default="1,4,16", help="comma-separated multiples of --base-docs (default 1,4,16)")
    ap.add_argument(
        "--points",
        help="instead of --scales: runs of DOCS:TASKS[:cK] (documents before the plants, input files = map tasks = "
        "partitions, K of the documents near-copies of one page), e.g. 3724:64,3724:512,3724:2048; the same DOCS "
        "are the same documents at every TASKS. Prints the fit CPU = a + b*(tasks + partitions) + c*documents",
    )
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="Ray CPUs and datatrove workers")
    ap.add_argument(
        "--files-per-scale", type=int, default=8, help="input files (= map tasks) and dedup/minhash partitions per 1x (default 8)"
    )
    ap.add_argument("--plant-rate", type=float, default=0.05, help="exact and near plants, each, per regular doc")
    ap.add_argument("--perturb", type=float, default=0.2, help="share of Han characters and words replaced per copy")
    ap.add_argument("--max-chars", type=int, default=5000, help="base documents cut at a paragraph end to this")
    ap.add_argument("--datatrove-python", help="python of a datatrove venv: run datatrove on the first scale too")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between /proc samples")
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where corpora and runs go")
    ap.add_argument("--keep", action="store_true", help="keep each scale's folder (default: deleted after it)")
    ap.add_argument(
        "--s3",
        action="store_true",
        help="inputs and run folder on a loopback S3 server (moto) that counts requests: prints GET/PUT/LIST/HEAD "
        "and bytes per document",
    )
    ap.add_argument("--fan-in", type=int, help="split.shuffle_fan_in (default: the pipeline's, 256)")
    ap.add_argument("--partition-rows", type=int, help="split.partition_rows (default: the pipeline's, 4M)")
    ap.add_argument(
        "--count-opens",
        action="store_true",
        help="run datapipe under strace -f (openat only) and count the files its tasks open and write per document",
    )
    ap.add_argument(
        "--paper",
        type=Path,
        metavar="JSON",
        help="print docs/scaling.md's 10 TB estimate from a JSON this script wrote, and exit",
    )
    ap.add_argument("--report", type=Path, nargs="+", metavar="JSON", help="print --points' report from JSONs it wrote, and exit")
    args = add_args(ap, repeats=1).parse_args()
    if args.report:  # the runs of one or more --points JSONs (e.g. a planted-cluster pair run apart), reported together
        sources = {str(path): json.loads(path.read_text()) for path in args.report}
        runs = [r for d in sources.values() for r in d["extra"]["scales"]]
        h = Harness("scale", args, libs=["ray"], note="report of " + ", ".join(sources))
        summary = points_report(runs, h)
        # --json: the runs and the report in one file, with each source run's environment (commit, argv, load).
        h.finish(scales=runs, **summary, sources={k: d["env"] for k, d in sources.items()})
        return 0
    if args.paper:
        from bench._support.scale_paper import estimate

        print(estimate(args.paper))
        return 0
    if args.points:
        points = parse_points(args.points)
    else:
        points = [Point(int(x), int(x) * args.base_docs, int(x) * args.files_per_scale, int(x)) for x in args.scales.split(",")]
    scales = [pt.label for pt in points]
    h = Harness(
        "scale",
        args,
        libs=["ray", "tokenizers", "fasttext-numpy2", "numba", "duckdb"],
        note=f"scales {scales} x {args.base_docs:,} regular docs (+{args.plant_rate:.0%} exact and "
        f"{args.plant_rate:.0%} near plants), {args.cpus} CPUs",
    )
    dt_python = args.datatrove_python
    if dt_python and not Path(dt_python).exists():
        sys.exit(f"--datatrove-python {dt_python}: not found")
    t = time.perf_counter()
    base = load_base(args.max_chars)
    print(
        f"base: {len(base):,} real documents (zh {base.lang.count('zh'):,}, en {base.lang.count('en'):,}), "
        f"{base.mean_bytes():,.0f} bytes on average, prepared in {time.perf_counter() - t:.0f} s"
    )
    sim = similarity_check(base, args.perturb)
    c, nr = sim["copies_minhash"], sim["near_minhash"]
    print(
        f"perturbation check ({sim['pairs']:,} sampled pairs, MinHash 128 perms, threshold {sim['threshold']}): "
        f"two copies of one document mean {c['mean']:.3f}, p99 {c['p99']:.3f}, max {c['max']:.3f} "
        f"({c['at_or_above_threshold']} at or above the threshold; exact shingle Jaccard max "
        f"{sim['copies_true_jaccard']['max']:.3f}); a near plant vs its original mean {nr['mean']:.3f}, "
        f"p01 {nr['p01']:.3f}, min {nr['min']:.3f} (exact shingle Jaccard min {sim['near_true_jaccard']['min']:.3f})",
        flush=True,
    )
    s3 = start_s3() if args.s3 else None
    results = []
    for i, point in enumerate(points):
        work = Path(tempfile.mkdtemp(prefix=f"dp-scale-{str(point.label).replace('/', '-')}-", dir=args.tmp))
        try:
            results.append(run_scale(point, args, base, work, dt_python if i == 0 else None, s3))
            if args.json:  # each finished scale at once: a run stopped later keeps it (--paper reads this too)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(
                    json.dumps(
                        {"bench": "scale", "env": h.env, "extra": {"partial": True, "similarity": sim, "scales": results}},
                        indent=1,
                        default=str,
                    )
                    + "\n"
                )
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    summary = points_report(results, h) if args.points else report(results, h)
    h.finish(
        similarity=sim,
        scales=results,
        **summary,
        base_docs=args.base_docs,
        base_real_docs=len(base),
        files_per_scale=args.files_per_scale,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
