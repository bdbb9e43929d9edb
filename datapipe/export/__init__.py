"""Exports of a finished run to the formats trainers read: Megatron, Hugging Face, MosaicML, JSONL.

    from datapipe.export import export
    result = export("out/demo", "megatron", "exports/megatron")
    print(result.extra["data_path"]["train"])   # the --data-path string

Each export streams the kept documents batch by batch (``datapipe.export.documents``), writes
every file under a temporary name and renames it, resumes after a kill from its manifest in the
output folder, and records what it wrote in ``<run>/exports/<format>.json`` (``core``). The run
folder and the output folder may each be in object storage (``documents``, ``target``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from datapipe.export.core import ExportResult, Format, run_export
from datapipe.export.documents import SPLITS, TOKENS, ExportError, RunDocuments
from datapipe.export.hf import FILE_FORMATS, HfFormat
from datapipe.export.jsonl import JsonlFormat
from datapipe.export.mds import SIZE_LIMIT, MdsFormat
from datapipe.export.megatron import MegatronFormat

FORMATS = ("megatron", "hf", "mds", "jsonl")

__all__ = ["FORMATS", "ExportError", "ExportResult", "export"]


def export(
    run_dir: str | Path,
    format: str,
    output: str | Path,
    columns: Sequence[str] | None = None,
    splits: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    docs_per_file: int = 100_000,
    hf_file_format: str = "arrow",
    mds_size_limit: int = SIZE_LIMIT,
    batch_docs: int = 1024,
    fresh: bool = False,
    log: Callable[[str], None] = lambda m: None,
    progress: bool = False,
    allow_incomplete: bool = False,
) -> ExportResult:
    """Export the kept documents of the run in ``run_dir`` to ``output`` in ``format``. Either may be
    a local path or the URI of a folder in object storage (``datapipe.export.target``).

    ``columns``: document columns to write (any column of ``docs/``, plus ``input_ids``, the
    tokens); default per format (megatron writes tokens only). ``splits``/``sources``: a subset
    (default all). ``docs_per_file`` bounds hf and jsonl files, ``mds_size_limit`` MDS shards.
    ``progress``: a bar per source and split on a terminal (else a line each when it is done).
    ``allow_incomplete``: export a run whose run.json does not say ``complete`` (refused by default:
    its documents may be missing or about to be rewritten).
    """
    if format not in FORMATS:
        raise ExportError(f"--format: {format!r} is not allowed; choose one of {', '.join(FORMATS)}")
    docs = RunDocuments(run_dir, batch_docs=batch_docs, allow_incomplete=allow_incomplete)
    fmt = _make_format(format, docs_per_file, hf_file_format, mds_size_limit)
    cols = list(columns) if columns else list(fmt.default_columns)
    allowed = docs.columns()
    unknown = [c for c in cols if c not in allowed]
    if unknown:
        raise ExportError(f"--columns: {', '.join(unknown)} not among the run's columns ({', '.join(allowed)})")
    if format == "megatron" and cols != [TOKENS]:
        raise ExportError(f"--columns: megatron writes tokens only ({TOKENS}); leave --columns out")
    if TOKENS in cols and docs.tokens is None:
        raise ExportError(f"--format {format}: the run has no token shards (no tokenize section)")
    split_list = list(splits) if splits else list(SPLITS)
    bad = [s for s in split_list if s not in SPLITS]
    if bad:
        raise ExportError(f"--split: {', '.join(bad)} not allowed; splits are {', '.join(SPLITS)}")
    source_list = list(sources) if sources else docs.sources
    bad = [s for s in source_list if s not in docs.sources]
    if bad:
        raise ExportError(f"--source: {', '.join(bad)} not in the run (sources: {', '.join(docs.sources)})")
    return run_export(docs, fmt, output, cols, split_list, source_list, fresh=fresh, log=log, progress=progress)


def _make_format(name: str, docs_per_file: int, hf_file_format: str, mds_size_limit: int) -> Format:
    if docs_per_file < 1:
        raise ExportError("--docs-per-file: must be at least 1")
    if name == "megatron":
        return MegatronFormat()
    if name == "hf":
        if hf_file_format not in FILE_FORMATS:
            raise ExportError(f"--hf-file-format: {hf_file_format!r} not allowed; choose {' or '.join(FILE_FORMATS)}")
        return HfFormat(hf_file_format, docs_per_file)
    if name == "mds":
        return MdsFormat(mds_size_limit)
    return JsonlFormat(docs_per_file)
