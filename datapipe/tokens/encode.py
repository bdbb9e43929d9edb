"""Tokenization with any Hugging Face ``tokenizer.json``, and the split of documents into train/val."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.config.sections import TokenizeConfig
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.runtime.process_cache import process_cache
from datapipe.runtime.release_memory import release_memory
from datapipe.tokens.fast_bpe import FastEncoder, FastPlan, plan_fast_encoder, plan_from_json, plan_to_json, probe_text
from datapipe.tokens.shard_format import token_dtype

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<|end_of_text|>")
PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]")
TOKENS_TYPE = pa.large_list(pa.uint32())
# "tokenizers" keeps every run on the Hugging Face library, "tiktoken" on datapipe's own fast path
# (to compare engines); unset: the fastest exact one (fastokens, else tiktoken, else tokenizers).
ENGINE_ENV = "DATAPIPE_TOKENIZER_ENGINE"
ENGINES = ("fastokens", "tiktoken", "tokenizers")
SAMPLE_CHARS = 1 << 16  # of a worker's first batch, encoded both ways before a fast encoder is trusted

log = logging.getLogger(__name__)


class TokenizerError(DatapipeError, ValueError):
    exit_code = EXIT_USAGE

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


@dataclass(frozen=True)
class TokenizerInfo:
    path: str
    fingerprint: str  # sha256 of tokenizer.json: shards from different tokenizers never mix
    vocab_size: int
    eos_id: int
    pad_id: int
    bos_id: int | None
    # Which library encodes: "fastokens" or "tiktoken" (exact, checked) or "tokenizers"; not part of
    # any identity, since all give the same ids. engine_note says why a faster one was not taken.
    engine: str = "tokenizers"
    engine_note: str = ""

    def describe(self) -> str:
        """The encoder and why, as the run's log and ``datapipe validate`` say it."""
        return f"{self.engine}: {self.engine_note}" if self.engine_note else f"{self.engine}, {_EXACT[self.engine]}"

    @property
    def dtype(self) -> str:
        return token_dtype(self.vocab_size).name


def load_tokenizer_info(path: Path, config: TokenizeConfig) -> TokenizerInfo:
    data = path.read_bytes()
    fingerprint = hashlib.sha256(data).hexdigest()
    names = [config.eos_token, config.pad_token, config.bos_token]
    key = f"info-v{FACTS_VERSION}-{fingerprint[:32]}-{_versions('tokenizers')}-{_digest(names)}"
    stored = _read_stored(key)
    if isinstance(stored, list) and len(stored) == 4 and all(isinstance(v, int) for v in stored[:3]):
        # (vocabulary size, eos, pad, bos ids) as an earlier driver parsed them from this very file
        return TokenizerInfo(str(path), fingerprint, *stored)
    info = _parsed_info(path, config, fingerprint, data)
    _store(key, [info.vocab_size, info.eos_id, info.pad_id, info.bos_id])
    return info


def _parsed_info(path: Path, config: TokenizeConfig, fingerprint: str, data: bytes) -> TokenizerInfo:
    tok = _parsed(str(path), fingerprint, data)

    def lookup(key: str, name: str | None, candidates: tuple[str, ...], required: bool) -> int | None:
        names = (name,) if name else candidates
        for n in names:
            tid = tok.token_to_id(n)
            if tid is not None:
                return tid
        if name:
            raise TokenizerError(key, f"token {name!r} is not in the vocabulary of {path.name}")
        if required:
            raise TokenizerError(key, f"{path.name} has none of {', '.join(candidates)}; set {key} to its end-of-document token")
        return None

    eos = lookup("eos_token", config.eos_token, EOS_CANDIDATES, True)
    assert eos is not None  # required: lookup raised otherwise
    pad = lookup("pad_token", config.pad_token, PAD_CANDIDATES, False)
    bos = lookup("bos_token", config.bos_token, (), False) if config.bos_token else None
    return TokenizerInfo(
        str(path),
        fingerprint,
        tok.get_vocab_size(with_added_tokens=True),
        int(eos),
        int(pad if pad is not None else eos),
        bos,
    )


# Parsed tokenizer files per (path, sha256). A driver reads the file three times while it loads and
# plans a run (the pipeline's checks, the plan, the engine's probe): parsed once, not three times
# (~0.15 CPU s each for a 32k vocabulary). Emptied with the other process caches, so a driver whose
# tasks run on Ray does not hold it through the run.
_PARSED: dict[tuple[str, str], Any] = process_cache({})


def _parsed(path: str, fingerprint: str, data: bytes) -> Any:
    key = (path, fingerprint)
    if key not in _PARSED:
        from tokenizers import Tokenizer

        try:
            _PARSED[key] = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises plain Exceptions for bad files
            raise TokenizerError("tokenizer", f"{path} is not a Hugging Face tokenizer.json: {exc}") from None
    return _PARSED[key]


_EXACT = {
    "fastokens": "ids checked against tokenizers' on a probe text, and in each worker on a sample of its first batch",
    "tiktoken": "datapipe's exact fast path, ids checked against tokenizers' on a probe text and on each worker's first batch",
    "tokenizers": "the reference",
}


def with_engine(info: TokenizerInfo) -> TokenizerInfo:
    """``info`` with its engine: fastokens where it loads the file and gives tokenizers' ids on the probe text
    (with the file's added tokens in it), else today's choice (tiktoken where it reproduces the tokenizer,
    else tokenizers), and why."""
    import dataclasses

    forced = os.environ.get(ENGINE_ENV) or None
    if forced is not None and forced not in ENGINES:
        raise TokenizerError(ENGINE_ENV, f"{ENGINE_ENV}={forced!r} is not an encoder: one of {', '.join(ENGINES)}, or unset")
    if forced == "tokenizers":
        return dataclasses.replace(info, engine="tokenizers", engine_note=f"{ENGINE_ENV}=tokenizers")
    key = (info.path, info.fingerprint, forced)
    if key not in _ENGINES:  # a driver plans a run more than once (the executor's choice, then the run)
        decided_by = _digest([forced, PLAN_VERSION, probe_text()])
        name = f"engine-v{FACTS_VERSION}-{info.fingerprint[:32]}-{_versions(*ENGINES)}-{decided_by}"
        stored = _read_stored(name)
        if isinstance(stored, list) and len(stored) == 2 and stored[0] in ENGINES:
            _ENGINES[key] = (stored[0], stored[1])
        else:
            _ENGINES[key] = _engine_verdict(info, forced)
            _store(name, list(_ENGINES[key]))
    engine, note = _ENGINES[key]
    return dataclasses.replace(info, engine=engine, engine_note=note)


def _engine_verdict(info: TokenizerInfo, forced: str | None) -> tuple[str, str]:
    """(engine, note) for ``info``'s file: what ``with_engine`` says, found by loading and probing."""
    why_not = f"{ENGINE_ENV}=tiktoken" if forced == "tiktoken" else _fastokens_verdict(info)
    if not why_not:
        return "fastokens", ""
    engine, note = _today_engine(info)
    return engine, f"{why_not}; using {engine}" + (f" ({note})" if note else "")


# What a driver learns of a tokenizer file by parsing it (its vocabulary size and special ids) and by
# probing the encoders on it (which one gives tokenizers' ids), kept in the cache folder by the file's
# sha256 and the versions that decide it, as the fast encoder's plan is: each run's driver otherwise
# parses the file with tokenizers and with fastokens and encodes the probe with both (~0.9 CPU s for a
# 32k vocabulary), for the same answer every time. Each worker still checks its encoder on a sample of
# its first batch. Bump when what a stored record means changes.
FACTS_VERSION = 1


def _versions(*packages: str) -> str:
    """The installed versions of ``packages`` ("none" for one not installed), as part of a stored name."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in packages:
        try:
            out.append(f"{package}{version(package)}")
        except PackageNotFoundError:
            out.append(f"{package}none")
    return "-".join(out)


def _digest(values: list[Any]) -> str:
    import json

    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def _read_stored(name: str) -> Any:
    import json

    from datapipe.storage.cache import cache_dir

    try:
        return json.loads((cache_dir() / "tokens" / f"{name}.json").read_bytes())
    except (OSError, ValueError):
        return None


def _store(name: str, value: Any) -> None:
    """``value`` as JSON in the cache folder, under a private name first, so a concurrent reader sees
    all of it or nothing; a read-only cache keeps nothing (the next driver finds it out again)."""
    import json

    from datapipe.storage.cache import cache_dir

    path = cache_dir() / "tokens" / f"{name}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError:
        pass


def _today_engine(info: TokenizerInfo) -> tuple[str, str]:
    """The encoder before fastokens: tiktoken where the plan reproduces the tokenizer and agrees on the probe text."""
    plan = _plan(info)
    if isinstance(plan, str):
        return "tokenizers", plan
    text = probe_text()
    ids = FastEncoder(plan).encode(text)
    same = ids is not None and ids.tolist() == _reference(info).encode(text, add_special_tokens=False).ids
    return ("tiktoken", "") if same else ("tokenizers", "tiktoken's ids differ from tokenizers' on the probe text")


def _reference(info: TokenizerInfo) -> Any:
    return _PARSED.get((info.path, info.fingerprint)) or get_tokenizer(info.path)


def _fastokens_verdict(info: TokenizerInfo) -> str:
    """Why fastokens cannot encode ``info``'s file ("" where it can): it does not load it, or its ids differ
    from tokenizers' on the probe text followed by every added token of the file, each between words."""
    try:
        encoder = _fastokens(info.path)
    except ImportError as exc:
        return f"fastokens is not installed ({exc})"
    except Exception as exc:  # fastokens raises plain Exceptions (ValueError, RuntimeError) for files it does not take
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"fastokens could not load this tokenizer: {reason}"
    reference = _reference(info)
    added = [t.content for t in reference.get_added_tokens_decoder().values()]
    text = probe_text() + "".join(f" a{t}b {t}" for t in added)
    try:
        same = encoder.encode_batch([text])[0].tolist() == reference.encode(text, add_special_tokens=False).ids
    except Exception as exc:
        return f"fastokens failed on the probe text: {exc}"
    return "" if same else "fastokens' ids differ from tokenizers' on the probe text"


class FastokensEncoder:
    """fastokens (crusoecloud/fastokens, Apache-2.0) on one tokenizer.json: a batch's ids as one flat
    uint32 buffer and its offsets, no Python object per token."""

    def __init__(self, path: str) -> None:
        # fastokens sizes its own worker pool once per process, at its first use, from
        # FASTOKENS_BPE_THREADS (else every core): a 1-CPU Ray task must encode on its own thread,
        # not spin up a pool the size of the node. Set before the first tokenizer is built.
        os.environ.setdefault("FASTOKENS_BPE_THREADS", str(encode_threads()))
        import fastokens

        self._tok = fastokens.Tokenizer.from_file(path)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every text's ids end to end, offsets: len(texts) + 1); no special tokens added, as tokenizers'
        ``add_special_tokens=False``; added tokens written in the text are matched, as tokenizers does."""
        ids, offsets = self._tok.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids, offsets = self.encode_flat(texts)
        bounds = offsets.tolist()
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


_FASTOKENS: dict[str, FastokensEncoder] = process_cache({})


def _fastokens(path: str) -> FastokensEncoder:
    if path not in _FASTOKENS:
        _FASTOKENS[path] = FastokensEncoder(path)
    return _FASTOKENS[path]


# The verdict and the plan per (tokenizer file, its sha256): a run in the driver plans once for the
# verdict and its tasks use the same plan (0.25 CPU s each for a 32k vocabulary).
_ENGINES: dict[tuple[str, str, str | None], tuple[str, str]] = process_cache({})
_PLANS: dict[tuple[str, str], FastPlan | str] = process_cache({})


def _plan(info: TokenizerInfo) -> FastPlan | str:
    key = (info.path, info.fingerprint)
    if key not in _PLANS:
        _PLANS[key] = _stored_plan(info)
    return _PLANS[key]


# Bump when plan_fast_encoder's result for a file can change: stored plans are found by it.
PLAN_VERSION = 1


def _stored_plan(info: TokenizerInfo) -> FastPlan | str:
    """The plan of ``info``'s file, kept in the cache folder by the file's sha256 (and the versions
    that decide it). Planning parses the whole tokenizer.json and has tokenizers rebuild every
    token (0.3 CPU s and ~25 MiB of parsed JSON for a 32k vocabulary) in the driver and again in
    every worker that tokenizes; a stored plan loads in a few milliseconds."""
    import json

    import tiktoken
    import tokenizers

    from datapipe.storage.cache import cache_dir

    name = f"plan-v{PLAN_VERSION}-{info.fingerprint[:32]}-tokenizers{tokenizers.__version__}-tiktoken{tiktoken.__version__}.json"
    path = cache_dir() / "tokens" / name
    try:
        return plan_from_json(json.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    plan = plan_fast_encoder(json.loads(Path(info.path).read_bytes()))
    try:  # a private temporary name, then renamed: a concurrent reader sees all of it or nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(plan_to_json(plan)))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: plan each time
        pass
    return plan


_TOKENIZERS: dict[str, object] = process_cache({})


def get_tokenizer(path: str):
    if path not in _TOKENIZERS:
        from tokenizers import Tokenizer

        _TOKENIZERS[path] = Tokenizer.from_file(path)
    return _TOKENIZERS[path]


# Characters per encode_batch call. The Rust encodings of one call all live at once (ids, tokens as
# strings, offsets, masks: ~100 bytes per token), so a 1000-document batch of long documents held
# 600+ MB in a worker; a bounded sub-batch keeps that to tens of MB, with the same ids.
ENCODE_CHUNK_CHARS = 1 << 18


def _chunks(texts: list[str], max_chars: int) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive texts of at most ``max_chars`` characters (at least one text)."""
    out, start, size = [], 0, 0
    for i, t in enumerate(texts):
        if i > start and size + len(t) > max_chars:
            out.append((start, i))
            start, size = i, 0
        size += len(t)
    if start < len(texts):
        out.append((start, len(texts)))
    return out


# This process's encoder per (tokenizer file, engine chosen), once checked on the first batch it
# encodes: (engine, encoder).
_FAST: dict[tuple[str, str], tuple[str, FastokensEncoder | FastEncoder | None]] = process_cache({})


def _sample(texts: list[str]) -> list[str]:
    sample, size = [], 0
    for t in texts:
        if size >= SAMPLE_CHARS:
            break
        sample.append(t[: SAMPLE_CHARS - size])
        size += len(sample[-1])
    return sample


def process_encoder(info: TokenizerInfo, texts: list[str]) -> tuple[str, FastokensEncoder | FastEncoder | None]:
    """This process's encoder for ``info``: (engine, encoder; None for tokenizers), checked once, on a
    sample of ``texts`` (the first batch it encodes), against tokenizers' ids. A difference logs a
    warning and this process takes the next engine: fastokens -> tiktoken (its own check) -> tokenizers."""
    if info.engine == "tokenizers":
        return "tokenizers", None
    key = (info.path, info.engine)
    if key not in _FAST:
        _FAST[key] = _checked_encoder(info, _sample(texts))
        if _FAST[key][1] is not None:
            # What the check needed is not needed again here: the tokenizer (~26 MiB for a 32k
            # vocabulary; reloaded for a rare text a fast path hands back) and the plan (the
            # encoder has its ranks). Each worker would otherwise hold both through its encoding.
            _TOKENIZERS.pop(info.path, None)
            _PLANS.pop((info.path, info.fingerprint), None)
            release_memory(collect=False)
    return _FAST[key]


def _checked_encoder(info: TokenizerInfo, sample: list[str]) -> tuple[str, FastokensEncoder | FastEncoder | None]:
    engine = info.engine
    want: list[list[int]] | None = None

    def reference() -> list[list[int]]:
        return [e.ids for e in get_tokenizer(info.path).encode_batch_fast(sample, add_special_tokens=False)]

    if engine == "fastokens":
        fk = _fastokens(info.path)
        want = reference() if sample else []
        try:
            same = [g.tolist() for g in fk.encode_batch(sample)] == want if sample else True
        except Exception as exc:  # a text fastokens raises on: not trusted for this run's text
            log.warning("fastokens failed on this run's text (%s): %s", info.path, exc)
            same = False
        if same:
            return "fastokens", fk
        engine, note = _today_engine(info)
        log.warning(
            "fastokens' ids differ from tokenizers' on this run's text (%s): encoding with %s%s",
            info.path,
            engine,
            f" ({note})" if note else "",
        )
    if engine == "tiktoken":
        plan = _plan(info)
        enc = FastEncoder(plan) if not isinstance(plan, str) else None
        if enc is not None and sample:
            want = reference() if want is None else want
            got = enc.encode_batch(sample)
            if any(g is not None and g.tolist() != w for g, w in zip(got, want)):
                log.warning("tiktoken's ids differ from tokenizers' on this run's text (%s): encoding with tokenizers", info.path)
                enc = None
        if enc is not None:
            return "tiktoken", enc
    return "tokenizers", None


def encoder_used(info: TokenizerInfo) -> str | None:
    """The engine this process encodes ``info``'s documents with (None: it has not encoded any yet)."""
    if info.engine == "tokenizers":
        return "tokenizers"
    used = _FAST.get((info.path, info.engine))
    return used[0] if used is not None else None


def fast_encoder(info: TokenizerInfo, texts: list[str]) -> FastokensEncoder | FastEncoder | None:
    """This process's fast encoder for ``info`` (None: use tokenizers), checked once on a sample of ``texts``."""
    return process_encoder(info, texts)[1]


def encode_threads() -> int:
    """Threads the fast path encodes on: what ``tokenizers`` would use here. A Ray worker's task sets
    RAYON_NUM_THREADS to its CPUs (engine/executors/ray/worker.py), so a 1-CPU task encodes on one thread; a run in
    the driver uses every core it may (tiktoken releases the GIL while it encodes)."""
    try:
        return max(1, int(os.environ.get("RAYON_NUM_THREADS", "")))
    except ValueError:
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1


def _encode_ids(texts: list[str], info: TokenizerInfo, fast_ids: list[np.ndarray | None] | None) -> list:
    """Ids per text: the fast path's (numpy arrays, given), else (None) lists from tokenizers."""
    ids: list = list(fast_ids) if fast_ids is not None else [None] * len(texts)
    rest = [i for i, x in enumerate(ids) if x is None]
    if rest:
        encodings = get_tokenizer(info.path).encode_batch_fast([texts[i] for i in rest], add_special_tokens=False)
        for i, e in zip(rest, encodings):
            ids[i] = e.ids  # each .ids builds a new Python list: read it once
    return ids


def encode_documents(texts: list[str], info: TokenizerInfo, arrow: pa.Array | None = None) -> pa.LargeListArray:
    """Token ids per document, each ending with EOS (and starting with BOS if configured).
    ``arrow``: the same texts as an Arrow string array, where the caller has one (the fast path reads it)."""
    fast = fast_encoder(info, texts)
    if isinstance(fast, FastokensEncoder):
        try:
            return _framed(*fast.encode_flat(texts), info)
        except Exception as exc:  # a text fastokens raises on: this batch with tokenizers
            log.warning("fastokens failed on a batch (%s): %s; encoding it with tokenizers", info.path, exc)
            fast = None
    # The fast path's ids take 4 bytes a token (no per-token objects): the whole batch in one call,
    # which keeps its threads busy; only tokenizers' encodings are bounded per chunk.
    fast_ids = fast.encode_batch(texts, encode_threads(), arrow) if isinstance(fast, FastEncoder) else None
    extra = 1 + (info.bos_id is not None)
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for lo, hi in _chunks(texts, ENCODE_CHUNK_CHARS):
        # tokenizers: Rust threads, no offsets; one chunk's at a time
        ids = _encode_ids(texts[lo:hi], info, fast_ids[lo:hi] if fast_ids is not None else None)
        n = np.fromiter((len(i) + extra for i in ids), dtype=np.int64, count=len(ids))
        ends = np.cumsum(n)
        flat = np.empty(int(ends[-1]), dtype=np.uint32)
        for doc, end in zip(ids, ends.tolist()):
            start = end - len(doc) - 1
            if info.bos_id is not None:
                flat[start - 1] = info.bos_id
            flat[start : end - 1] = doc
        flat[ends - 1] = info.eos_id
        parts.append(flat)
        lengths.append(n)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if texts:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.uint32()))


def _framed(ids: np.ndarray, offsets: np.ndarray, info: TokenizerInfo) -> pa.LargeListArray:
    """Documents' ids, end to end with their ``offsets``, as lists with BOS (if configured) before each and EOS after."""
    n = len(offsets) - 1
    if info.bos_id is None:
        at, marks = offsets[1:], np.full(n, info.eos_id, np.uint32)
    else:  # per document: BOS at its start, then EOS at its end (the order np.insert keeps at one index)
        at = np.column_stack([offsets[:-1], offsets[1:]]).ravel()
        marks = np.tile(np.array([info.bos_id, info.eos_id], np.uint32), n)
    flat = np.insert(ids, at, marks)  # one new buffer; no per-token index array
    out_offsets = offsets + (1 + (info.bos_id is not None)) * np.arange(n + 1, dtype=np.int64)
    return pa.LargeListArray.from_arrays(pa.array(out_offsets), pa.array(flat, pa.uint32()))


def assign_split(ids: list[str], val_fraction: float) -> pa.Array:
    """'val' for a stable, id-hashed share of documents: re-tokenizing never moves a document."""
    if val_fraction <= 0:
        return pa.array(["train"] * len(ids), pa.string())
    limit = int(val_fraction * 2**64)
    splits = [
        "val" if int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") < limit else "train" for i in ids
    ]
    return pa.array(splits, pa.string())
