"""The export driver: streams per source and split, output files written whole, resume, records.

Every output file is written to a temporary name and renamed into place; then it is recorded
in ``DIR/export-manifest.json`` (written atomically too). A killed export started again with
the same options skips the recorded files, drops the documents they hold from the stream and
goes on from there, so its files are byte-identical to an uninterrupted export's. File
boundaries depend only on the documents (counts and encoded sizes), never on batch sizes.
When everything is written, ``<run>/exports/<format>.json`` records paths, counts and sha256.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from datapipe.export.documents import SPLITS, TOKENS, ExportError, RunDocuments
from datapipe.export.target import ExportTarget
from datapipe.run_folder.layout import LOCK_FILE, LOCK_RECORD
from datapipe.run_folder.lock import RunLock
from datapipe.runtime.progress import PhaseProgress
from datapipe.storage.atomic import TMP_MARK, sweep_temp_files, temp_path_for, write_text_atomic
from datapipe.tokens.shard_format import file_sha256

MANIFEST = "export-manifest.json"
LICENSE = "license"  # the license stage's column: counted per part and stream when the run has it


class PartWriter(Protocol):
    """Writes one output part (one or more files) from batches of documents."""

    def write(self, table: pa.Table) -> None: ...

    def room(self, table: pa.Table) -> int:
        """How many of ``table``'s leading documents still fit in this part (>= 1 when it is empty)."""
        ...

    def close(self) -> dict[str, Any]:
        """Finish the temporary files; returns extra facts to record (e.g. MDS sample sizes)."""
        ...

    def abort(self) -> None: ...

    @property
    def temp_files(self) -> dict[str, Path]:
        """Final relative path -> temporary file, renamed in this order after ``close``."""
        ...


class Format(Protocol):
    name: str
    default_columns: tuple[str, ...]

    def options(self) -> dict[str, Any]: ...

    def open_part(self, out: Path, source: str, split: str, part: int, schema: pa.Schema, docs: RunDocuments) -> PartWriter: ...

    def finish_stream(
        self, out: Path, source: str, split: str, parts: list[dict[str, Any]], schema: pa.Schema
    ) -> dict[str, Path]:
        """Files that describe a whole stream (MDS index.json); final relative path -> temp file."""
        ...

    def finish(self, out: Path, result: ExportResult, docs: RunDocuments) -> dict[str, Path]:
        """Files that describe the whole export (Megatron's data-path strings)."""
        ...


@dataclass
class ExportResult:
    run_dir: Path
    output: Path | str  # a local folder, or the URI of a folder in object storage
    format: str
    columns: list[str]
    # "source/split" -> docs, tokens (None when input_ids is not exported: nothing was counted), parts
    streams: dict[str, dict[str, int | None]] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # relative path -> bytes, sha256, ...
    parts_written: int = 0
    parts_skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def documents(self) -> int:
        return sum(s["docs"] or 0 for s in self.streams.values())

    @property
    def tokens(self) -> int | None:
        """Tokens exported; None when the export holds no input_ids (a JSONL of text has no count)."""
        counts = [s["tokens"] for s in self.streams.values()]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


class _Manifest:
    """``DIR/export-manifest.json``: what this export is, and every part already written."""

    def __init__(self, target: ExportTarget, identity: dict[str, Any]) -> None:
        out = target.out
        self.path, self.target = out / MANIFEST, target
        self.identity = identity
        self.parts: list[dict[str, Any]] = []
        self.streams: dict[str, dict[str, Any]] = {}
        self.finished: dict[str, dict[str, Any]] = {}  # describing files (index.json, data paths)
        if self.path.is_file():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("identity") != identity:
                changed = sorted(
                    k for k in set(identity) | set(data.get("identity", {})) if identity.get(k) != data.get("identity", {}).get(k)
                )
                raise ExportError(
                    f"--output: {out} holds an export with other settings (changed: "
                    f"{', '.join(changed)}); use another --output folder or --fresh"
                )
            self.parts = data.get("parts", [])
            self.streams = data.get("streams", {})
            self.finished = data.get("finished", {})
        elif (
            not target.remote
            and out.is_dir()
            and any(p for p in out.iterdir() if TMP_MARK not in p.name and p.name not in (LOCK_FILE, LOCK_RECORD))
        ):
            raise ExportError(
                f"--output: {out} is not empty and holds no {MANIFEST}; refusing to write there (choose an empty or new folder)"
            )

    def save(self) -> None:
        """Write the manifest; on a store, upload it (after the files it names: the commit point)."""
        data = {"identity": self.identity, "parts": self.parts, "streams": self.streams, "finished": self.finished}
        write_text_atomic(self.path, json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        self.target.commit_manifest()

    def done_parts(self, stream: str) -> list[dict[str, Any]]:
        """The recorded parts of ``stream`` whose files are all present with their recorded sizes."""
        parts = sorted((p for p in self.parts if p["stream"] == stream), key=lambda p: p["part"])
        good = []
        for k, p in enumerate(parts):
            if p["part"] != k or not all(self.target.present(f, info["bytes"]) for f, info in p["files"].items()):
                break
            good.append(p)
        if len(good) != len(parts):  # a damaged tail: forget it and rewrite from there
            self.parts = [p for p in self.parts if p["stream"] != stream or p in good]
            self.streams.pop(stream, None)
        return good


def run_export(
    docs: RunDocuments,
    fmt: Format,
    output: str | Path,
    columns: list[str],
    splits: list[str],
    sources: list[str],
    fresh: bool = False,
    log: Callable[[str], None] = lambda m: None,
    progress: bool = False,
) -> ExportResult:
    """Export into ``output``, a local folder or an object-store URI (``target``).

    ``progress``: a bar per stream (documents files read of its source's), drawn on a terminal;
    elsewhere one line per stream when it is done."""
    target = ExportTarget(output, MANIFEST)
    if target.inside(docs.location):
        raise ExportError(f"--output: {target.name} is inside the run folder; exports go to their own folder")
    # One export per output folder, as one driver per run folder: a second one would sweep the first's
    # temporary files and rewrite its manifest (it crashed with FileNotFoundError). On a store, the
    # lock record is there too (run_folder/lock.py), so two machines exporting to one URI are refused.
    with RunLock(target.out, log=log, what="export folder"):
        return _export_locked(docs, fmt, target, columns, splits, sources, fresh, log, progress)


def _export_locked(
    docs: RunDocuments,
    fmt: Format,
    target: ExportTarget,
    columns: list[str],
    splits: list[str],
    sources: list[str],
    fresh: bool,
    log: Callable[[str], None],
    progress: bool,
) -> ExportResult:
    out = target.out
    target.pull()
    if fresh and (out / MANIFEST).is_file():
        _wipe(out, target)
    out.mkdir(parents=True, exist_ok=True)
    identity = {
        "format": fmt.name,
        "run": docs.location,
        "run_fingerprint": docs.run.get("fingerprint"),
        "run_finished": docs.run.get("finished"),
        "columns": columns,
        "splits": splits,
        "sources": sources,
        "options": fmt.options(),
    }
    manifest = _Manifest(target, identity)
    if target.remote and not manifest.path.is_file():
        manifest.save()  # on the store before any part: the folder is this export's from now on
    sweep_temp_files(out)  # temporary files of a killed export
    schema = docs.schema_of(columns)
    result = ExportResult(docs.root, target.name if target.remote else out, fmt.name, columns)
    for source in sources:
        for split in splits:
            stream = f"{source}/{split}"
            done = manifest.done_parts(stream)
            if stream in manifest.streams:
                result.parts_skipped += len(done)
            else:
                # What the bar counts: the run's documents files read, not files written.
                with (
                    PhaseProgress(f"export {stream}", len(docs.doc_files(source)), 0, f"docs/{source} files read")
                    if progress
                    else contextlib.nullcontext()
                ) as bar:
                    _export_stream(
                        docs,
                        fmt,
                        target,
                        source,
                        split,
                        schema,
                        manifest,
                        done,
                        result,
                        log,
                        on_file=bar.advance if bar is not None else None,
                    )
            info = manifest.streams.get(stream)
            if info is not None:
                result.streams[stream] = info
    for p in manifest.parts:
        for f, info in p["files"].items():
            result.files[f] = {**info, "stream": p["stream"], "part": p["part"], "docs": p["docs"]}
    for f, info in manifest.finished.items():
        result.files[f] = info
    described = _place(target, fmt.finish(out, result, docs))
    result.files.update(described)
    manifest.finished.update(described)
    manifest.save()
    _record_in_run(docs, result)
    return result


def _export_stream(
    docs: RunDocuments,
    fmt: Format,
    target: ExportTarget,
    source: str,
    split: str,
    schema: pa.Schema,
    manifest: _Manifest,
    done: list[dict[str, Any]],
    result: ExportResult,
    log: Callable[[str], None],
    on_file: Callable[[int], None] | None = None,
) -> None:
    out = target.out
    stream = f"{source}/{split}"
    skip = sum(p["docs"] for p in done)
    result.parts_skipped += len(done)
    part_no, first_doc = len(done), skip
    writer: PartWriter | None = None
    n_docs = n_tokens = 0
    # Every format records its documents' licences per part and stream (Megatron's .bin/.idx have no
    # room for them): the license stage's ``license`` column, read beside the chosen columns.
    track = LICENSE in docs.columns()
    read_names = list(dict.fromkeys([*schema.names, LICENSE])) if track else schema.names
    licenses: dict[str, dict[str, int]] = {}

    def close_part() -> None:
        nonlocal writer, part_no, first_doc, n_docs, n_tokens, licenses
        assert writer is not None
        extra = writer.close()
        files = _place(target, writer.temp_files)
        manifest.parts.append(
            {
                "stream": stream,
                "part": part_no,
                "first_doc": first_doc,
                "docs": n_docs,
                "tokens": n_tokens if TOKENS in schema.names else None,
                "files": files,
                **({"licenses": licenses} if track else {}),
                **extra,
            }
        )
        licenses = {}
        manifest.save()
        result.parts_written += 1
        log(f"export: {', '.join(files)} ({n_docs} documents)")
        _fault_point("export", result.parts_written)
        part_no, first_doc = part_no + 1, first_doc + n_docs
        writer, n_docs, n_tokens = None, 0, 0

    try:
        for table in _skip(docs.batches(source, split, read_names, on_file), skip):
            while table.num_rows:
                if writer is None:
                    writer = fmt.open_part(out, source, split, part_no, schema, docs)
                take = writer.room(table.select(schema.names))
                if take <= 0:
                    close_part()
                    continue
                head, table = table.slice(0, take), table.slice(take)
                if track:
                    _count_licenses(head, licenses)
                writer.write(head.select(schema.names))
                n_docs += head.num_rows
                n_tokens += _count_tokens(head)
                _fault_point("export-write", result.parts_written + 1)
        if writer is not None:
            close_part()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    parts = sorted((p for p in manifest.parts if p["stream"] == stream), key=lambda p: p["part"])
    manifest.finished.update(_place(target, fmt.finish_stream(out, source, split, parts, schema)))
    manifest.streams[stream] = {
        "docs": sum(p["docs"] for p in parts),
        "tokens": sum(p["tokens"] for p in parts) if TOKENS in schema.names else None,
        "parts": len(parts),
    }
    if track:
        total: dict[str, dict[str, int]] = {}
        for p in parts:
            for lic, n in p.get("licenses", {}).items():
                t = total.setdefault(lic, {"docs": 0, "tokens": 0})
                t["docs"], t["tokens"] = t["docs"] + n["docs"], t["tokens"] + n["tokens"]
        manifest.streams[stream]["licenses"] = dict(sorted(total.items(), key=lambda kv: (-kv[1]["docs"], kv[0])))
    manifest.save()


def _skip(batches: Iterator[pa.Table], n: int) -> Iterator[pa.Table]:
    for table in batches:
        if n >= table.num_rows:
            n -= table.num_rows
            continue
        yield table.slice(n) if n else table
        n = 0


def _count_licenses(table: pa.Table, into: dict[str, dict[str, int]]) -> None:
    """Documents and tokens per ``license`` value of one slice, added into ``into``."""
    lengths = _token_lengths(table)
    for i, lic in enumerate(table[LICENSE].to_pylist()):
        t = into.setdefault(lic or "unknown", {"docs": 0, "tokens": 0})
        t["docs"] += 1
        t["tokens"] += lengths[i] if lengths is not None else 0


def _token_lengths(table: pa.Table) -> list[int] | None:
    if "input_ids" not in table.column_names:
        return None
    import pyarrow.compute as pc

    return pc.list_value_length(table["input_ids"]).to_pylist()


def _count_tokens(table: pa.Table) -> int:
    if TOKENS not in table.column_names:
        return 0
    import pyarrow.compute as pc

    return int(pc.sum(pc.list_value_length(table["input_ids"])).as_py() or 0)


def _place(target: ExportTarget, temps: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Finished temporary files renamed into place and, on a store, uploaded (before the manifest
    that will name them); returns their size and sha256 by relative path."""
    _rename_all(target.out, temps)
    files = {rel: _file_info(target.out / rel) for rel in temps}
    target.commit(files)
    return files


def _rename_all(out: Path, temps: dict[str, Path]) -> None:
    for rel, tmp in temps.items():
        final = out / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # a part recorded as done must survive a machine crash, not only a kill
        finally:
            os.close(fd)
        os.replace(tmp, final)


def temp_for(out: Path, rel: str) -> Path:
    """A temporary sibling of ``out/rel`` (swept when an export starts again)."""
    final = out / rel
    final.parent.mkdir(parents=True, exist_ok=True)
    return temp_path_for(final)


def _file_info(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _wipe(out: Path, target: ExportTarget) -> None:
    """--fresh: remove what a previous export recorded (and only that)."""
    data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    recorded = [f for p in data.get("parts", []) for f in p["files"]] + list(data.get("finished", {}))
    target.delete(recorded)
    for f in recorded:
        (out / f).unlink(missing_ok=True)
    (out / MANIFEST).unlink()
    sweep_temp_files(out)
    # Folders the export made and that are empty now (deepest first); anything else stays.
    for folder in sorted({(out / f).parent for f in recorded}, key=lambda p: len(p.parts), reverse=True):
        while folder != out and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _record_in_run(docs: RunDocuments, result: ExportResult) -> None:
    """``<run>/exports/<format>.json``: where the export went and what it holds."""
    record = {
        "format": result.format,
        "output": str(result.output),
        "columns": result.columns,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "documents": result.documents,
        "tokens": result.tokens,
        "streams": result.streams,
        "files": result.files,
        **result.extra,
    }
    write_text_atomic(
        docs.root / "exports" / f"{result.format}.json", json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    )
    docs.folder.publish(f"exports/{result.format}.json")  # a run folder in object storage: to the store too


def _fault_point(phase: str, n: int) -> None:
    """Testing hook, as the engine's (runtime/faults.py): DATAPIPE_FAULT_KILL_AT=export:<n> SIGKILLs after n parts are
    recorded; export-write:<n> while part n is half written (a temporary file is left behind)."""
    spec = os.environ.get("DATAPIPE_FAULT_KILL_AT")
    if spec and spec == f"{phase}:{n}":
        os.kill(os.getpid(), signal.SIGKILL)


def default_splits() -> list[str]:
    return list(SPLITS)
