"""Batch MinHash signatures, bit-identical to ``datasketch.MinHash(num_perm, seed, hashfunc=H)``.

datasketch >= 2.0 (the installed 2.0.0) defaults to scheme "affine32": the input hash h (32 bit)
is pre-mixed with the Murmur3 finalizer, then permuted as ``a*x + b mod 2^32`` with ``a`` odd,
stored as uint32. Scheme "legacy" (datasketch < 2.0) is ``((a*h + b) mod 2^64) mod (2^61-1)``
truncated to 32 bits, stored as uint64 (numpy's uint64 product wraps, and so do we). Both take
their permutations from ``np.random.RandomState(seed)`` exactly as datasketch draws them.

A numba kernel walks each document's shingle hashes once and keeps the running minimum for
all permutations (an inner loop LLVM vectorizes); numpy broadcasting of a (shingles x num_perm)
matrix is the fallback, memory-bound and several times slower.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from datapipe.dedup.lsh_table import LSH_PARAMS
from datapipe.dedup.shingles import DEFAULT_N, HAVE_NUMBA, Texts, shingle_hashes

DEFAULT_NUM_PERM = 128
DEFAULT_SEED = 1
DEFAULT_THRESHOLD = 0.7
SCHEMES = ("affine32", "legacy")

_MERSENNE = np.uint64((1 << 61) - 1)
_MAX32 = np.uint64((1 << 32) - 1)
_M64 = (1 << 64) - 1


def permutations(num_perm: int, seed: int = DEFAULT_SEED, scheme: str = "affine32") -> tuple[np.ndarray, np.ndarray]:
    """(a, b) exactly as datasketch.MinHash._init_permutations draws them."""
    gen = np.random.RandomState(seed)
    if scheme == "legacy":
        ab = np.array(
            [(gen.randint(1, _MERSENNE, dtype=np.uint64), gen.randint(0, _MERSENNE, dtype=np.uint64)) for _ in range(num_perm)],
            dtype=np.uint64,
        ).T
        return ab[0].copy(), ab[1].copy()
    if scheme != "affine32":
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _affine32_kernel(hashes, offsets, a, b, out):
    num_perm = a.shape[0]
    for d in range(offsets.shape[0] - 1):
        row = out[d]
        for s in range(offsets[d], offsets[d + 1]):
            x = np.uint32(hashes[s])
            x ^= x >> np.uint32(16)
            x = np.uint32(x * np.uint32(0x85EBCA6B))
            x ^= x >> np.uint32(13)
            x = np.uint32(x * np.uint32(0xC2B2AE35))
            x ^= x >> np.uint32(16)
            for k in range(num_perm):
                v = np.uint32(a[k] * x + b[k])  # wraps mod 2^32 like datasketch's uint32 arrays
                if v < row[k]:
                    row[k] = v


def _legacy_kernel(hashes, offsets, a, b, out):
    num_perm = a.shape[0]
    p = np.uint64((1 << 61) - 1)
    m = np.uint64((1 << 32) - 1)
    for d in range(offsets.shape[0] - 1):
        row = out[d]
        for s in range(offsets[d], offsets[d + 1]):
            x = np.uint64(hashes[s])
            for k in range(num_perm):
                v = ((a[k] * x + b[k]) % p) & m
                if v < row[k]:
                    row[k] = v


if HAVE_NUMBA:
    from datapipe.runtime.jit import arr, lazy_numba

    numba = lazy_numba()  # compiled (or loaded from the cache) on first use

    _affine32_jit = numba.njit(
        cache=True, nogil=True, warm=[(arr("uint32"), arr("int64"), arr("uint32"), arr("uint32"), arr("uint32", 2))]
    )(_affine32_kernel)
    _legacy_jit = numba.njit(
        cache=True, nogil=True, warm=[(arr("uint32"), arr("int64"), arr("uint64"), arr("uint64"), arr("uint64", 2))]
    )(_legacy_kernel)


def signatures_from_hashes(
    hashes: np.ndarray,
    offsets: np.ndarray,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    scheme: str = "affine32",
    use_numba: bool = HAVE_NUMBA,
) -> np.ndarray:
    """(n_docs, num_perm) signatures: uint32 for affine32, uint64 for legacy (datasketch's dtypes).

    A document without shingles keeps datasketch's empty value (all 2^32-1).
    """
    a, b = _perms_cached(num_perm, seed, scheme)
    n_docs = len(offsets) - 1
    dtype = np.uint32 if scheme == "affine32" else np.uint64
    out = np.full((n_docs, num_perm), (1 << 32) - 1, dtype=dtype)
    hashes = np.ascontiguousarray(hashes, dtype=np.uint32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if use_numba:
        (_affine32_jit if scheme == "affine32" else _legacy_jit)(hashes, offsets, a, b, out)
        return out
    for d in range(n_docs):  # numpy fallback: one (shingles x num_perm) broadcast per document
        h = hashes[offsets[d] : offsets[d + 1]]
        if len(h) == 0:
            continue
        if scheme == "affine32":
            phv = _fmix32(h)[:, None] * a + b
        else:
            with np.errstate(over="ignore"):
                phv = ((h.astype(np.uint64)[:, None] * a + b) % _MERSENNE) & _MAX32
        out[d] = phv.min(axis=0)
    return out


@lru_cache(maxsize=16)
def _perms_cached(num_perm: int, seed: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    return permutations(num_perm, seed, scheme)


def signatures(
    texts: Texts,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    n: int = DEFAULT_N,
    char_map: Mapping[int, str] | None = None,
    scheme: str = "affine32",
) -> np.ndarray:
    """Raw text batch (list of str or pyarrow string array) -> signature matrix."""
    hashes, offsets = shingle_hashes(texts, n=n, char_map=char_map)
    return signatures_from_hashes(hashes, offsets, num_perm, seed, scheme)


def empty_mask(sigs: np.ndarray) -> np.ndarray:
    """Documents without shingles (all values at datasketch's empty sentinel)."""
    return np.all(sigs == ((1 << 32) - 1), axis=1)


def lsh_params(
    threshold: float = DEFAULT_THRESHOLD, num_perm: int = DEFAULT_NUM_PERM, weights: tuple[float, float] = (0.5, 0.5)
) -> tuple[int, int]:
    """(bands, rows) exactly as datasketch.MinHashLSH derives them (its own _optimal_param)."""
    return _optimal_param_cached(float(threshold), int(num_perm), float(weights[0]), float(weights[1]))


@lru_cache(maxsize=64)
def _optimal_param_cached(threshold: float, num_perm: int, fpw: float, fnw: float) -> tuple[int, int]:
    if (fpw, fnw) == (0.5, 0.5) and (known := LSH_PARAMS.get((num_perm, threshold))) is not None:
        return known  # precomputed: computing imports scipy.integrate, costly in every process
    from datasketch.lsh import _optimal_param  # scipy quad per (b, r): seconds, hence the cache

    return tuple(_optimal_param(threshold, num_perm, fpw, fnw))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a bijection, so distinct band contents rarely share a key."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n_docs, bands) uint64 keys; key[:, i] hashes sig[:, i*rows:(i+1)*rows] and the band index.

    Same bands as MinHashLSH.hashranges; the band index is mixed in so that keys of all bands
    can share one hash-partitioned shuffle without cross-band collisions.
    """
    if bands * rows > sigs.shape[1]:
        raise ValueError(f"bands*rows = {bands * rows} exceeds num_perm = {sigs.shape[1]}")
    out = np.empty((sigs.shape[0], bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(bands):
            key = np.full(sigs.shape[0], (i + 1) * 0x9E3779B97F4A7C15 & _M64, dtype=np.uint64)
            for j in range(i * rows, (i + 1) * rows):
                key = _mix64(key ^ sigs[:, j].astype(np.uint64))
            out[:, i] = key
    return out


def partition_of(keys: np.ndarray, n_partitions: int) -> np.ndarray:
    """Reduce partition of each band key (keys are already well mixed)."""
    return (keys % np.uint64(n_partitions)).astype(np.int64)


def to_lean_minhash(sig_row: np.ndarray, seed: int = DEFAULT_SEED, scheme: str = "affine32"):
    """One signature row as a datasketch LeanMinHash (for MinHashLSH, jaccard, serialization)."""
    from datasketch import LeanMinHash

    return LeanMinHash(seed=seed, hashvalues=sig_row, scheme=scheme)
