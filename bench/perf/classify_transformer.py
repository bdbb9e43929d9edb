"""Documents per second per core of a transformers classifier in the classify stage: torch against
direct ``transformers`` calls and against ONNX Runtime, on real zh/en text; and on a GPU when there is one.

    python -m bench.perf.classify_transformer [--docs 400] [--max-tokens 256] [--repeats 3] [--json PATH]

The model is a small BERT (``--layers`` 4, ``--hidden`` 256, 4 heads, random weights, seed 0) with a
WordPiece tokenizer trained here on the shared corpus (tests/support/tiny_transformer.py), saved to a
temporary folder as a user's model would be. The texts are a seeded sample of ../shared/data/corpus
(``bench/_support/corpus.py``: ~90% English Wikipedia, the rest Chinese). Sides, interleaved over
``--repeats`` rounds, each on one thread (``torch.set_num_threads(1)``, ONNX Runtime's
``intra_op_num_threads=1``), so docs/s is per core. Each side is timed twice: wall seconds, and
the process's CPU seconds (``time.process_time``); on a shared, loaded machine docs per CPU-second
is the steadier per-core figure (the wall one counts the time other processes had the core):

- ``direct``: the loop a user would write: ``transformers`` tokenizer and model on batches of
  ``--batch`` texts in corpus order (padded to each batch's longest), under ``torch.inference_mode``;
- ``stage``: ``Classify.compute`` on Arrow batches (texts sorted by length within each batch, so
  batches pad little; the scores are the same, checked here to 1e-5);
- ``onnxruntime``: the same model exported with ``torch.onnx.export``, run by ONNX Runtime on the same
  sorted batches (needs ``onnx`` and ``onnxruntime``; left out with a note where they are missing).

With a GPU (``torch.cuda.is_available()``) the stage also runs with ``device: cuda`` (batch 64),
all threads; without one the script says so.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench._support.corpus import CORPUS, sample
from bench._support.harness import Harness, add_args, pair_ratios
from datapipe.stages.base import StageContext
from datapipe.stages.classify import Classify, ClassifyOptions
from tests.support.tiny_transformer import corpus_texts, save_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=400, help="documents from ../shared/data/corpus")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    args = add_args(ap, repeats=3).parse_args()

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    h = Harness(
        "classify_transformer",
        args,
        libs=["torch", "transformers", "tokenizers", "onnxruntime"],
        note=f"BERT {args.layers} layers, hidden {args.hidden}; {args.docs} docs, max_tokens {args.max_tokens}, "
        f"batch {args.batch}; one thread per side",
    )
    texts = [d["text"][:100_000] for d in sample(args.docs)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(
            Path(tmp) / "bert",
            corpus_texts(CORPUS, per_file=1000),
            ["lq", "hq"],
            hidden=args.hidden,
            layers=args.layers,
            heads=4,
            max_positions=512,
        )
        torch.set_num_threads(1)
        stage = Classify(
            ClassifyOptions(
                models={"b": {"path": str(folder), "max_tokens": args.max_tokens, "batch_size": args.batch, "device": "cpu"}}
            ),
            StageContext(tmp, tmp),
        )
        stage.setup()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
        kind = pa.array(["web"] * len(texts))
        got: dict[str, np.ndarray] = {}

        def direct() -> None:
            out = []
            with torch.inference_mode():
                for i in range(0, len(texts), args.batch):
                    enc = tokenizer(
                        texts[i : i + args.batch], padding=True, truncation=True, max_length=args.max_tokens, return_tensors="pt"
                    )
                    out.append(torch.softmax(model(**enc).logits, -1)[:, 1].numpy())
            got["direct"] = np.concatenate(out)

        def ours() -> None:
            out = [
                stage.compute(pa.table({"text": texts[i : i + 1000], "kind": kind[i : i + 1000]}))["cls_b_hq"].to_numpy()
                for i in range(0, len(texts), 1000)
            ]
            got["stage"] = np.concatenate(out)

        sides = {"direct transformers": direct, "classify stage (torch)": ours}
        ort_session = onnx_session(folder, tokenizer, model, args.max_tokens)
        if ort_session is not None:

            def ort() -> None:
                order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
                out = np.zeros(len(texts), np.float32)
                for i in range(0, len(order), args.batch):
                    rows = order[i : i + args.batch]
                    enc = tokenizer(
                        [texts[j] for j in rows], padding=True, truncation=True, max_length=args.max_tokens, return_tensors="np"
                    )
                    names = [x.name for x in ort_session.get_inputs()]
                    logits = ort_session.run(None, {n: enc[n].astype(np.int64) for n in names})[0]
                    e = np.exp(logits - logits.max(-1, keepdims=True))
                    out[rows] = (e / e.sum(-1, keepdims=True))[:, 1]
                got["onnxruntime"] = out

            sides["onnxruntime"] = ort
        wall: dict[str, list[float]] = {k: [] for k in sides}
        runs = h.interleave({k: cpu_seconds(fn, wall[k]) for k, fn in sides.items()}, warmup=True)
        n = len(texts)
        for name, secs in runs.items():
            h.figure(f"CPU, 1 thread: {name} docs per CPU-second", [n / s for s in secs], "docs/s")
            h.figure(f"CPU, 1 thread: {name} docs/s (wall)", [n / s for s in wall[name][1:]], "docs/s")
        for name, values in got.items():
            print(f"max |{name} - direct| score difference: {np.abs(values - got['direct']).max():.2e}")
        h.ratio("stage / direct (docs per CPU-second)", pair_ratios(runs["direct transformers"], runs["classify stage (torch)"]))
        if "onnxruntime" in runs:
            h.ratio("onnxruntime / stage (docs per CPU-second)", pair_ratios(runs["classify stage (torch)"], runs["onnxruntime"]))
        gpu(h, folder, texts, args, tmp)
        h.finish(docs=n, max_tokens=args.max_tokens, layers=args.layers, hidden=args.hidden)


def cpu_seconds(fn: Callable[[], None], wall: list[float]) -> Callable[[], float]:
    """``fn`` returning the CPU seconds it used; its wall seconds are appended to ``wall``."""

    def timed() -> float:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        return time.process_time() - c0

    return timed


def onnx_session(folder: Path, tokenizer, model, max_tokens: int):  # type: ignore[no-untyped-def]
    """The model exported to ONNX (legacy TorchScript exporter, dynamic batch and length), in a
    one-thread ONNX Runtime session; None (with a note) where onnx or onnxruntime is missing."""
    try:
        import onnx  # noqa: F401  (the exporter needs it)
        import onnxruntime
    except ImportError as exc:
        print(f"onnxruntime side left out: {exc}")
        return None
    import torch

    enc = tokenizer(["an example", "另一个例子"], padding=True, return_tensors="pt")
    names = list(enc.keys())
    path = folder / "model.onnx"
    torch.onnx.export(
        model,
        tuple(enc[k] for k in names),
        str(path),
        input_names=names,
        output_names=["logits"],
        dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in names}, "logits": {0: "batch"}},
        dynamo=False,
        opset_version=17,
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def gpu(h: Harness, folder: Path, texts: list[str], args: argparse.Namespace, tmp: str) -> None:
    import torch

    if not torch.cuda.is_available():
        print("GPU: none on this machine (torch.cuda.is_available() is False): no GPU figure")
        h.extra["gpu"] = None
        return
    torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
    stage = Classify(
        ClassifyOptions(models={"b": {"path": str(folder), "max_tokens": args.max_tokens, "batch_size": 64, "device": "cuda"}}),
        StageContext(tmp, tmp),
    )
    stage.setup()
    kind = pa.array(["web"] * len(texts))

    def on_gpu() -> None:
        for i in range(0, len(texts), 1000):
            stage.compute(pa.table({"text": texts[i : i + 1000], "kind": kind[i : i + 1000]}))
        torch.cuda.synchronize()

    runs = h.interleave({"gpu": on_gpu}, warmup=True)  # wall seconds
    h.figure(f"GPU ({torch.cuda.get_device_name()}): classify stage docs/s", [len(texts) / s for s in runs["gpu"]], "docs/s")
    h.extra["gpu"] = torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
