"""`datapipe cluster kuberay|slurm` say, one warning per setting, what would make the rendered job fail or
lose its work: relative local paths, no output URI, Ray's stock image, an annotate server on loopback.
The manifest or script itself still goes to stdout, clean for `kubectl apply -f -` / sbatch."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from datapipe.cli import main
from tests.support.shared_data import shared_path

PIPELINE = """\
name: heldout
sources:
  - {{name: wiki, kind: text, paths: ["{corpus}/en_wikipedia.jsonl"]}}
  - {{name: drcd, kind: text, paths: ["s3://bucket/zh/*.jsonl.gz"]}}
stages:
  - langid: {{keep: [en, zh], model: models/lid.176.ftz}}
  - decontaminate:
      benchmarks: [{{name: gsm8k, paths: ["{benchmarks}/gsm8k_test.jsonl"], fields: [question]}}]
  - annotate: {{model: qwen2.5-7b, endpoint: "http://127.0.0.1:8000/v1", prompt: "Rate {{{{text}}}}",
                output_schema: {{type: object, properties: {{q: {{type: integer}}}}, required: [q]}}}}
tokenize: {{tokenizer: /opt/tokenizers/zh_en_32k.json, seq_len: 2048}}
"""


def _write(tmp_path: Path, relative: bool) -> Path:
    corpus, benchmarks = shared_path("corpus"), shared_path("benchmarks")
    pipeline = tmp_path / "p.yaml"
    if relative:  # the shared data as a user's project sees it: relative to the pipeline file
        (tmp_path / "data").symlink_to(corpus.parent)
        corpus_s, bench_s = "data/corpus", "data/benchmarks"
    else:
        corpus_s, bench_s = "s3://bucket/corpus", "gs://bucket/benchmarks"
    pipeline.write_text(PIPELINE.format(corpus=corpus_s, benchmarks=bench_s), encoding="utf-8")
    assert (tmp_path / corpus_s / "en_wikipedia.jsonl").exists() if relative else benchmarks.exists()
    return pipeline


def test_kuberay_warns_per_setting_and_the_manifest_stays_clean(tmp_path: Path) -> None:
    pipeline = _write(tmp_path, relative=True)
    res = CliRunner().invoke(main, ["cluster", "kuberay", str(pipeline)])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    keys = [w.split(":")[1].strip() for w in warnings]
    assert "sources[0].paths[0]" in keys and "stages[0].langid.model" in keys  # relative inputs, model
    assert "stages[1].decontaminate.benchmarks[0].paths[0]" in keys  # relative benchmark files
    assert "sources[1].paths[0]" not in keys and "tokenize.tokenizer" not in keys  # a URI, an absolute path
    assert "stages[2].annotate.model" not in keys  # a server's model name, not a file
    assert any("stages[2].annotate.endpoint" in w and "loopback" in w for w in warnings)
    assert any(w.startswith("warning: no output URI") for w in warnings)
    assert any("--image rayproject/ray" in w and "no datapipe" in w for w in warnings)
    assert len(warnings) == 6, warnings
    docs = list(yaml.safe_load_all(res.stdout))  # stdout is the manifest alone
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayJob"]
    # A relative --output is as lost as none.
    res = CliRunner().invoke(main, ["cluster", "kuberay", str(pipeline), "--output", "out/run"])
    assert "--output 'out/run' is a local path in the head pod" in res.stderr


def test_a_job_that_can_run_renders_without_warnings(tmp_path: Path) -> None:
    pipeline = _write(tmp_path, relative=False)
    text = pipeline.read_text(encoding="utf-8").replace("models/lid.176.ftz", "/opt/models/lid.176.ftz")
    pipeline.write_text(text.replace("http://127.0.0.1:8000/v1", "http://vllm.llm.svc:8000/v1"), encoding="utf-8")
    args = [str(pipeline), "--output", "s3://bucket/runs/heldout", "--image", "registry.example/datapipe:0.1"]
    res = CliRunner().invoke(main, ["cluster", "kuberay", *args])
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    res = CliRunner().invoke(main, ["cluster", "slurm", str(pipeline), "--output", "s3://bucket/runs/heldout"])
    assert res.exit_code == 0 and res.stderr == "", res.stderr


def test_slurm_warns_where_every_node_must_see_a_path(tmp_path: Path) -> None:
    pipeline = _write(tmp_path, relative=True)
    res = CliRunner().invoke(main, ["cluster", "slurm", str(pipeline)])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    wiki = str(tmp_path / "data" / "corpus" / "en_wikipedia.jsonl")
    assert any(w.startswith("warning: sources[0].paths[0]") and wiki in w and "every node" in w for w in warnings)
    assert any(w.startswith("warning: stages[0].langid.model") for w in warnings)
    assert any(w.startswith("warning: no output") and str(tmp_path / "out" / "heldout") in w for w in warnings)
    assert any("stages[2].annotate.endpoint" in w and "each node" in w for w in warnings)
    assert not any("--image" in w for w in warnings)  # the nodes' own environment, not an image
    assert res.stdout.startswith("#!/bin/bash")
