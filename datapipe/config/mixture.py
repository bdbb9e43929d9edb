"""The ``mixture`` section: a weight per source, and optionally how often its documents are repeated.

A source's entry is a weight (``web_en: 0.6``) or a mapping::

    web_zh: {weight: 0.4, bucket: ensemble, repeat: {18-19: 3, 14-17: 2, 0-3: 0}, rehydrate: false}

``repeat`` maps ranges of a classify bucket (``bucket_<bucket>``, 0 .. count-1) to how many times a
document of those buckets is in the source's shards and exports: 0 leaves it out, 2 puts it in twice.
A document whose bucket no range names, or that has no bucket (a kind the classify stage skips), is
there once. ``rehydrate`` multiplies that count by minhash's ``dup_count`` (the near-duplicate
cluster the document survived), so FineWeb-2-style rehydration composes with the buckets' repeats.

Each document's count is computed once, when it is tokenized, into ``mixture_repeat``; packing and
the exports read it there, and the audit sums ``n_tokens * mixture_repeat``. Only sources with
``repeat`` or ``rehydrate`` get the column: a run without them writes what it wrote before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Discriminator, Field, Tag

from datapipe.config.sections import Strict

REPEAT_COLUMN = "mixture_repeat"
DUP_COUNT = "dup_count"  # minhash's cluster size of each kept document
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class MixtureEntry(Strict):
    weight: float = Field(ge=0.0, description="Target weight of the source (normalized over all sources).")
    bucket: str = Field(
        "ensemble",
        description="With repeat: whose classify bucket the ranges name, a model's name or the ensemble's (column bucket_NAME).",
    )
    repeat: dict[str | int, int] = Field(
        default_factory=dict,
        description="Bucket range (e.g. 18-19, or one bucket 5) -> how many times its documents are read per epoch "
        "(an integer >= 0; 0 leaves them out); unnamed buckets: once.",
    )
    rehydrate: bool = Field(
        False, description="Multiply each document's count by minhash's dup_count (the near-duplicate cluster it stands for)."
    )


def _form(value: Any) -> str:
    return "entry[mapping]" if isinstance(value, (Mapping, MixtureEntry)) else "weight[number]"


# A mixture value: a plain weight or an entry. The discriminator validates only the form written, so
# a mistake in an entry is one message at its key, not one per form; the tags are named like pydantic's
# union branches (name[...]), which error messages leave out of key paths (pipeline/problems.py).
MixtureValue = Annotated[
    Annotated[float, Tag("weight[number]")] | Annotated[MixtureEntry, Tag("entry[mapping]")],
    Discriminator(_form),
]


@dataclass(frozen=True)
class RepeatRule:
    """How many times each document of one source is read: by bucket range, times dup_count if asked."""

    column: str  # bucket_<name>
    ranges: tuple[tuple[int, int, int], ...]  # (first bucket, last bucket, repeat), sorted
    rehydrate: bool

    def repeat_of(self, bucket: int | None) -> int:
        if bucket is not None and bucket >= 0:
            for lo, hi, k in self.ranges:
                if lo <= bucket <= hi:
                    return k
        return 1

    def counts(self, table: pa.Table) -> pa.Array:
        """Each document's count (int32) from its bucket column (and dup_count); a validation document's is 0 or 1."""
        n = table.num_rows
        out = np.ones(n, np.int64)
        if self.ranges and self.column in table.column_names:
            buckets = pc.fill_null(table[self.column], -1).to_numpy(zero_copy_only=False).astype(np.int64)
            for lo, hi, k in self.ranges:
                out[(buckets >= lo) & (buckets <= hi)] = k
        if self.rehydrate and DUP_COUNT in table.column_names:
            dup = pc.fill_null(table[DUP_COUNT], 1).to_numpy(zero_copy_only=False).astype(np.int64)
            out *= np.maximum(dup, 1)
        if "split" in table.column_names:  # validation measures the natural distribution: read once (or not at all)
            val = pc.equal(table["split"], "val").to_numpy(zero_copy_only=False)
            out[val] = np.minimum(out[val], 1)
        return pa.array(out.astype(np.int32), pa.int32())


_SPREAD = 1 << 16  # resolution of a document's offset (its id's hash) among its copies' rounds


def spread_offsets(ids: list[str]) -> np.ndarray:
    """Each document's offset in [0, 2**16) from its id alone (blake2b), so any sharding gives the same rounds."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(i.encode("utf-8"), digest_size=2).digest(), "big") for i in ids),
        dtype=np.int64,
        count=len(ids),
    )


def in_round(offsets: np.ndarray, counts: np.ndarray, rounds: int, r: int) -> np.ndarray:
    """Which documents have a copy in round ``r`` of ``rounds`` (a source's stream is its rounds back to back).

    Copy j of a document counted k times (k <= rounds) goes to round floor((j + u) * rounds / k),
    u = offset / 2**16 its own fraction: k distinct rounds about rounds / k apart, at most one copy a
    round, and documents counted once spread evenly over the rounds between the repeated ones. A
    document is in round r when the first j at or past r * k / rounds - u (exact in integers) is
    below k and still lands before round r + 1.
    """
    k = np.asarray(counts, np.int64)
    u = np.asarray(offsets, np.int64)
    scale = rounds * _SPREAD
    # smallest j >= 0 with (j * S + u) * rounds >= r * k * S, i.e. j >= (r * k * S - u * rounds) / (rounds * S)
    num = r * k * _SPREAD - u * rounds
    j = np.maximum(-(-num // scale), 0)
    return (k > 0) & (j < k) & ((j * _SPREAD + u) * rounds < (r + 1) * k * _SPREAD)


def parse_range(key: str | int) -> tuple[int, int] | None:
    """'14-17' -> (14, 17); '5' or 5 -> (5, 5); None when it is not a range of bucket numbers."""
    if isinstance(key, int):
        return (key, key) if key >= 0 else None
    m = _RANGE.match(str(key))
    if not m:
        return None
    lo = int(m.group(1))
    return lo, int(m.group(2)) if m.group(2) is not None else lo


def entry_of(value: Any) -> MixtureEntry:
    """A mixture value of run.json or the pipeline (a weight, a mapping or an entry) as an entry."""
    if isinstance(value, MixtureEntry):
        return value
    if isinstance(value, Mapping):
        return MixtureEntry(**value)
    return MixtureEntry.model_construct(weight=float(value))  # a plain weight, checked where it is validated


def mixture_weights(mixture: Mapping[str, Any] | None) -> dict[str, float]:
    """Source -> weight, whichever form each entry has (what stats, the report and Megatron use)."""
    return {
        name: float(v.weight if isinstance(v, MixtureEntry) else v["weight"] if isinstance(v, Mapping) else v)
        for name, v in (mixture or {}).items()
    }


def repeat_rules(mixture: Mapping[str, Any] | None) -> dict[str, RepeatRule]:
    """Source -> its repeat rule, for the sources whose entry has ``repeat`` or ``rehydrate``."""
    rules = {}
    for name, value in (mixture or {}).items():
        entry = entry_of(value)
        if not entry.repeat and not entry.rehydrate:
            continue
        ranges = []
        for key, k in entry.repeat.items():
            parsed = parse_range(key)
            if parsed is not None:
                ranges.append((*parsed, int(k)))
        rules[name] = RepeatRule(f"bucket_{entry.bucket}", tuple(sorted(ranges)), entry.rehydrate)
    return rules


def repeat_problems(key: str, entry: MixtureEntry, count: int | None) -> list[str]:
    """Problems of one entry's ``repeat`` ranges (``count``: the bucket count, None when unknown)."""
    problems = []
    seen: list[tuple[int, int, str]] = []
    for raw, k in entry.repeat.items():
        at = f"{key}.repeat.{raw}"
        parsed = parse_range(raw)
        if parsed is None:
            problems.append(f"{at}: not a bucket range; write one bucket (5) or a range (14-17)")
            continue
        lo, hi = parsed
        if lo > hi:
            problems.append(f"{at}: the range runs backwards; write {hi}-{lo}")
            continue
        if count is not None and hi >= count:
            problems.append(f"{at}: bucket {hi} is past the last bucket, {count - 1} ({count} buckets: 0 .. {count - 1})")
        if k < 0:
            problems.append(f"{at}: {k} is not allowed: a repeat is an integer >= 0 (0 leaves the documents out)")
        for a, b, other in seen:
            if lo <= b and a <= hi:
                problems.append(f"{at}: overlaps {key}.repeat.{other}; each bucket may be named once")
        seen.append((lo, hi, str(raw)))
    return problems
