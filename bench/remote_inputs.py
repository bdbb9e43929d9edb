"""What the driver fetches from object storage to validate and plan a run, against the old way.

Starts a loopback S3 server (moto), uploads one JSONL of about ``--mb`` MB (the demo documents
repeated) and times ``load_pipeline`` + ``make_spec`` (what `datapipe validate` and the planning
of `datapipe run` do) with a split target that cuts it into many ranges. Before this change the
driver downloaded every input whole at load time; now it lists the store and reads the first
records for the ``text_field`` check. Prints bytes fetched by the driver, the input size, and the
ratio (old / new), then what one map task of a range reads.

    python bench/remote_inputs.py --mb 64
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64, help="size of the JSONL input in MB")
    parser.add_argument("--target-mb", type=int, default=8, help="split.target_bytes in MB")
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="remote-inputs-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "x",
                       "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
                       "DATAPIPE_CACHE_DIR": str(tmp / "cache")})
    from datapipe.config import load_pipeline
    from datapipe.engine.plan import make_spec
    from datapipe.storage import FETCHED, mirror_of

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

    started = time.perf_counter()
    pipeline = load_pipeline(pipe_file)
    spec = make_spec(pipeline, tmp / "run", tmp / "cache", args.target_mb << 20)
    seconds = time.perf_counter() - started
    mirrored = list(mirror_of("s3://bench/in").rglob("*")) if mirror_of("s3://bench/in").exists() else []
    print(f"input: {size:,} bytes, {len(spec.shards)} ranges of {args.target_mb} MB")
    print(f"driver (load + plan): {FETCHED.bytes:,} bytes in {FETCHED.requests} ranged requests, "
          f"{FETCHED.downloads} downloads, {len(mirrored)} mirror files, {seconds:.2f} s")
    print(f"before this change the driver downloaded the input whole: {size:,} bytes; "
          f"ratio old/new = {size / max(FETCHED.bytes, 1):,.0f}x")

    # One map task's input: the lines of one middle range, through the reader.
    from datapipe.readers import READERS, InputFile, reader_path

    shard = spec.shards[len(spec.shards) // 2]
    piece = shard.inputs[0]
    before = FETCHED.bytes
    file = InputFile(reader_path(piece.path, piece.format), piece.input_name, shard.source, spec.limits,
                     start=piece.start, end=piece.end, first_record=0, ranged=not piece.whole)
    docs = sum(b.docs.num_rows for b in READERS[piece.format](file, spec.batch_size))
    width = (piece.end or size) - piece.start
    print(f"one map task ({shard.key}): range of {width:,} bytes, read {FETCHED.bytes - before:,} bytes "
          f"({(FETCHED.bytes - before) / width:.3f}x its range), {docs:,} documents")
    server.stop()


if __name__ == "__main__":
    main()
