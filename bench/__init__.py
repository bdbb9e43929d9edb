"""Benchmarks: datapipe against a baseline, interleaved, ratios printed (docs/benchmarks.md).

Run them from the checkout's root as modules, e.g. ``python -m bench.perf.langid --docs 4000``:

- ``perf/``: throughput of a stage, reader, exporter or the loader against the library it wraps;
- ``quality/``: precision, recall and agreement on real data;
- ``scaling/``: cost per document and memory per task as the corpus or the cluster grows, and
  docs/scaling.md written from them;
- ``gpu/``: the checks run in one call on a GPU machine;
- ``_support/``: what the scripts share (the harness, the sample corpus, process-tree sampling).

Results go to ``bench/results/`` (``--json``); ``python -m bench.readme_table --write`` renders
docs/benchmarks.md's table from them. The scripts use datapipe's public API only.
"""
