"""Documents per second through the annotate stage vs a bare pool of HTTP requests, same server, same concurrency.

    python -m bench.perf.annotate --docs 400 --in-flight 16 --delay 0.02 [--repeats 5] [--json PATH]

The server is tests/support/openai_server.py (a real process on 127.0.0.1) answering each request
after ``--delay`` seconds, a stand-in for a model's latency. The bare side is the loop a user would
write: a thread pool of ``--in-flight`` workers, each sending the same request body the stage sends
(urllib) and parsing the reply's JSON. The stage side is ``Annotate.compute`` over Arrow batches of a
fresh task (an empty journal, so every document is asked): prompt rendering, request hashing, the
journal appended and fsynced, schema validation and the typed columns. The two alternate over
``--repeats`` rounds (``bench/_support/harness.py``); the ratio stage/bare of documents per second is taken per
round and reported as median and range: near 1 means the stage adds nothing the server's latency
does not hide.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from bench._support.corpus import sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.stages.annotate import Annotate, sampling_params
from datapipe.stages.annotate.options import AnnotateOptions
from datapipe.stages.annotate.prompt import render, request_body, response_format
from datapipe.stages.base import StageContext
from tests.support.openai_server import ANSWER_SCHEMA as SCHEMA
from tests.support.openai_server import DESCRIBE_PROMPT as PROMPT
from tests.support.openai_server import FakeOpenAI


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=400, help="documents from ../shared/data/corpus")
    ap.add_argument("--in-flight", type=int, default=16, help="requests in flight, both sides")
    ap.add_argument("--delay", type=float, default=0.02, help="the server's seconds per answer")
    args = add_args(ap, repeats=5).parse_args()
    h = Harness(
        "annotate",
        args,
        libs=["jsonschema"],
        note=f"{args.docs} docs, {args.in_flight} in flight, {args.delay * 1000:g} ms per answer",
    )
    texts = [d["text"][:20_000] for d in sample(args.docs)]
    table = pa.table(
        {
            "id": [f"bench/doc#{i}" for i in range(len(texts))],
            "source": ["bench"] * len(texts),
            "kind": ["web"] * len(texts),
            "text": texts,
        }
    )
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(Path(tmp) / "server", delay=args.delay) as server:
        options = AnnotateOptions.model_validate(
            {"model": "bench", "endpoint": server.url, "prompt": PROMPT, "output_schema": SCHEMA, "max_in_flight": args.in_flight}
        )
        params, fmt = sampling_params(options), response_format(options.response_format, SCHEMA)
        bodies = [json.dumps(request_body("bench", None, render(PROMPT, {"text": t}), params, fmt)).encode() for t in texts]
        url = server.url + "/chat/completions"

        def one(body: bytes) -> None:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=60) as resp:
                json.loads(json.loads(resp.read())["choices"][0]["message"]["content"])

        def bare() -> None:
            with ThreadPoolExecutor(args.in_flight) as pool:
                list(pool.map(one, bodies))

        stage = Annotate(options, StageContext(tmp, tmp))
        stage.setup()
        rounds = iter(range(1_000_000))

        def ours() -> None:
            stage.start_task(Path(tmp) / f"task{next(rounds)}")  # an empty journal: every document asked
            for start in range(0, table.num_rows, 1000):
                out = stage.compute(table.slice(start, 1000))
                assert out["llm_error"].null_count == out.num_rows
            stage.end_task(completed=True)

        runs = h.interleave({"bare thread pool": bare, "annotate stage": ours}, warmup=True)
    n = len(texts)
    h.figure("bare thread pool docs/s", [n / s for s in runs["bare thread pool"]], unit="docs/s")
    h.figure("annotate stage docs/s", [n / s for s in runs["annotate stage"]], unit="docs/s")
    h.ratio("annotate stage / bare pool (docs/s)", pair_ratios(runs["bare thread pool"], runs["annotate stage"]), target=">= 0.9")
    h.finish(docs=n, in_flight=args.in_flight, delay_s=args.delay)


if __name__ == "__main__":
    main()
