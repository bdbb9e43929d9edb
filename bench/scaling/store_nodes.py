"""Do the bytes a run moves through the object store per document stay flat as nodes are added?

    python -m bench.scaling.store_nodes [--docs 4000] [--files 12] [--nodes 1,2,3]
        [--baseline-code /tmp/main-copy] [--repeats 1] [--json bench/results/store_nodes.json]

The same run (real documents of ../shared/data/corpus: the first ``--docs`` lines of its English
and Chinese Wikipedia files, in ``--files`` JSONL files; length filter, exact dedup, MinHash,
tokenize; one map task per file, ``--files`` partitions, the map tasks' runs merged ``--fan-in`` at a time) with its
inputs and run folder on a loopback S3 server that counts what it answers
(tests/support/counting_s3.py), on a loopback Ray cluster of 1, 2 and 3 nodes (``ray.cluster_utils``,
one CPU each). Each node has its own cache folder, so its own mirror of the run folder, as
separate machines would; the driver has its own too. A file a task of one node wrote and a task of
another reads has to come from the store.

Printed per node count: GET bytes per document (what crossed the store towards readers), GET and
all requests per document, PUT bytes per document, and the ratios 2/1 and 3/1 nodes; the GET bytes
by run-folder folder (which files crossed). With ``--baseline-code PATH`` (a checkout of the code
before, e.g. ``git archive main | tar -x -C /tmp/main-copy``) each node count runs that code and
this one, interleaved (baseline first), and every run's outputs are compared with the first run of
the same code (shards, kept and rejected rows, the documents table, the shard manifest: they
must be identical), and the two codes' with each other.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._support.harness import Harness, add_args, fmt
from bench._support.paths import ROOT, SHARED

CORPUS = SHARED / "corpus"
TOKENIZER = ROOT / "tokenizer" / "demo.json"
BUCKET = "dpnodes"
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def write_inputs(folder: Path, docs: int, files: int) -> list[Path]:
    """The first lines of English (3/4) and Chinese (1/4) Wikipedia, alternating, in ``files`` files."""
    en = (CORPUS / "en_wikipedia.jsonl").open(encoding="utf-8")
    zh = (CORPUS / "zh_wikipedia.jsonl").open(encoding="utf-8")
    lines = [next(zh) if i % 4 == 3 else next(en) for i in range(docs)]
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-docs // files)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:03d}.jsonl"
        path.write_text("".join(lines[i * per : (i + 1) * per]), encoding="utf-8")
        paths.append(path)
    return paths


def write_salted(folder: Path, megabytes: float, files: int, seed: int = 0) -> tuple[list[Path], dict[str, Any]]:
    """At least ``megabytes`` MB of real text: the documents of ../shared/data/corpus (~22.7k zh/en after the
    length cut, ~38 MB a pass) copied as many times as it takes, each copy with its own URL (the copy's
    number: the salt) and a fifth of its Han characters and words replaced by ones drawn by corpus
    frequency (bench/_support/scale_corpus.py), so copies are neither exact nor near duplicates of each
    other (shingle Jaccard ~0.06), plus 5% exact and 5% near plants, in ``files`` JSONL files."""
    from bench._support.scale_corpus import load_base, write_corpus

    base = load_base()
    n = int(megabytes * 1e6 / (base.mean_bytes() * 1.1 + 60) / 1.1) + 1
    corpus = write_corpus(folder, base, n, files, seed=seed)
    while corpus.bytes < megabytes * 1e6:  # the estimate fell short: 5% more documents
        for f in corpus.files:
            f.unlink()
        n = int(n * 1.05) + 1
        corpus = write_corpus(folder, base, n, files, seed=seed)
    return corpus.files, corpus.summary()


def pipeline(data: str, files: int, fan_in: int, partition_rows: int | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "nodes",
        "sources": [{"name": "wiki", "kind": "web", "format": "jsonl", "paths": [f"{data}/*.jsonl"]}],
        "stages": [
            {"length": {"min_chars": 20}},
            {"dedup": {"exact": True, "partitions": files}},
            {"minhash": {"threshold": 0.7, "partitions": files}},
        ],
        "tokenize": {"tokenizer": str(TOKENIZER), "seq_len": 512},
        # One input file = one map task, spread over the nodes; a shuffle's runs merged `fan_in` at a time
        # (split.shuffle_fan_in: with fewer writers than it there is no merge level, and no cross-node merge).
        "split": {"target_bytes": 64 << 20, "min_tasks_per_cpu": 0, "group_small_files": False, "shuffle_fan_in": fan_in},
    }
    if partition_rows:  # partition tasks of this many rows: several per round at bench size (default 4M: one)
        config["split"]["partition_rows"] = partition_rows
    return config


# The cluster, in its own process (its Python path is the code under test): nodes of one CPU, each
# with its own cache folder; the driver (datapipe run) with its own too.
# Each node signs its store requests with its own access key id (node0, node1, ...; the driver: driver),
# so the counting server tells what each node moved. With a kill (bucket, marker prefix), the last node
# is killed when the first object under that prefix appears (a completion marker of a shuffle phase:
# its other tasks are running or waiting): Ray's remove_node without grace (raylet, its workers), then
# SIGKILL to any process still holding that node's cache folder in its environment.
CLUSTER = """
import json, os, signal, subprocess, sys, time
from ray.cluster_utils import Cluster
nodes, cpus, caches, ray_dir, driver_cache, cmd, kill = json.loads(sys.argv[1])
def node_env(i):
    return {"DATAPIPE_CACHE_DIR": caches[i], "AWS_ACCESS_KEY_ID": f"node{i}"}
cluster = Cluster(initialize_head=True, connect=False,
                  head_node_args={"num_cpus": cpus, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                                  "temp_dir": ray_dir, "env_vars": node_env(0)})
added = [cluster.add_node(num_cpus=cpus, node_ip_address="127.0.0.1", env_vars=node_env(i)) for i in range(1, nodes)]
def holding(cache):
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if ("DATAPIPE_CACHE_DIR=" + cache).encode() in open(f"/proc/{d}/environ", "rb").read().split(b"\\0"):
                    pids.append(int(d))
            except OSError:
                pass
    return pids
try:
    cluster.wait_for_nodes()
    t0 = time.time()
    print("START", flush=True)
    env = {**os.environ, "DATAPIPE_CACHE_DIR": driver_cache, "AWS_ACCESS_KEY_ID": "driver"}
    proc = subprocess.Popen(cmd + ["--ray-address", cluster.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    killed = None
    if kill:
        import boto3
        bucket, prefix = kill
        s3 = boto3.client("s3", aws_access_key_id="watcher", aws_secret_access_key="test")
        while proc.poll() is None:
            if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
                pids = holding(caches[-1])
                cluster.remove_node(added[-1], allow_graceful=False)
                left = [p for p in holding(caches[-1])]
                for p in left:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                killed = {"at_s": time.time() - t0, "processes": len(pids), "killed_after_remove": len(left)}
                print("KILLED " + json.dumps(killed), flush=True)
                break
            time.sleep(0.5)
    out, err = proc.communicate()
    print(json.dumps({"rc": proc.returncode, "stderr": err[-3000:], "wall_s": time.time() - t0, "killed": killed}),
          flush=True)
finally:
    cluster.shutdown()
"""


def run_once(
    s3: Any,
    code: Path,
    nodes: int,
    config: dict[str, Any],
    work: Path,
    tag: str,
    kill_at: str | None = None,
    cpus: int = 1,
) -> dict[str, Any]:
    """One run on ``nodes`` loopback nodes; the store's counts while the driver ran (per node too). With
    ``kill_at`` (a phase, e.g. shuffle0) the last node is killed when that phase's first marker is on the store."""
    import yaml

    prefix = f"runs/{tag}"
    folder = work / tag
    folder.mkdir(parents=True)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    ray_dir = tempfile.mkdtemp(prefix="dpsn-", dir="/tmp")  # Ray's socket paths must stay short
    os.makedirs(os.path.join(ray_dir, "ray"))
    caches = [str(folder / f"cache-{i}") for i in range(nodes)]
    cmd = [sys.executable, "-m", "datapipe.cli", "run", str(folder / "pipeline.yaml")]
    cmd += ["--output", f"s3://{BUCKET}/{prefix}", "--no-progress"]
    env = {
        **os.environ,
        **KEYS,
        "AWS_ENDPOINT_URL": s3.url,
        "PYTHONPATH": str(code),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": ray_dir,
    }
    kill = [BUCKET, f"{prefix}/_work/markers/{kill_at}/"] if kill_at and nodes > 1 else None
    before, folders_before, clients_before = s3.snapshot(), s3.folder_snapshot(), s3.client_snapshot()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLUSTER, json.dumps([nodes, cpus, caches, ray_dir, str(folder / "cache-driver"), cmd, kill])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(code),
        )
        out, err = proc.communicate(timeout=7200)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    used = s3.since(before)
    folders = s3.folder_snapshot()
    folders.subtract(folders_before)
    clients = s3.client_snapshot()
    clients.subtract(clients_before)
    per_client: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (client, what), n in clients.items():
        per_client[client][what] = n
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{tag}: the cluster failed (rc {proc.returncode}):\n{err[-3000:]}")
    report = json.loads(lines[-1])
    if report["rc"] != 0:
        raise SystemExit(f"{tag}: datapipe run failed (rc {report['rc']}):\n{report['stderr']}")
    # GET bytes by run-folder folder (markers, _work/merge1, docs, ...) and for the inputs.
    by_folder: dict[str, int] = collections.Counter()
    put_by_folder: dict[str, int] = collections.Counter()
    run_root = f"/{BUCKET}/{prefix}"
    for (kind, path), n in folders.items():
        if kind in ("bytes_read", "bytes_written") and n:
            rel = path[len(run_root) + 1 :] if path.startswith(run_root) else "inputs" if "/in" in path else path
            key = rel.split("/")[0] if not rel.startswith("_work/") else "/".join(rel.split("/")[:2])
            (by_folder if kind == "bytes_read" else put_by_folder)[key] += n
    # What each node's mirror holds at the end (bytes of files), then the caches are deleted.
    mirrors = {}
    for c in [*caches, str(folder / "cache-driver")]:
        mirror = Path(c) / "remote-mirror"
        mirrors[Path(c).name] = sum(p.stat().st_size for p in mirror.rglob("*") if p.is_file()) if mirror.is_dir() else 0
        shutil.rmtree(c, ignore_errors=True)
    return {
        "tag": tag,
        "nodes": nodes,
        "wall_s": report["wall_s"],
        "store": used,
        "get_bytes_by_folder": dict(by_folder),
        "put_bytes_by_folder": dict(put_by_folder),
        "mirror_bytes": mirrors,
        "per_client": dict(per_client),
        "killed": report.get("killed"),
    }


def outputs_of(s3: Any, tag: str, dest: Path) -> dict[str, Any]:
    """The run's outputs, downloaded, in a comparable form (tests/e2e/test_resume.py's fingerprint)."""
    import boto3

    from tests.e2e.test_resume import fingerprint

    client = boto3.client(
        "s3", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )
    prefix = f"runs/{tag}/"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/") or "/_work/" in "/" + obj["Key"]:
                continue
            target = dest / obj["Key"][len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, obj["Key"], str(target))
    import pyarrow.parquet as pq

    fp = fingerprint(dest)
    # Every column of every reject row (the fingerprint keeps id, stage, reason), in a stable order.
    rows = [r for f in sorted((dest / "rejected").glob("**/*.parquet")) for r in pq.read_table(f).to_pylist()]
    fp["rejected_rows"] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    fp["kept_ids"] = sorted(r["id"] for r in fp["docs"])
    # The run's objects are no longer needed: the store (moto) holds them in memory.
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})
    return fp


# Folders of the run whose files a task of another node reads from the store (in place or whole): the
# shuffles' runs and merges and the token files; map outputs, markers and the outputs are read where written.
CROSSING = ("_work/shuffle", "_work/merge", "_work/tokens")


def model(one: dict[str, Any], nodes: int) -> dict[str, float]:
    """What each of ``nodes`` nodes should move, from the one-node run ``one`` (its store counts by folder):
    the cost model's assumption (bench/scaling/cost_model.py: the one-node run's GET + PUT bytes, spread
    evenly, ``NODE_GBPS`` each) and docs/cluster.md's account (PUT bytes the same in total; GET bytes the
    inputs, each read once by the node of its map task, plus the crossing folders' bytes, each read about
    once, by another node in (N - 1) / N of the cases), per node."""
    put = one["store"]["bytes_written"]
    crossing = sum(v for k, v in one["put_bytes_by_folder"].items() if k.startswith(CROSSING))
    # The nodes' GET: the inputs (the driver's reads, outputs for its statistics, are apart) and the crossing.
    get = one["get_bytes_by_folder"].get("inputs", 0) + crossing * (nodes - 1) / nodes
    return {
        "cost_model_bytes_per_node": (one["store"]["bytes_read"] + put) / nodes,
        "cluster_md_get_per_node": get / nodes,
        "cluster_md_put_per_node": put / nodes,
        "crossing_bytes": crossing,
    }


def per_node(r: dict[str, Any], one: dict[str, Any]) -> None:
    """Each node's GET and PUT bytes against ``model`` (from the one-node run ``one``)."""
    m = model(one, r["nodes"])
    r["model"] = m
    print(
        f"      per node, model: GET {m['cluster_md_get_per_node'] / 1e6:,.1f} MB + PUT "
        f"{m['cluster_md_put_per_node'] / 1e6:,.1f} MB (docs/cluster.md), "
        f"{m['cost_model_bytes_per_node'] / 1e6:,.1f} MB GET + PUT (cost model: 1 node's / N)",
        flush=True,
    )
    for client, c in sorted(r["per_client"].items()):
        print(
            f"      {client:<8} GET {c.get('bytes_read', 0) / 1e6:9,.1f} MB ({c.get('GET', 0):,} requests)  PUT "
            f"{c.get('bytes_written', 0) / 1e6:9,.1f} MB ({c.get('PUT', 0):,})  LIST {c.get('LIST', 0):,}  "
            f"HEAD {c.get('HEAD', 0):,}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=4000, help="documents of the run (default 4000)")
    ap.add_argument("--files", type=int, default=12, help="input files = map tasks = partitions (default 12)")
    ap.add_argument(
        "--fan-in", type=int, default=4, help="split.shuffle_fan_in: runs a merge task reads (default 4: 12 runs, 3 merges)"
    )
    ap.add_argument("--nodes", default="1,2,3", help="node counts to run (default 1,2,3)")
    ap.add_argument("--baseline-code", type=Path, help="a checkout of the code before: run interleaved with this one")
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where the work folders go")
    ap.add_argument(
        "--corpus-mb",
        type=float,
        help="instead of --docs Wikipedia lines: at least this many MB of the shared corpus copied with a salt and "
        "perturbed (write_salted)",
    )
    ap.add_argument("--partition-rows", type=int, help="split.partition_rows (default: the pipeline's)")
    ap.add_argument("--cpus-per-node", type=int, default=1, help="Ray CPUs of each loopback node (default 1)")
    ap.add_argument(
        "--kill-at",
        help="a phase (e.g. shuffle0): on more than one node, kill the last node when its first marker is on the store",
    )
    args = add_args(ap, repeats=1).parse_args()
    import logging

    import boto3

    from tests.support.counting_s3 import CountingS3

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    h = Harness("store_nodes", args, libs=["ray", "moto"])
    counts = [int(x) for x in args.nodes.split(",")]
    codes = {"ours": ROOT} if args.baseline_code is None else {"before": args.baseline_code.resolve(), "ours": ROOT}
    work = Path(tempfile.mkdtemp(prefix="store-nodes-", dir=args.tmp))
    s3 = CountingS3()
    try:
        client = boto3.client(
            "s3", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )
        client.create_bucket(Bucket=BUCKET)
        if args.corpus_mb:
            paths, corpus = write_salted(work / "in", args.corpus_mb, args.files)
            print(f"input: {corpus}", flush=True)
        else:
            paths, corpus = write_inputs(work / "in", args.docs, args.files), None
        for path in paths:
            client.upload_file(str(path), BUCKET, f"in/{path.name}")
            path.unlink()
        config = pipeline(f"s3://{BUCKET}/in", args.files, args.fan_in, args.partition_rows)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {c: {n: [] for n in counts} for c in codes}
        references: dict[str, Any] = {}  # per code: its first run's outputs (a fix may change them)
        for rep in range(h.repeats):
            for n in counts:
                for name, code in codes.items():
                    tag = f"{name}-{n}n-r{rep}"
                    r = run_once(s3, code, n, config, work, tag, args.kill_at, args.cpus_per_node)
                    fp = outputs_of(s3, tag, work / tag / "out")
                    shutil.rmtree(work / tag / "out", ignore_errors=True)
                    reference = references.setdefault(name, fp)
                    r["outputs_identical"] = fp == reference
                    r["identical_by_part"] = {k: fp[k] == reference[k] for k in fp}
                    r["manifest_rows"] = len(fp["manifest"])
                    docs = len(fp["documents"])
                    r["docs"] = docs
                    st = r["store"]
                    reqs = sum(st[k] for k in ("GET", "PUT", "LIST", "HEAD", "DELETE", "OTHER"))
                    print(
                        f"  {tag:<16} {r['wall_s']:6.1f} s  GET {st['bytes_read'] / docs:9.1f} B/doc  "
                        f"{st['GET'] / docs:.3f} GET/doc  {reqs / docs:.3f} requests/doc  "
                        f"PUT {st['bytes_written'] / docs:9.1f} B/doc  outputs identical: {r['outputs_identical']}",
                        flush=True,
                    )
                    print(
                        "      GET bytes/doc by folder: "
                        + ", ".join(
                            f"{k} {v / docs:.0f}" for k, v in sorted(r["get_bytes_by_folder"].items(), key=lambda kv: -kv[1])
                        ),
                        flush=True,
                    )
                    print(
                        "      mirror bytes/doc by cache: "
                        + ", ".join(f"{k} {v / docs:.0f}" for k, v in r["mirror_bytes"].items())
                    )
                    print(
                        "      PUT bytes/doc by folder: "
                        + ", ".join(
                            f"{k} {v / docs:.0f}" for k, v in sorted(r["put_bytes_by_folder"].items(), key=lambda kv: -kv[1])
                        ),
                        flush=True,
                    )
                    if r["killed"]:
                        print(f"      killed node{n - 1}: {r['killed']}", flush=True)
                    print(f"      identical by part: {r['identical_by_part']}", flush=True)
                    per_node(r, runs[name][counts[0]][0] if runs[name][counts[0]] else r)
                    runs[name][n].append(r)
        print()
        for name in codes:
            for n in counts:
                rs = runs[name][n]
                per = {
                    "GET bytes": [r["store"]["bytes_read"] / r["docs"] for r in rs],
                    "GET requests": [r["store"]["GET"] / r["docs"] for r in rs],
                    "requests": [
                        sum(r["store"][k] for k in ("GET", "PUT", "LIST", "HEAD", "DELETE", "OTHER")) / r["docs"] for r in rs
                    ],
                    "PUT bytes": [r["store"]["bytes_written"] / r["docs"] for r in rs],
                    "GET+PUT bytes": [(r["store"]["bytes_read"] + r["store"]["bytes_written"]) / r["docs"] for r in rs],
                }
                for what, vals in per.items():
                    h.figure(f"{name} {n} node(s): {what} per doc", vals, unit="B" if "bytes" in what else "")
            for n in counts[1:]:
                for what, key in (("GET bytes", "bytes_read"), ("GET requests", "GET")):
                    ratios = [
                        (b["store"][key] / b["docs"]) / (a["store"][key] / a["docs"])
                        for a, b in zip(runs[name][counts[0]], runs[name][n])
                    ]
                    h.ratio(f"{name}: {what} per doc, {n}/{counts[0]} nodes", ratios, target="<= 1.2" if name == "ours" else "")
                moved = [
                    (b["store"]["bytes_read"] + b["store"]["bytes_written"])
                    / b["docs"]
                    / ((a["store"]["bytes_read"] + a["store"]["bytes_written"]) / a["docs"])
                    for a, b in zip(runs[name][counts[0]], runs[name][n])
                ]
                h.ratio(f"{name}: GET+PUT bytes per doc, {n}/{counts[0]} nodes", moved)
        if "before" in codes:
            for n in counts:
                vals = [b["store"]["bytes_read"] / a["store"]["bytes_read"] for a, b in zip(runs["before"][n], runs["ours"][n])]
                h.ratio(f"GET bytes ours/before at {n} node(s)", vals)
        identical = all(r["outputs_identical"] for c in runs.values() for rs in c.values() for r in rs)
        docs = float(len(next(iter(references.values()))["documents"])) if references else 0.0
        print(f"outputs identical to the same code's first run in every run: {identical}  ({fmt(docs)} documents)")
        if len(references) > 1:
            print(f"outputs of the two codes identical: {all(v == references['ours'] for v in references.values())}")
        h.finish(runs=runs, outputs_identical=identical, corpus=corpus)
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
