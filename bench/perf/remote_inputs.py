"""What the driver fetches from object storage to validate and plan a run, against the old way.

Starts a loopback S3 server (moto), uploads one JSONL of about ``--mb`` MB (the demo documents
repeated) and times ``load_pipeline`` + ``make_spec`` (what `datapipe validate` and the planning
of `datapipe run` do) with a split target that cuts it into many ranges. Before this change the
driver downloaded every input whole at load time; now it lists the store and reads the first
records for the ``text_field`` check. Prints bytes fetched by the driver, the input size, and the
ratio (old / new), then what one map task of a range reads. The old way is also run: the whole
object downloaded (``download_file``), alternated with load + plan over ``--repeats`` pairs
(``bench/_support/harness.py``: machine, date, median and range, ``--json``).

    python -m bench.perf.remote_inputs --mb 64 [--repeats 3] [--json bench/results/remote_inputs.json]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

import yaml

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64, help="size of the JSONL input in MB")
    parser.add_argument("--target-mb", type=int, default=8, help="split.target_bytes in MB")
    args = add_args(parser, repeats=3).parse_args()
    h = Harness("remote_inputs", args, libs=["moto", "boto3"])

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="remote-inputs-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "us-east-1",
            "DATAPIPE_CACHE_DIR": str(tmp / "cache"),
        }
    )
    from datapipe.engine.plan import make_spec
    from datapipe.pipeline.load import load_pipeline
    from datapipe.storage.uri import FETCHED, mirror_of

    demo = b"".join(f.read_bytes() for f in sorted((ROOT / "pipelines" / "demo" / "data").glob("*.jsonl")))
    data = tmp / "big.jsonl"
    with data.open("wb") as f:
        for _ in range(args.mb * (1 << 20) // len(demo) + 1):
            f.write(demo)
    size = data.stat().st_size
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    client.upload_file(str(data), "bench", "in/big.jsonl")
    cfg = yaml.safe_load((ROOT / "pipelines" / "demo.yaml").read_text(encoding="utf-8"))
    cfg["sources"] = [{"name": "web", "kind": "web", "paths": ["s3://bench/in/*.jsonl"]}]
    cfg.pop("mixture", None)
    cfg["tokenize"]["tokenizer"] = str(ROOT / "tokenizer" / "demo.json")
    cfg["split"] = {"target_bytes": args.target_mb << 20}
    pipe_file = tmp / "p.yaml"
    pipe_file.write_text(yaml.safe_dump(cfg), encoding="utf-8")

    fetched: list[dict[str, int]] = []
    plan: dict = {}

    def whole_download() -> None:  # what the driver did before: the input copied whole
        client.download_file("bench", "in/big.jsonl", str(tmp / "whole.jsonl"))
        (tmp / "whole.jsonl").unlink()

    def load_and_plan() -> None:
        b, r, d = FETCHED.bytes, FETCHED.requests, FETCHED.downloads
        plan["spec"] = make_spec(load_pipeline(pipe_file), tmp / "run", tmp / "cache", args.target_mb << 20)
        fetched.append({"bytes": FETCHED.bytes - b, "requests": FETCHED.requests - r, "downloads": FETCHED.downloads - d})

    runs = h.interleave({"whole download (before)": whole_download, "load + plan (now)": load_and_plan})
    spec = plan["spec"]
    mirrored = list(mirror_of("s3://bench/in").rglob("*")) if mirror_of("s3://bench/in").exists() else []
    last = fetched[-1]
    print(f"input: {size:,} bytes, {len(spec.shards)} ranges of {args.target_mb} MB")
    print(
        f"driver (load + plan), last of {len(fetched)}: {last['bytes']:,} bytes in {last['requests']} ranged "
        f"requests, {last['downloads']} downloads, {len(mirrored)} mirror files"
    )
    print(f"before this change the driver downloaded the input whole: {size:,} bytes")
    h.figure("driver bytes fetched (load + plan)", [float(f["bytes"]) for f in fetched], "bytes")
    for name, secs in runs.items():
        h.figure(f"{name} seconds", secs, "s")
    h.ratio("driver bytes: whole download / load + plan", [size / max(f["bytes"], 1) for f in fetched])
    h.ratio(
        "driver seconds: whole download / load + plan", pair_ratios(runs["whole download (before)"], runs["load + plan (now)"])
    )

    # One map task's input: the lines of one middle range, through the reader.
    from datapipe.readers import InputFile, reader_path, reader_spec

    shard = spec.shards[len(spec.shards) // 2]
    piece = shard.inputs[0]
    before = FETCHED.bytes
    file = InputFile(
        reader_path(piece.path, piece.format),
        piece.input_name,
        shard.source,
        spec.limits,
        start=piece.start,
        end=piece.end,
        first_record=0,
        ranged=not piece.whole,
    )
    docs = sum(b.docs.num_rows for b in reader_spec(piece.format).read(file, spec.batch_size))
    width = (piece.end or size) - piece.start
    print(
        f"one map task ({shard.key}): range of {width:,} bytes, read {FETCHED.bytes - before:,} bytes "
        f"({(FETCHED.bytes - before) / width:.3f}x its range), {docs:,} documents"
    )
    h.ratio("one map task: bytes read / its range", [(FETCHED.bytes - before) / width], target="~1")
    server.stop()
    h.finish(input_bytes=size, ranges=len(spec.shards), target_mb=args.target_mb, mirror_files=len(mirrored))


if __name__ == "__main__":
    main()
