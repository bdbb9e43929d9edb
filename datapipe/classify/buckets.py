"""Corpus-wide percentile buckets of classifier scores, and the ensemble of several models' buckets.

Nemotron-CC's recipe: each model's score becomes a percentile bucket (0 .. count-1) within its
group (language, kind); an ensemble rule (the maximum, the mean, a weighted sum) makes one bucket
per document. Buckets here are exact ranks, not histogram cut-offs: a histogram of finite bins
puts every tie, and every score of one bin, into one bucket, so a model that gives a tenth of the
corpus a clipped 1.0 would make one bucket a tenth of the group. Instead each document gets a sort
key (its float32 score's bits, then a hash of its id to order equal scores), and its bucket is
``rank * count // n`` within its group: sizes differ by at most one document, and the key depends
on the document alone, so the bucket is the same whatever the sharding or the number of workers.
Memory: 8 bytes per document and model (plus a group code) in the one task that ranks them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

RULES = ("max", "mean", "weighted")


def tie_keys(ids: Iterable[str]) -> np.ndarray:
    """A stable 32-bit hash of each id (blake2b): orders documents of equal score, evenly across files."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(i.encode("utf-8"), digest_size=4).digest(), "big") for i in ids), dtype=np.uint64
    )


def sort_keys(scores: np.ndarray, ties: np.ndarray) -> np.ndarray:
    """One uint64 per document ordering (score, tie), for any float32 score (a regression model's may be
    negative): a non-negative float's bits grow with its value, so they get the sign bit set; a
    negative one's bits grow as it falls, so they are inverted. -0.0 counts as 0.0."""
    values = np.asarray(scores, np.float32) + np.float32(0.0)  # -0.0 + 0.0 is 0.0
    bits = np.ascontiguousarray(values).view(np.uint32)
    ordered = np.where(bits & np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))
    return (ordered.astype(np.uint64) << np.uint64(32)) | (ties.astype(np.uint64) & np.uint64(0xFFFFFFFF))


def rank_buckets(keys: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """Each document's bucket within its group: ``rank * count // group size`` (int16; -1 where
    ``groups`` is negative, a document outside every group)."""
    keys = np.asarray(keys, np.uint64)
    groups = np.asarray(groups, np.int64)
    out = np.full(len(keys), -1, np.int16)
    inside = np.flatnonzero(groups >= 0)
    if len(inside) == 0:
        return out
    g = groups[inside]
    order = np.lexsort((keys[inside], g))  # by group, then key
    sorted_groups = g[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    first = np.repeat(starts, sizes)
    n = np.repeat(sizes, sizes)
    rank = np.arange(len(order), dtype=np.int64) - first
    out[inside[order]] = (rank * count // n).astype(np.int16)
    return out


def ensemble_value(buckets: np.ndarray, rule: str, weights: Sequence[float] | None = None) -> np.ndarray:
    """The ensemble rule's value per document from its models' buckets (columns of ``buckets``, -1: not
    scored): ``max`` the highest, ``mean`` the mean, ``weighted`` the weighted sum (the weights sum to
    1). NaN where any model did not score the document."""
    b = np.asarray(buckets, np.float64)
    if rule == "max":
        out = b.max(axis=1)
    else:
        w = np.full(b.shape[1], 1.0 / b.shape[1]) if rule == "mean" else np.asarray(weights, np.float64)
        out = b @ w
    out[(b < 0).any(axis=1)] = np.nan
    return out


def combine(buckets: np.ndarray, rule: str, weights: Sequence[float] | None = None) -> np.ndarray:
    """One bucket per document: the ensemble value rounded down (int16; -1 where a model did not score it)."""
    value = ensemble_value(buckets, rule, weights)
    # + 1e-9: 0.5 * 3 + 0.5 * 5 must be 4, not 3.9999999 rounded down
    return np.where(np.isnan(value), -1, np.floor(np.nan_to_num(value, nan=0.0) + 1e-9)).astype(np.int16)


def ranked_ensemble(
    buckets: np.ndarray, rule: str, weights: Sequence[float] | None, groups: np.ndarray, ties: np.ndarray, count: int
) -> np.ndarray:
    """The ensemble value ranked into ``count`` equal buckets per group, as each model's score is: documents
    of equal value ordered by their models' mean bucket, then by ``ties`` (the id hash). -1 where a model
    did not score the document."""
    value = ensemble_value(buckets, rule, weights)
    missing = np.isnan(value)
    mean = np.asarray(buckets, np.float64).mean(axis=1)
    # value in [0, count-1] and mean below count: value * count + mean orders by value, then mean
    composite = np.nan_to_num(value * count + mean, nan=0.0)
    keys = sort_keys(composite.astype(np.float32), ties)
    return rank_buckets(keys, np.where(missing, -1, groups), count)


def weight_problems(weights: Mapping[str, float], models: Sequence[str]) -> list[tuple[str, str]]:
    """(key under ``buckets``, message) for weights that name an unknown model, miss one, are negative
    or do not sum to 1."""
    problems = [
        (f"weights.{name}", f"{name!r} is not a model of this stage; models: {', '.join(models)}")
        for name in weights
        if name not in models
    ]
    problems += [(f"weights.{name}", f"{w:g} is negative") for name, w in weights.items() if w < 0]
    missing = [m for m in models if m not in weights]
    if missing:
        problems.append(("weights", f"give a weight for every model; missing: {', '.join(missing)}"))
    total = sum(weights.values())
    if not problems and abs(total - 1.0) > 1e-6:
        problems.append(("weights", f"the weights sum to {total:g}; they must sum to 1"))
    return problems
