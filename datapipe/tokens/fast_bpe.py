"""An exact fast path for byte-level BPE ``tokenizer.json`` files: tiktoken, given the same ranks and split regex.

``tokenizers`` and tiktoken run the same algorithm with two differences, and this module takes a
tokenizer only where neither can change an id:

- Which adjacent pair merges. ``tokenizers`` merges a pair listed in ``merges`` (lowest merge
  rank first); tiktoken merges any pair whose concatenation is a token (lowest token id first).
  With merge results unique and their ids rising in merge order, the ranks agree. A pair that is
  not a merge but concatenates to a token ``w`` ("u|v") could only be adjacent, covering exactly
  the bytes of ``w``, if ``tokenizers`` run on ``w``'s bytes alone also passed through ``u|v``
  (the merges inside a span that no merge has crossed happen in the same order as on the span
  alone), and then it could never end at ``w``. So every token whose own bytes BPE turns back
  into that token is safe to keep; a token BPE does not rebuild from its own bytes is never made
  by ``tokenizers`` in any context (the same argument), and is left out of tiktoken's ranks.
- tiktoken returns a piece that is itself a token as that token; ``tokenizers`` does so only
  with ``ignore_merges``. Without it, a piece that is a kept token is rebuilt by BPE (above);
  with it, a token that BPE does not rebuild cannot be left out, and the tokenizer is not taken.

What cannot be proven from the file (Oniguruma's and Rust regex's Unicode classes, the split
around added tokens) is checked: :func:`probe_text` and a sample of the run's own text are
encoded both ways before the fast path is used (``datapipe/tokens/encode.py``), and every
document's ids must cover its UTF-8 bytes (a split regex that skips text falls back). GPT-2's split
runs without its lookahead, on texts with a sentinel marked in (``gpt2_split.py``): the same pieces.

Anything else (a normaliser, other pre-tokenisers or models, added tokens that strip spaces or
overlap) stays on ``tokenizers``; :func:`plan_fast_encoder` says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.tokens.gpt2_split import GPT2_PATTERN, GPT2_WITHOUT_LOOKAHEAD, SENTINEL, mark_runs


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """ByteLevel's table (GPT-2's ``bytes_to_unicode``), inverted: the character that stands for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class FastPlan:
    """What tiktoken needs to give ``tokenizers``' ids: the split regex, the ranks and the added tokens."""

    pattern: str
    prefix_space: bool  # ByteLevel(add_prefix_space): a space before every text between added tokens
    ranks: dict[bytes, int]
    added: dict[str, int]  # added tokens (special or not): matched in text before the split, as tokenizers does
    left_out: int  # vocabulary tokens BPE never produces (left out of the ranks)


def _pre_tokenizer(pre: dict[str, Any] | None) -> tuple[str, bool] | str:
    """(split regex, prefix space) for the pre-tokenisers tiktoken reproduces, else why not."""
    if pre is None:
        return "no pre-tokenizer (not byte-level)"
    if pre.get("type") == "ByteLevel":
        if not pre.get("use_regex", True):
            return "ByteLevel without its split regex"
        return GPT2_PATTERN, bool(pre.get("add_prefix_space"))
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel":
            split, byte_level = steps
            pattern = split.get("pattern") or {}
            if "Regex" not in pattern:
                return "a Split on a literal string"
            if split.get("behavior") != "Isolated" or split.get("invert"):
                return f"a Split with behavior {split.get('behavior')} (invert {split.get('invert')})"
            if byte_level.get("use_regex", True) or byte_level.get("add_prefix_space"):
                return "a Split followed by ByteLevel that splits again or adds a prefix space"
            return pattern["Regex"], False
    return f"pre-tokenizer {pre.get('type')}"


def _added_tokens(tokens: list[dict[str, Any]]) -> dict[str, int] | str:
    added: dict[str, int] = {}
    for t in tokens:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word") or not t.get("content"):
            return f"added token {t.get('content')!r} strips spaces, matches single words only or is empty"
        added[t["content"]] = int(t["id"])
    # tokenizers finds added tokens leftmost-longest (special ones first); tiktoken's alternation is
    # leftmost-first in no set order. They agree when no token overlaps another.
    names = list(added)
    for a in names:
        for b in names:
            if a != b and (a in b or any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b))))):
                return f"added tokens {a!r} and {b!r} overlap"
    return added


def _merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    pairs = [m if isinstance(m, list) else m.split(" ", 1) for m in merges]
    return [(a, b) for a, b in pairs]


def plan_fast_encoder(data: dict[str, Any]) -> FastPlan | str:
    """The fast plan for a parsed ``tokenizer.json``, or the reason it stays on ``tokenizers``."""
    from tokenizers import models

    if data.get("normalizer") is not None:
        return f"normalizer {data['normalizer'].get('type')}"
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')}"
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE with dropout or subword prefix/suffix"
    if model.get("byte_fallback"):
        return "BPE with byte_fallback"
    pre = _pre_tokenizer(data.get("pre_tokenizer"))
    if isinstance(pre, str):
        return pre
    added = _added_tokens(data.get("added_tokens") or [])
    if isinstance(added, str):
        return added
    vocab: dict[str, int] = model.get("vocab") or {}
    merges = _merge_pairs(model.get("merges") or [])
    table = unicode_to_byte()
    ranks: dict[bytes, int] = {}
    skipped = 0
    for token, tid in vocab.items():
        if any(ch not in table for ch in token):
            if token in added:
                skipped += 1
                continue  # matched as an added token before BPE; never a BPE result
            return f"token {token!r} is not byte-level"
        ranks[bytes(table[ch] for ch in token)] = tid
    if len(ranks) + skipped != len(vocab):
        return "two vocabulary tokens stand for the same bytes"
    if sum(len(b) == 1 for b in ranks) != 256:
        return "the vocabulary lacks some of the 256 bytes"
    last = -1
    for a, b in merges:
        tid = vocab.get(a + b, -1)
        if tid <= last:
            return "merge results are not in the vocabulary in merge order"
        last = tid
    # Which tokens BPE rebuilds from their own bytes (no whole-word shortcut): the others are never produced.
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=False)
    never = [t for t, tid in vocab.items() if len(t) > 1 and t not in added and [x.id for x in bpe.tokenize(t)] != [tid]]
    if never and model.get("ignore_merges"):
        return f"ignore_merges with {len(never)} tokens BPE does not rebuild"
    # An added token in the vocabulary never reaches BPE whole (the text is split around it first).
    never += [t for t in vocab if t in added and len(t) > 1 and all(ch in table for ch in t)]
    for t in never:
        ranks.pop(bytes(table[ch] for ch in t), None)
    return FastPlan(pre[0], pre[1], ranks, added, len(never))


class FastEncoder:
    """tiktoken with a :class:`FastPlan`: ids per text, or None where a text must go to ``tokenizers``."""

    def __init__(self, plan: FastPlan) -> None:
        import tiktoken

        self.plan = dataclasses.replace(plan, ranks={})  # tiktoken holds its own copy of the ranks
        self._enc = tiktoken.Encoding(
            "datapipe-fast-bpe", pat_str=plan.pattern, mergeable_ranks=plan.ranks, special_tokens=plan.added
        )
        self._added = frozenset(plan.added)
        self._split = re.compile("(" + "|".join(map(re.escape, plan.added)) + ")") if plan.added else None
        # bytes per id: a document's ids must cover its UTF-8 bytes (a split regex may skip text)
        size = max([*plan.ranks.values(), *plan.added.values()]) + 1
        nbytes = np.zeros(size, dtype=np.int64)
        for b, i in plan.ranks.items():
            nbytes[i] = len(b)
        for s, i in plan.added.items():
            nbytes[i] = len(s.encode("utf-8"))
        self._nbytes = nbytes
        # GPT-2's split leaves no text out (at every character one of its alternatives matches: \s,
        # \p{L}, \p{N} or the rest), so its ids always cover the text and are not counted again.
        self._covers_all = plan.pattern == GPT2_PATTERN and not plan.prefix_space
        # GPT-2's split without its lookahead (gpt2_split.py): texts with the sentinel marked in.
        self._marked_enc = None
        if self._covers_all:
            self._sentinel = size  # an id no token has
            self._marked_enc = tiktoken.Encoding(
                "datapipe-fast-bpe-marked",
                pat_str=GPT2_WITHOUT_LOOKAHEAD,
                mergeable_ranks=plan.ranks,
                special_tokens={**plan.added, SENTINEL: self._sentinel},
            )
            self._marked_allowed = self._added | {SENTINEL}
            # ids that send a text back to the lookahead pattern: an added token (a run before one
            # ends its slice there, which the sentinel would cut) and the sentinel's own
            self._special = np.zeros(size + 1, dtype=np.uint8)
            self._special[list(plan.added.values())] = 2
            self._special[self._sentinel] = 1

    def encode(self, text: str) -> np.ndarray | None:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str], threads: int = 1, arrow: pa.Array | None = None) -> list[np.ndarray | None]:
        """Ids per text (None: that text goes to ``tokenizers``), on up to ``threads`` threads.
        ``arrow``: the same texts as an Arrow string array, if the caller has it (saves a copy).

        tiktoken releases the GIL while it encodes, so threads use several cores in one process (an
        in-process run); each takes runs of consecutive texts (a few per thread, for balance), not
        one text at a time: a future per document cost more than a short document's encoding."""
        marked = self._marked(texts, arrow)
        if threads <= 1 or len(texts) < 2:
            return self._encode_run(texts, marked)
        runs = _runs(texts, 4 * threads)
        with ThreadPoolExecutor(min(threads, len(runs)), thread_name_prefix="datapipe-encode") as pool:
            parts = pool.map(lambda r: self._encode_run(texts[r[0] : r[1]], marked[r[0] : r[1]] if marked else None), runs)
            return [ids for part in parts for ids in part]

    def _marked(self, texts: list[str], arrow: pa.Array | None) -> list[str] | None:
        """The texts with gpt2_split's sentinels (None: this encoder has no lookahead-free split)."""
        if self._marked_enc is None or not texts:
            return None
        try:
            # large_string: a list of any size fits (and the marking makes no string array overflow)
            return mark_runs(pa.array(texts, pa.large_string()) if arrow is None else arrow).to_pylist()
        except (pa.ArrowException, UnicodeEncodeError):  # lone surrogates, or a string array too large
            return None  # to mark: the lookahead pattern

    def _encode_run(self, texts: list[str], marked: list[str] | None = None) -> list[np.ndarray | None]:
        ids: list[np.ndarray | None] = []
        size = np.zeros(len(texts), dtype=np.int64)  # UTF-8 bytes each text's ids must cover (-1: none)
        for i, text in enumerate(texts):
            try:
                if self.plan.prefix_space:
                    out, extra = self._encode_prefixed(text)
                elif marked is not None:
                    out, extra = self._encode_marked(text, marked[i]), 0
                else:
                    out, extra = self._enc.encode_to_numpy(text, allowed_special=self._added, disallowed_special=()), 0
                if not self._covers_all:
                    size[i] = len(text.encode("utf-8")) + extra
            except UnicodeEncodeError:  # lone surrogates: tokenizers' own handling applies
                out, size[i] = None, -1
            ids.append(out)
        if self._covers_all:
            return ids
        # The coverage check for all texts at once: bytes of every id, summed per text.
        counts = np.fromiter((0 if x is None else len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = [x for x in ids if x is not None and len(x)]
        covered = np.zeros(len(ids) + 1, dtype=np.int64)
        if flat:
            ends = np.cumsum(self._nbytes[np.concatenate(flat)])
            stops = np.cumsum(counts)
            covered[1:] = np.where(stops > 0, ends[np.maximum(stops, 1) - 1], 0)
        ok = np.diff(covered) == size
        return [x if good else None for x, good in zip(ids, ok.tolist())]

    def _encode_marked(self, text: str, marked: str) -> np.ndarray:
        assert self._marked_enc is not None
        out = self._marked_enc.encode_to_numpy(marked, allowed_special=self._marked_allowed, disallowed_special=())
        inserted = len(marked) - len(text)
        special = self._special[out]
        if not inserted and not special.any():
            return out
        if np.count_nonzero(special == 1) != inserted or (special == 2).any():
            # the text holds the sentinel character or an added token: the lookahead pattern
            return self._enc.encode_to_numpy(text, allowed_special=self._added, disallowed_special=())
        return out[special == 0]

    def _encode_prefixed(self, text: str) -> tuple[np.ndarray, int]:
        parts = self._split.split(text) if self._split is not None else [text]
        out: list[np.ndarray] = []
        extra = 0
        for i, part in enumerate(parts):
            if i % 2:  # an added token
                out.append(np.array([self.plan.added[part]], dtype=np.uint32))
            elif part:
                if not part.startswith(" "):
                    part, extra = " " + part, extra + 1
                out.append(self._enc.encode_to_numpy(part, disallowed_special=()))
        return (np.concatenate(out) if out else np.empty(0, dtype=np.uint32)), extra


def _runs(texts: list[str], n: int) -> list[tuple[int, int]]:
    """``texts`` cut into at most ``n`` runs of consecutive texts of about equal characters, in order: [start, end)."""
    total = sum(map(len, texts))
    step = max(1, -(-total // n))
    runs: list[tuple[int, int]] = []
    start = size = 0
    for i, t in enumerate(texts):
        if size >= step and i > start:
            runs.append((start, i))
            start, size = i, 0
        size += len(t)
    runs.append((start, len(texts)))
    return runs


# Bump when _build_probe_text changes: the cached text is found by this and the Unicode version.
PROBE_VERSION = 1


@lru_cache(maxsize=1)
def probe_text() -> str:
    """Text that exercises the split regex over Unicode: characters of every general category, in context.

    Up to 24 code points of each category (first, last and spread between) from the whole range,
    each between letters, digits, spaces, apostrophes and line breaks; plus runs of whitespace.
    Built once per Python's Unicode version and kept in the cache folder: building it looks at every
    code point (~0.5 CPU s, in every run's driver otherwise).
    """
    from datapipe.storage.cache import cache_dir

    path = cache_dir() / "tokens" / f"probe-v{PROBE_VERSION}-unicode-{unicodedata.unidata_version}.txt"
    try:
        return path.read_bytes().decode("utf-8")  # bytes: its \r\n must not become \n
    except (OSError, UnicodeDecodeError):
        pass
    text = _build_probe_text()
    try:  # a private temporary name, then renamed: a concurrent reader sees all of it or nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(text.encode("utf-8"))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: build it each time
        pass
    return text


def _build_probe_text() -> str:
    by_cat: dict[str, list[int]] = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        by_cat.setdefault(unicodedata.category(chr(cp)), []).append(cp)
    picked: list[int] = []
    for cps in by_cat.values():
        step = max(1, len(cps) // 23)
        picked += cps[::step] + [cps[-1]]
    lines = []
    for cp in sorted(set(picked)):
        c = chr(cp)
        lines.append(f"a{c}b {c}{c} 1{c}2 {c}'s{c}  {c}\t{c}\r\n{c}  x")
    spaces = [chr(c) for c in by_cat.get("Zs", []) + by_cat.get("Zl", []) + by_cat.get("Zp", []) + [9, 10, 11, 12, 13, 0x85]]
    lines.append(" ".join(s + s + "x" + s + "'ll " for s in spaces))
    lines.append("I'm we'RE they've you'd it's  \n\n  12345 3.14159 ١٢٣ 中文，标点。 😀👍🏽 e\u0301 \u200d")
    return "\n".join(lines)


def plan_to_json(plan: FastPlan | str) -> dict[str, Any]:
    """A plan (or the reason there is none) as JSON data: ranks as hex bytes, for the cache folder."""
    if isinstance(plan, str):
        return {"reason": plan}
    return {
        "pattern": plan.pattern,
        "prefix_space": plan.prefix_space,
        "ranks": [[b.hex(), i] for b, i in plan.ranks.items()],
        "added": plan.added,
        "left_out": plan.left_out,
    }


def plan_from_json(data: dict[str, Any]) -> FastPlan | str:
    if "reason" in data:
        return str(data["reason"])
    ranks = {bytes.fromhex(h): int(i) for h, i in data["ranks"]}
    added = {str(k): int(v) for k, v in data["added"].items()}
    return FastPlan(str(data["pattern"]), bool(data["prefix_space"]), ranks, added, int(data["left_out"]))


def load_plan(path: str) -> FastPlan | str:
    with open(path, encoding="utf-8") as f:
        return plan_fast_encoder(json.load(f))
