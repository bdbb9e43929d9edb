"""Kept documents of a finished run, with their tokens, streamed batch by batch.

Exports read two things the run already holds, in the same order:

- ``docs/<source>/<shard>.parquet``: the kept documents with text and every signal;
- their token lists: ``_work/tokens/<source>/<shard>.arrow`` (one row per kept document,
  written by the map task beside the Parquet file, EOS included), or, when ``_work`` was
  deleted, the packed shards ``shards/<source>/<split>-NNNNN.arrow`` cut at ``doc_starts``
  (``concat`` packing keeps documents in run order, so the k-th document of the stream is
  the k-th kept document of that source and split).

Neither path holds more than one batch of documents (plus one shard's memory map) at a time.

Every file is checked before it is read against what the task that wrote it recorded in its
marker (``run_folder/checked.py``: size and sha256; a shard against the manifest's sha256): a
damaged file is refused by name, with the advice to run the same `datapipe run` again (which
redoes it), never exported as it is. The check reads each documents file once more (from the
page cache, ~1 GB/s) before the export decodes it.

A run folder in object storage (``s3://bucket/run``) is read in place: run.json and the shard
manifest are fetched to its local mirror; the documents and token lists listed under ``docs/``
and ``_work/tokens/`` are streamed from the store: Parquet by row groups, a token list whole
(one task's output), so the local disk holds none of them. Only packed shards are downloaded:
one to read the tokenizer facts and, when ``_work/tokens`` was deleted, those of the streams
being cut back into documents.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.config.mixture import REPEAT_COLUMN, in_round, spread_offsets
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.run_folder.checked import DamagedRunFile, recorded_files, sha256_of
from datapipe.run_folder.layout import RunFolder
from datapipe.storage import uri as storage
from datapipe.tokens.shard_format import open_shard, tokens_view

TOKENS = "input_ids"  # the pseudo-column with a document's token ids
SPLITS = ("train", "val")


class ExportError(DatapipeError, ValueError):
    """The export cannot be done as asked; the message names the option and what is allowed."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class TokenInfo:
    dtype: str  # numpy dtype name of the run's tokens (uint16 or uint32)
    vocab_size: int
    eos_id: int
    packing: str
    tokenizer_fingerprint: str


class RunDocuments:
    """Read access to one finished run's kept documents and their tokens."""

    def __init__(self, run_dir: str | Path, batch_docs: int = 1024, allow_incomplete: bool = False) -> None:
        remote = storage.is_uri(run_dir)
        # Where the run is, as the user named it: a path, or the URI of a run folder in object storage.
        self.location = os.fspath(run_dir).rstrip("/") if remote else str(Path(run_dir).resolve())
        self.root = _mirror(self.location) if remote else Path(self.location)
        self.folder = RunFolder(self.root)
        run_json = self.folder.run_json
        if not run_json.is_file():
            raise ExportError(f"RUN: {self.root} is not a datapipe run folder (no run.json)")
        try:
            self.run = json.loads(run_json.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ExportError(
                f"RUN: {run_json} is unreadable (truncated or not JSON)",
                hint="run the same `datapipe run` command again (with --fresh if it refuses)",
            ) from None
        if self.run.get("status") != "complete" and not allow_incomplete:
            raise ExportError(
                f"RUN: the run in {self.location} is not complete (status "
                f"{self.run.get('status')!r}); finish it with `datapipe run` first",
                hint="or pass --allow-incomplete to export the documents as they are now",
            )
        # A remote run's documents and token lists (paths relative to the run folder), as listed on
        # the store; None for a local run. A complete run holds no file of a killed attempt: each
        # attempt's first act is deleting what no marker names, and a retried task rewrites its files.
        self._remote_files: set[str] | None = self._listed(("docs", "_work/tokens")) if remote else None
        self.batch_docs = batch_docs
        self._schemas: dict[Path, pa.Schema] = {}
        self._shard_sha256: dict[str, str] | None = None  # the manifest's, by shard path
        self._shards_checked: set[str] = set()
        # What the tasks recorded of the files they wrote, to check each file before it is read.
        try:
            self.recorded = recorded_files(self.folder, self.location)
        except storage.StorageError as exc:
            raise ExportError(f"RUN: {exc}") from None
        if self._remote_files is not None:
            self.sources = sorted(
                {rel.split("/")[1] for rel in self._remote_files if rel.startswith("docs/") and rel.endswith(".parquet")}
            )
        else:
            self.sources = (
                sorted(p.name for p in self.folder.docs_dir.iterdir() if p.is_dir()) if self.folder.docs_dir.is_dir() else []
            )
        self._manifest = self._read_manifest()
        self.tokens = self._token_info()

    # --- what the run holds ---------------------------------------------------------
    def _read_manifest(self) -> pa.Table | None:
        path = self.folder.manifest
        return pq.read_table(path) if path.is_file() else None

    def _token_info(self) -> TokenInfo | None:
        if self._manifest is None or self._manifest.num_rows == 0:
            return None
        _, meta = open_shard(self._shard(self._manifest["path"][0].as_py()))
        return TokenInfo(meta.dtype, meta.vocab_size, meta.eos_id, meta.packing, meta.tokenizer_fingerprint)

    def _schema(self, path: Path) -> pa.Schema:
        """A documents file's schema, read once (of a remote file: one request for its footer)."""
        if path not in self._schemas:
            self._check(path)
            self._schemas[path] = pq.read_schema(storage.parquet_source(path))
        return self._schemas[path]

    def _check(self, path: Path) -> None:
        """Refuse a file of the run that is not what its task wrote (``DamagedRunFile``, naming it)."""
        self.recorded.check(path.relative_to(self.root).as_posix(), path)

    def _parquet(self, path: Path) -> pq.ParquetFile:
        """A documents file, checked, opened with its pages' checksums verified as they are decoded."""
        self._check(path)
        return pq.ParquetFile(storage.parquet_source(path), page_checksum_verification=True)

    def _listed(self, folders: tuple[str, ...]) -> set[str]:
        base = storage.child(self.location, "")
        return {f.uri[len(base) :] for folder in folders for f in storage.list_files(storage.child(self.location, folder))}

    def _shard(self, rel: str) -> Path:
        """A packed shard's local path, checked against the manifest's sha256; a remote run's shard is
        downloaded to its mirror first."""
        if self._remote_files is None:
            path = self.root / rel
        else:
            found = storage.info(storage.child(self.location, rel))
            if found is None:
                raise ExportError(f"RUN: {self.location}/{rel} is in the shard manifest but not in the store")
            path = storage.fetch(found)
        self.recorded.check(rel, path)  # its size, as the pack marker recorded it
        if self._shard_sha256 is None:
            assert self._manifest is not None
            self._shard_sha256 = dict(zip(self._manifest["path"].to_pylist(), self._manifest["sha256"].to_pylist()))
        digest = self._shard_sha256.get(rel)
        if rel not in self._shards_checked and digest is not None and sha256_of(path) != digest:
            raise DamagedRunFile(
                f"{self.location}/{rel}: its sha256 differs from the shard manifest's (damaged in place); "
                "it is not the file its task wrote"
            )
        self._shards_checked.add(rel)
        return path

    def doc_files(self, source: str) -> list[Path]:
        # Shard keys are <source>/<NNNNN>: name order is the run's order, which packing followed.
        if self._remote_files is not None:  # mirror paths, read in place (storage.parquet_source)
            return sorted(
                self.root / rel for rel in self._remote_files if rel.startswith(f"docs/{source}/") and rel.endswith(".parquet")
            )
        return sorted((self.folder.docs_dir / source).glob("*.parquet"))

    def columns(self) -> list[str]:
        """Columns a user may export: the kept documents' columns, plus input_ids with tokens."""
        names: dict[str, None] = {}
        for source in self.sources:
            for f in self.doc_files(source)[:1]:
                names.update(dict.fromkeys(self._schema(f).names))
        if self.tokens is not None:
            names[TOKENS] = None
        return list(names)

    def schema_of(self, columns: list[str]) -> pa.Schema:
        """The Arrow types of ``columns`` (first file that has each), input_ids as list<token dtype>."""
        fields = []
        for name in columns:
            if name == TOKENS:
                fields.append(pa.field(TOKENS, pa.list_(self.token_type())))
                continue
            for source in self.sources:
                hit = next((s.field(name) for f in self.doc_files(source) if name in (s := self._schema(f)).names), None)
                if hit is not None:
                    fields.append(pa.field(name, hit.type))
                    break
            else:
                fields.append(pa.field(name, pa.null()))
        return pa.schema(fields)

    def token_type(self) -> pa.DataType:
        return pa.uint16() if self.tokens is not None and self.tokens.dtype == "uint16" else pa.uint32()

    def token_counts(self, split: str) -> dict[str, int]:
        """Tokens per source in one split, from the shard manifest (what the loader and mixture see)."""
        if self._manifest is None:
            return {}
        out: dict[str, int] = {}
        for row in self._manifest.to_pylist():
            if row["split"] == split:
                out[row["source"]] = out.get(row["source"], 0) + int(row["tokens"])
        return out

    # --- streaming ------------------------------------------------------------------
    def repeated(self, source: str) -> bool:
        """Whether the source's documents carry mixture counts (``mixture.<source>.repeat`` or ``rehydrate``)."""
        return any(REPEAT_COLUMN in self._schema(f).names for f in self.doc_files(source))

    def batches(
        self, source: str, split: str, columns: list[str], on_file: Callable[[int], None] | None = None
    ) -> Iterator[pa.Table]:
        """The kept documents of one source and split, in run order, as tables of ``columns``.

        ``input_ids`` (if asked) holds each document's tokens, EOS included, as the
        packed shards hold them. ``on_file(n)``: called after each file of ``docs/`` is read,
        with the number of its documents in ``split`` (for progress; the first pass only).

        A source with mixture counts is streamed as packing lays it out, in rounds
        (``config.mixture.in_round``): each document is there exactly its count of times (0: never),
        its copies spread over the stream.
        """
        if not self.repeated(source):
            yield from self._round(source, split, columns, on_file, None)
            return
        n_rounds = self._most_repeats(source)
        for r in range(n_rounds):
            yield from self._round(source, split, columns, on_file if r == 0 else None, (n_rounds, r))

    def _most_repeats(self, source: str) -> int:
        """The largest mixture count of the source's kept documents: the rounds packing laid out."""
        most = 0
        for f in self.doc_files(source):
            if REPEAT_COLUMN not in self._schema(f).names:
                continue
            counts = self._parquet(f).read(columns=[REPEAT_COLUMN])[REPEAT_COLUMN]
            most = max(most, int(pc.max(counts).as_py() or 0))
        return most

    def _round(
        self,
        source: str,
        split: str,
        columns: list[str],
        on_file: Callable[[int], None] | None,
        round_of: tuple[int, int] | None,
    ) -> Iterator[pa.Table]:
        """One round of a source with mixture counts (``round_of``: rounds, r), or all of one without."""
        want_tokens = TOKENS in columns
        schema = self.schema_of(columns)
        doc_cols = [c for c in columns if c != TOKENS]
        read_cols = list(dict.fromkeys(["id", "split", *doc_cols, *([REPEAT_COLUMN] if round_of is not None else [])]))
        if want_tokens and self.tokens is None:
            raise ExportError(f"--columns: {TOKENS} needs a run with a tokenize section (this run has no shards)")
        recovered = self._recovered_tokens(source, split) if want_tokens and not self._have_token_lists(source) else None
        if recovered is not None and round_of is not None:
            raise ExportError(
                f"RUN: _work/tokens of {source} is gone and its shards repeat documents (mixture.{source}.repeat); "
                "they cannot be cut back into run order: run the pipeline again to export input_ids"
            )
        for path in self.doc_files(source):
            pf = self._parquet(path)
            present = [c for c in read_cols if c in pf.schema_arrow.names]
            token_table = self._token_table(source, path) if want_tokens and recovered is None else None
            cursor = in_split = 0
            for rb in pf.iter_batches(batch_size=self.batch_docs, columns=present):
                table = pa.Table.from_batches([rb])
                n = table.num_rows
                keep = pc.equal(table["split"], split) if "split" in table.column_names else None
                if keep is None and split != "train":
                    keep = pa.array([False] * n)  # a run without splits has train documents only
                if round_of is not None:  # the documents with a copy in this round, as packing laid them out
                    counts = (
                        pc.fill_null(table[REPEAT_COLUMN], 1).to_numpy(zero_copy_only=False)
                        if REPEAT_COLUMN in table.column_names
                        else np.ones(n, np.int64)  # a file written without counts (no documents to count)
                    )
                    due = pa.array(in_round(spread_offsets(table["id"].to_pylist()), counts, *round_of))
                    keep = due if keep is None else pc.and_(pc.fill_null(keep, False), due)
                part = table.filter(keep) if keep is not None else table
                if want_tokens:
                    if recovered is None:
                        assert token_table is not None
                        tok = token_table.slice(cursor, n)
                        if not pc.all(pc.equal(tok["id"], table["id"])).as_py():
                            raise ExportError(
                                f"RUN: token lists of {path.name} do not match its documents; the run folder is inconsistent"
                            )
                        lists = (tok.filter(keep) if keep is not None else tok)["tokens"]
                        part = part.append_column(TOKENS, pc.cast(lists, pa.list_(self.token_type())))
                    else:
                        part = part.append_column(TOKENS, _take_docs(recovered, part.num_rows, self.token_type()))
                cursor += n
                in_split += part.num_rows
                if part.num_rows:
                    yield _select(part, schema)
            if on_file is not None:
                on_file(in_split)
        if recovered is not None and next(recovered, None) is not None:
            raise ExportError(f"RUN: the shards of {source}/{split} hold more documents than docs/ does")

    def _have_token_lists(self, source: str) -> bool:
        if self._remote_files is not None:
            return all(self._token_rel(source, f) in self._remote_files for f in self.doc_files(source))
        return all(self.folder.tokens_file(f"{source}/{f.stem}").is_file() for f in self.doc_files(source))

    def _token_rel(self, source: str, doc_file: Path) -> str:
        return (self.folder.tokens_dir / source / f"{doc_file.stem}.arrow").relative_to(self.root).as_posix()

    def _token_table(self, source: str, doc_file: Path) -> pa.Table:
        self._check(self.root / self._token_rel(source, doc_file))
        if self._remote_files is not None:  # one task's token lists, read whole from the store
            body = storage.read_bytes(storage.child(self.location, self._token_rel(source, doc_file)))
            if body is None:
                raise ExportError(f"RUN: the token lists of {doc_file.name} are gone from {self.location}")
            return pa.ipc.open_file(pa.BufferReader(body)).read_all()
        path = self.folder.tokens_file(f"{source}/{doc_file.stem}")
        return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()  # zero-copy: pages load as read

    def _recovered_tokens(self, source: str, split: str) -> Iterator[np.ndarray]:
        """Documents cut back out of the packed shards at their ``doc_starts``."""
        assert self.tokens is not None and self._manifest is not None
        if self.tokens.packing != "concat":
            raise ExportError(
                f"RUN: _work/tokens is gone and the shards were packed with {self.tokens.packing!r}, "
                f"which reorders documents; only 'concat' shards can be cut back into run order"
            )
        paths = sorted(r["path"] for r in self._manifest.to_pylist() if r["source"] == source and r["split"] == split)
        return _cut_documents(self._shard(rel) for rel in paths)


def _mirror(uri: str) -> Path:
    """The local mirror of the run folder at ``uri``, with its run.json and shard manifest fetched
    (not stats.duckdb, which ``datapipe sql`` fetches: its documents table grows with the corpus)."""
    try:
        return storage.local_run_dir(uri, files=("run.json", "shards/manifest.parquet"))
    except storage.StorageError as exc:
        raise ExportError(f"RUN: {exc}") from None


def _cut_documents(shards: Iterator[Path]) -> Iterator[np.ndarray]:
    carry: list[np.ndarray] = []  # the document that runs over the end of the rows read so far
    for path in shards:
        table, _ = open_shard(path)
        rows = tokens_view(table)
        n_tokens = table["n_tokens"].to_numpy()
        starts = table["doc_starts"].to_pylist()
        for r in range(rows.shape[0]):
            row = rows[r, : n_tokens[r]]
            bounds = [*starts[r], len(row)]
            if not starts[r] or starts[r][0] != 0:  # the row opens with the rest of the carried document
                carry.append(row[: bounds[0]])
            for a, b in zip(bounds[:-1], bounds[1:]):
                if carry:
                    yield np.concatenate(carry)
                carry = [row[a:b]]
    if carry:
        yield np.concatenate(carry)


def _take_docs(docs: Iterator[np.ndarray], n: int, value_type: pa.DataType) -> pa.Array:
    items = []
    for _ in range(n):
        doc = next(docs, None)
        if doc is None:
            raise ExportError("RUN: the shards hold fewer documents than docs/ does; the run folder is inconsistent")
        items.append(doc)
    lengths = np.fromiter((len(d) for d in items), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(items) if items else np.empty(0, dtype=np.uint32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, value_type))


def _select(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in ``schema``'s order and types; a column one source lacks is null there."""
    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table[f.name]
            cols.append(col if col.type == f.type else pc.cast(col, f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.table(cols, schema=schema)
