"""Training a byte-level BPE tokenizer on a run's kept documents or on files.

Documents are grouped (zh, en, code, ...: the ``lang`` column, or ``code`` for code
sources) and sampled per group to ``sample_chars x weight`` characters. Sampling is by a
hash of the document id (bottom-k), so it streams with memory bounded by the sample,
does not depend on file order, and a re-run picks the same documents. A hash-chosen
share of documents is held back and never trained on; characters per token are
measured on it per group.
"""

from __future__ import annotations

import glob
import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.errors import InputNotFound, UsageError
from datapipe.readers.streams import json_records
from datapipe.run_folder.layout import RunFolder
from datapipe.text import charclass

CODE_EXTENSIONS = {
    ".py",
    ".js",
    ".ts",
    ".java",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".go",
    ".rs",
    ".rb",
    ".php",
    ".sh",
    ".sql",
    ".scala",
    ".kt",
    ".swift",
    ".cs",
    ".lua",
    ".pl",
    ".r",
    ".m",
    ".jl",
    ".hs",
}
_HAN = re.compile(f"[{charclass.regex_class(charclass.HAN)}]")  # datapipe.text.charclass
_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class Doc:
    id: str
    group: str
    text: str


@dataclass(frozen=True)
class TrainOptions:
    vocab_size: int = 32000
    mix: dict[str, float] = field(default_factory=lambda: {"zh": 0.4, "en": 0.4, "code": 0.2})
    bos: str = "<|bos|>"
    eos: str = "<|endoftext|>"
    pad: str = "<|pad|>"
    special: tuple[str, ...] = ()
    sample_chars: int = 20_000_000
    heldout_frac: float = 0.02
    min_frequency: int = 2

    @property
    def special_tokens(self) -> list[str]:
        return list(dict.fromkeys([self.eos, self.pad, self.bos, *self.special]))  # eos gets id 0


@dataclass(frozen=True)
class GroupStats:
    group: str
    train_docs: int
    train_chars: int
    heldout_docs: int
    heldout_chars: int
    heldout_tokens: int
    target_chars: int = 0  # its share of sample_chars: what the mix asked for
    weight: float = 0.0  # its weight in the mix (normalized)
    share: float = 0.0  # its share of the characters actually trained on

    @property
    def chars_per_token(self) -> float | None:
        return self.heldout_chars / self.heldout_tokens if self.heldout_tokens else None

    @property
    def filled(self) -> bool:
        return self.train_chars >= self.target_chars


@dataclass(frozen=True)
class TrainResult:
    path: Path
    vocab_size: int
    special_ids: dict[str, int]
    groups: list[GroupStats]
    sha256: str
    warnings: list[str] = field(default_factory=list)


def parse_mix(text: str) -> dict[str, float]:
    """'zh=0.4,en=0.4,code=0.2' -> weights normalized to sum 1."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name.strip() or weight < 0:
            raise UsageError(f"bad mix entry {part!r}: expected GROUP=WEIGHT, e.g. zh=0.4,en=0.4,code=0.2")
        mix[name.strip()] = weight
    total = sum(mix.values())
    if total <= 0:
        raise UsageError("the mix weights must not all be 0")
    return {k: v / total for k, v in mix.items()}


def guess_group(text: str) -> str:
    """zh when Han characters are at least 30% of the letters, else en: for files without a lang field."""
    letters = len(_LETTER.findall(text[:5000]))
    return "zh" if letters and len(_HAN.findall(text[:5000])) / letters >= 0.3 else "en"


def docs_from_run(run_dir: Path) -> Iterator[Doc]:
    """Kept documents of a run: group ``code`` for code sources, else the ``lang`` column."""
    files = sorted(RunFolder(Path(run_dir)).docs_dir.glob("**/*.parquet"))
    if not files:
        raise InputNotFound(f"no kept documents in {run_dir}/docs: is it a run folder?")
    for path in files:
        pf = pq.ParquetFile(path)
        cols = [c for c in ("id", "kind", "lang", "text") if c in pf.schema_arrow.names]
        for batch in pf.iter_batches(columns=cols, batch_size=2048):
            data = batch.to_pydict()
            for i, text in enumerate(data["text"]):
                if not text:
                    continue
                kind = data.get("kind", [None] * len(data["text"]))[i]
                lang = data.get("lang", [None] * len(data["text"]))[i]
                group = "code" if kind == "code" else (lang or guess_group(text))
                yield Doc(data["id"][i], group, text)


def docs_from_files(patterns: Iterable[str]) -> Iterator[Doc]:
    """JSONL(.gz) / Parquet records (``text``, optional ``lang``), code files whole, other text files by line."""
    # Ids are relative to the glob's fixed prefix: where the files lie must not change the sample.
    found = {Path(p): _glob_base(pattern) for pattern in patterns for p in glob.glob(pattern, recursive=True)}
    files = sorted(p for p in found if p.is_file())
    if not files:
        raise InputNotFound(f"no files match {' '.join(patterns)}")
    for path in files:
        name = path.name.lower()
        key = path.relative_to(found[path]).as_posix() if path.is_relative_to(found[path]) else path.as_posix()
        if name.endswith((".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")):
            for n, rec in json_records(path):
                text = rec.get("text")
                if isinstance(text, str) and text:
                    yield Doc(f"{key}#L{n}", rec.get("lang") or guess_group(text), text)
        elif name.endswith(".parquet"):
            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException) as exc:
                raise UsageError(f"cannot read {path}: {exc}") from None
            if "text" not in table.column_names:
                raise UsageError(f"{path} has no column 'text' (columns: {', '.join(table.column_names)})")
            langs = table["lang"].to_pylist() if "lang" in table.column_names else [None] * table.num_rows
            for n, (text, lang) in enumerate(zip(table["text"].to_pylist(), langs)):
                if text:
                    yield Doc(f"{key}#{n}", lang or guess_group(text), text)
        elif path.suffix.lower() in CODE_EXTENSIONS:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                yield Doc(key, "code", text)
        else:
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if line.strip():
                    yield Doc(f"{key}#L{n}", guess_group(line), line)


def _glob_base(pattern: str) -> Path:
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts) - 1)]]
    return Path(*fixed) if fixed else Path(".")


def _unit(doc_id: str) -> float:
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8, key=b"tokenizer").digest()
    return int.from_bytes(digest, "little") / 2**64


class _BottomK:
    """The documents with the smallest hashes whose characters just cover ``budget``."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.heap: list[tuple[float, str, str]] = []  # (-hash, id, text): the largest hash on top
        self.chars = 0

    def offer(self, u: float, doc: Doc) -> None:
        if self.budget <= 0:
            return
        if self.chars >= self.budget and self.heap and u >= -self.heap[0][0]:
            return
        heapq.heappush(self.heap, (-u, doc.id, doc.text))
        self.chars += len(doc.text)
        while self.heap and self.chars - len(self.heap[0][2]) >= self.budget:
            self.chars -= len(heapq.heappop(self.heap)[2])

    def texts(self) -> list[str]:
        return [t for _, _, t in sorted(self.heap, key=lambda e: (-e[0], e[1]))]


@dataclass
class TrainProgress:
    """Where training is, for progress lines (``datapipe train-tokenizer`` prints ``line`` at an interval)."""

    step: str = "sampling"  # sampling, training, measuring
    docs: int = 0  # documents read so far
    chars: int = 0  # their characters
    train_chars: int = 0  # characters trained on (known once sampling is done)

    def line(self, elapsed: float) -> str:
        from datapipe.runtime.heartbeat import duration, size

        read = f"{self.docs:,} documents ({size(self.chars)} chars) read"
        if self.step == "training":
            step = f"training on {size(self.train_chars)} chars of them"
        else:
            step = {"sampling": "sampling", "measuring": "measuring chars per token on the held-out documents"}[self.step]
        return f"train-tokenizer: {read}; {step}, {duration(elapsed)} elapsed"


def sample(
    docs: Iterable[Doc], options: TrainOptions, ignored: dict[str, int] | None = None, progress: TrainProgress | None = None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(train texts, held-out texts) per group of the mix; ``ignored`` counts documents of other groups."""
    train = {g: _BottomK(int(options.sample_chars * w)) for g, w in options.mix.items()}
    held = {g: _BottomK(max(int(options.sample_chars * w * options.heldout_frac), 1)) for g, w in options.mix.items()}
    progress = progress or TrainProgress()
    for doc in docs:
        progress.docs += 1
        progress.chars += len(doc.text)
        if doc.group not in train:
            if ignored is not None:
                ignored[doc.group] = ignored.get(doc.group, 0) + 1
            continue
        u = _unit(doc.id)
        if u < options.heldout_frac:
            held[doc.group].offer(u, doc)
        else:
            train[doc.group].offer(u, doc)
    return {g: s.texts() for g, s in train.items()}, {g: s.texts() for g, s in held.items()}


def train_tokenizer(
    docs: Iterable[Doc], output: Path, options: TrainOptions, progress: TrainProgress | None = None
) -> TrainResult:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    progress = progress or TrainProgress()
    ignored: dict[str, int] = {}
    train, held = sample(docs, options, ignored, progress)
    progress.train_chars = sum(len(t) for texts in train.values() for t in texts)
    progress.step = "training"
    if not any(train.values()):
        found = f" (documents found: {_counts(ignored)})" if ignored else ""
        raise UsageError(f"no documents of the groups {', '.join(options.mix)} to train on{found}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()  # byte-level: every UTF-8 string encodes, decode gives it back
    trainer = trainers.BpeTrainer(
        vocab_size=options.vocab_size,
        min_frequency=options.min_frequency,
        special_tokens=options.special_tokens,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Groups interleaved in a fixed order: the trainer sees the same sequence on every run.
    tok.train_from_iterator((t for g in sorted(train) for t in train[g]), trainer)
    output.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(output))
    progress.step = "measuring"
    stats = []
    used = sum(len(t) for texts in train.values() for t in texts)
    for g, w in options.mix.items():
        encoded = tok.encode_batch_fast(held[g], add_special_tokens=False) if held[g] else []
        chars = sum(map(len, train[g]))
        stats.append(
            GroupStats(
                g,
                len(train[g]),
                chars,
                len(held[g]),
                sum(map(len, held[g])),
                sum(len(e.ids) for e in encoded),
                int(options.sample_chars * w),
                w,
                chars / used if used else 0.0,
            )
        )
    warnings = mix_warnings(stats, options, ignored)
    special_ids: dict[str, int] = {}
    for t in options.special_tokens:
        tid = tok.token_to_id(t)
        assert tid is not None  # the trainer put every special token in the vocabulary
        special_ids[t] = int(tid)
    result = TrainResult(
        output,
        tok.get_vocab_size(with_added_tokens=True),
        special_ids,
        stats,
        hashlib.sha256(output.read_bytes()).hexdigest(),
        warnings,
    )
    # Provenance beside the tokenizer (tokenizer.json itself stays a plain Hugging Face file).
    info = {
        "options": {**asdict(options), "special": list(options.special)},
        "vocab_size": result.vocab_size,
        "special_ids": special_ids,
        "sha256": result.sha256,
        "train_chars": used,
        "groups": [{**asdict(s), "chars_per_token": s.chars_per_token, "filled": s.filled} for s in stats],
        "ignored_docs": ignored,
        "warnings": warnings,
    }
    output.with_suffix(".train.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
    return result


def mix_warnings(stats: list[GroupStats], options: TrainOptions, ignored: dict[str, int]) -> list[str]:
    """What the trained mix is when a group ran out of documents, and how to get the asked-for mix."""
    short = [s for s in stats if not s.filled]
    if not short:
        return []
    realised = ", ".join(f"{s.group} {s.share:.2f}" for s in stats)
    asked = ", ".join(f"{s.group} {s.weight:.2f}" for s in stats)
    out = [
        f"group {s.group}: only {s.train_chars:,} characters ({s.train_docs:,} documents) to train on, "
        f"short of its share {s.weight:.2f} x {options.sample_chars:,} = {s.target_chars:,}"
        if s.train_docs
        else f"group {s.group}: no documents to train on (its share {s.weight:.2f} went unused)"
        for s in short
    ]
    out.append(f"trained on shares {realised} instead of {asked}")
    # Every group fills its share when sample_chars is at most (characters it has) / (its weight).
    fits = min(s.train_chars / s.weight for s in short if s.weight > 0)
    if fits >= 1:
        names = " and ".join(s.group for s in short)
        out.append(f"for the asked-for mix, lower --sample-chars to {int(fits):,} or add {names} documents")
    if ignored:
        out.append(f"documents of groups not in the mix were ignored: {_counts(ignored)}")
    return out


def _counts(groups: dict[str, int]) -> str:
    return ", ".join(f"{g} {n:,}" for g, n in sorted(groups.items(), key=lambda kv: -kv[1])[:10])


def report_lines(result: TrainResult) -> list[str]:
    """The table train-tokenizer prints: per group what the mix asked for and what was used."""
    lines = [f"{'group':<8}{'mix':>6}{'train docs':>12}{'train chars':>14}{'share':>7}{'held-out chars':>16}{'chars/token':>13}"]
    for g in result.groups:
        cpt = f"{g.chars_per_token:.3f}" if g.chars_per_token is not None else "-"
        lines.append(
            f"{g.group:<8}{g.weight:>6.2f}{g.train_docs:>12,}{g.train_chars:>14,}{g.share:>7.2f}{g.heldout_chars:>16,}{cpt:>13}"
        )
    return lines
