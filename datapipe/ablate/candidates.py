"""What a proxy is trained on: a candidate's documents, tokenized and packed into its own shards.

A candidate is a finished run folder and a ``WHERE`` clause over its ``documents`` audit table
(default ``status = 'kept'``: what the run kept). The clause sees every document of the run, the
rejected ones with their recorded signals too, so another decision needs no new run:
``status = 'kept' OR stage = 'quality'`` is the run without its quality filter, ``status = 'kept'
AND quality_score > 0.5`` a stricter threshold, ``source <> 'zh_docs'`` a source left out. (A run
re-decided with ``datapipe run --from OLD_RUN`` is a run folder like any other.)

Every candidate's documents are packed anew (``materialize``), not read from the run's shards: a
packed row of the run mixes documents, so leaving some out needs new rows, and two things must hold
for every candidate alike:

- the held-out documents (``heldout``: a fixed share by a hash of the id, the same ids in every
  run of the same inputs) are never trained on; they are the evaluation text (``evaluate.py``);
- documents holding a benchmark n-gram (the evaluation benchmarks' index, ``decontaminate/``)
  are left out, so benchmark accuracy is not memorisation.

The packed candidate is a folder in the loader's format (``shards/manifest.parquet``, one shard per
source, ``run.json`` saying complete), so training draws from it through ``PackedDataset`` with its
mixture weights and exact resume. It is kept under a name that hashes everything it depends on,
and reused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.audit.sql import AuditError, connect, read_run_json
from datapipe.config.sections import TokenizeConfig
from datapipe.decontaminate.index import BenchmarkIndex
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.storage.atomic import write_text_atomic
from datapipe.tokens.encode import TokenizerInfo, encode_documents, load_tokenizer_info, with_engine
from datapipe.tokens.packing import ConcatPacker
from datapipe.tokens.shard_format import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    SHARDS_DIR,
    ShardMeta,
    file_sha256,
    manifest_row,
    shard_file_name,
)
from datapipe.tokens.shard_writer import write_manifest as write_manifest_files
from datapipe.tokens.shard_writer import write_shard

DEFAULT_WHERE = "status = 'kept'"
HELDOUT_SALT = b"datapipe-ablate-heldout:"  # independent of the run's own val split (another hash)
FORMAT = 1  # bump when a packed candidate's layout changes: old ones are then rebuilt


class CandidateError(DatapipeError, ValueError):
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Candidate:
    name: str
    run: Path
    where: str = DEFAULT_WHERE
    mixture: dict[str, float] | None = None  # source weights for the loader; None: as packed

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "run": str(self.run), "where": self.where, "mixture": self.mixture}


def parse_weights(text: str, what: str) -> dict[str, float]:
    """``src=0.5,src2=0.5`` (or a JSON object) as weights."""
    text = text.strip()
    try:
        if text.startswith("{"):
            weights = {str(k): float(v) for k, v in json.loads(text).items()}
        else:
            weights = {k.strip(): float(v) for k, v in (part.split("=", 1) for part in text.split(",") if part.strip())}
    except (ValueError, json.JSONDecodeError):
        raise CandidateError(f"{what}: {text!r} is not weights: write source=weight,source=weight") from None
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise CandidateError(f"{what}: weights must be >= 0 and not all 0, got {text!r}")
    return weights


def parse_candidates(specs: list[str], wheres: list[str], mixtures: list[str]) -> list[Candidate]:
    """``--candidate NAME=RUN`` (several), ``--where NAME=SQL`` and ``--mixture NAME=src=w,...`` for some."""

    def split(spec: str, option: str) -> tuple[str, str]:
        name, sep, value = spec.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise CandidateError(f"{option} {spec!r}: write {option} NAME=VALUE")
        return name.strip(), value.strip()

    runs: dict[str, Path] = {}
    for spec in specs:
        name, run = split(spec, "--candidate")
        if name in runs:
            raise CandidateError(f"--candidate {name}: named twice")
        runs[name] = Path(run)
    where = dict(split(s, "--where") for s in wheres)
    mix = {n: parse_weights(v, f"--mixture {n}") for n, v in (split(s, "--mixture") for s in mixtures)}
    for option, named in (("--where", where), ("--mixture", mix)):
        unknown = sorted(set(named) - set(runs))
        if unknown:
            raise CandidateError(f"{option} names {unknown}, which no --candidate defines (candidates: {', '.join(runs)})")
    return [Candidate(n, r, where.get(n, DEFAULT_WHERE), mix.get(n)) for n, r in runs.items()]


def heldout(ids: list[str], fraction: float) -> np.ndarray:
    """True for the held-out ids: a fixed share by a hash of the id alone, so the same document is held
    out of every candidate and every run of the same inputs."""
    limit = int(fraction * 2**64)
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(HELDOUT_SALT + i.encode(), digest_size=8).digest(), "little") < limit for i in ids),
        dtype=bool,
        count=len(ids),
    )


def run_tokenizer(run: Path, override: Path | None = None) -> TokenizerInfo:
    """The tokenizer the run tokenized with: ``override``, else the run's ``tokenize.tokenizer``
    (relative to the pipeline file, as run.json names it: from where `datapipe run` was started).
    Its sha256 must be the one the run recorded: proxies of one ablation read one tokenizer's ids."""
    record = read_run_json(run)
    cfg = (record.get("config") or {}).get("tokenize")
    if not cfg:
        raise CandidateError(f"{run}: the run has no tokenize section; a proxy needs the run's tokenizer")
    tok = TokenizeConfig(**{k: v for k, v in cfg.items() if k in TokenizeConfig.model_fields})
    path = override or Path(tok.tokenizer)
    if override is None and not path.is_absolute():
        path = Path(record.get("pipeline_file") or run / "x").parent / path
    if not path.is_file():
        raise CandidateError(
            f"{run}: its tokenizer {path} is not there (tokenize.tokenizer, relative to the pipeline file "
            f"{record.get('pipeline_file')} as named from where the run was started); pass --tokenizer PATH"
        )
    info = load_tokenizer_info(path, tok)
    recorded = cfg.get("tokenizer_sha256")
    if recorded and info.fingerprint != recorded:
        raise CandidateError(f"{path} is not the tokenizer {run} was tokenized with (sha256 {recorded[:12]}...)")
    return with_engine(info)  # tiktoken where it gives the same ids: faster


def select_documents(run: Path, where: str) -> pa.Table:
    """id, source, lang, text of the run's documents that satisfy ``where`` (ordered by id)."""
    sql = (
        f"WITH sel AS (SELECT id, source, lang FROM documents WHERE {where}), "
        "txt AS (SELECT id, text FROM kept_docs UNION ALL SELECT id, text FROM rejected_docs) "
        "SELECT sel.id, sel.source, coalesce(sel.lang, '') AS lang, txt.text FROM sel JOIN txt ON sel.id = txt.id ORDER BY sel.id"
    )
    con = connect(run, text_views=True)
    try:
        return con.sql(sql).to_arrow_table()
    except Exception as exc:  # duckdb's errors: the user's SQL, reported as such
        if isinstance(exc, AuditError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CandidateError(f"--where {where!r} over {run}/documents: {first}") from None
    finally:
        con.close()


def _identity(run: Path) -> dict[str, Any]:
    record = read_run_json(run)
    return {"run": str(run.resolve()), "fingerprint": record.get("fingerprint"), "finished": record.get("finished")}


def pack_candidate(
    out: Path, tokens_by_source: dict[str, tuple[np.ndarray, np.ndarray, int]], info: TokenizerInfo, seq_len: int
) -> None:
    """One shard per source of rows of seq_len + 1 tokens (the last one for labels), concatenated documents."""
    row_len = seq_len + 1
    dtype = np.dtype(info.dtype)
    rows = []
    for source, (flat, offsets, n_docs) in sorted(tokens_by_source.items()):
        packer = ConcatPacker(row_len, info.pad_id, dtype)
        parts = [packer.add(flat, offsets), packer.finish()]
        parts = [p for p in parts if len(p.n_tokens)]
        if not parts:
            continue
        tokens = np.concatenate([p.tokens for p in parts])
        n_tokens = np.concatenate([p.n_tokens for p in parts])
        values = np.concatenate([p.doc_start_values for p in parts])
        splits = np.concatenate(
            [parts[0].doc_start_splits] + [p.doc_start_splits[1:] + parts[0].doc_start_splits[-1] for p in parts[1:]]
        )
        meta = ShardMeta(
            info.fingerprint,
            info.vocab_size,
            seq_len,
            row_len,
            info.eos_id,
            info.pad_id,
            info.bos_id,
            "concat",
            source,
            "train",
            info.dtype,
            documents=int(n_docs),
        )
        rel = f"{SHARDS_DIR}/{shard_file_name(source, 'train', 0)}"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        written = write_shard(out / rel, tokens, splits, values, n_tokens, meta)
        rows.append(
            manifest_row(
                rel,
                source,
                "train",
                written.rows,
                written.tokens,
                int(n_docs),
                file_sha256(out / rel),
                info.fingerprint,
                seq_len,
                row_len,
                "concat",
            )
        )
    if not rows:
        raise CandidateError(f"{out.name}: no documents left to train on")
    write_manifest_files(pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA), out / SHARDS_DIR / MANIFEST_NAME)


def materialize(
    cand: Candidate,
    root: Path,
    seq_len: int,
    heldout_fraction: float,
    index: BenchmarkIndex | None,
    index_key: str,
    log: Any = print,
    tokenizer: Path | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The candidate packed into ``root/<name>-<hash>/`` (built once), and what went into it."""
    key = json.dumps(
        {
            "format": FORMAT,
            **_identity(cand.run),
            "where": cand.where,
            "seq_len": seq_len,
            "heldout": heldout_fraction,
            "index": index_key,
        },
        sort_keys=True,
    )
    out = root / f"{cand.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    done = out / "run.json"
    if done.is_file():
        return out, json.loads(done.read_text())["stats"]
    info = run_tokenizer(cand.run, tokenizer)
    table = select_documents(cand.run, cand.where)
    ids = table["id"].to_pylist()
    held = heldout(ids, heldout_fraction)
    texts = table["text"].to_pylist()
    contaminated = np.zeros(len(ids), dtype=bool)
    if index is not None:
        contaminated = np.fromiter((m is not None for m in index.match(texts)), dtype=bool, count=len(texts))
    keep = ~held & ~contaminated
    sources = np.asarray(table["source"].to_pylist(), dtype=object)
    by_source: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    stats: dict[str, Any] = {
        "selected": len(ids),
        "heldout": int(held.sum()),
        "contaminated": int((contaminated & ~held).sum()),
        "sources": {},
    }
    for source in sorted(set(sources[keep].tolist())):
        picked = [t for t, k, s in zip(texts, keep, sources) if k and s == source]
        enc = encode_documents(picked, info)
        flat = enc.values.to_numpy()
        offsets = enc.offsets.to_numpy()
        by_source[source] = (flat, offsets, len(picked))
        stats["sources"][source] = {"documents": len(picked), "tokens": int(len(flat))}
    out.mkdir(parents=True, exist_ok=True)
    pack_candidate(out, by_source, info, seq_len)
    write_text_atomic(
        done, json.dumps({"status": "complete", "candidate": cand.describe(), "key": json.loads(key), "stats": stats}, indent=1)
    )
    log(
        f"ablate: packed candidate {cand.name}: {len(ids):,} documents selected, {stats['heldout']:,} held out, "
        f"{stats['contaminated']:,} contaminated, {sum(s['tokens'] for s in stats['sources'].values()):,} tokens"
    )
    return out, stats
