"""Near-duplicate detection: shingles, MinHash signatures (datasketch-compatible), LSH clustering.

``near_duplicates`` is the single-process composition of the pieces; a distributed stage runs
``minhash.signatures`` + ``minhash.band_keys`` in its map phase and ``cluster`` in its reduce.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from datapipe.dedup.cluster import DedupResult, cluster_duplicates
from datapipe.dedup.minhash import (
    DEFAULT_NUM_PERM,
    DEFAULT_SEED,
    DEFAULT_THRESHOLD,
    band_keys,
    empty_mask,
    lsh_params,
    signatures,
)
from datapipe.dedup.shingles import DEFAULT_N


def near_duplicates(
    texts: Sequence[str],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    num_perm: int = DEFAULT_NUM_PERM,
    seed: int = DEFAULT_SEED,
    n: int = DEFAULT_N,
    bands_rows: tuple[int, int] | None = None,
    verify: bool = True,
    rule: str = "earliest",
    scores: np.ndarray | None = None,
    char_map: Mapping[int, str] | None = None,
) -> DedupResult:
    """Cluster a batch held in memory; bands/rows derived like datasketch unless given."""
    sigs = signatures(texts, num_perm=num_perm, seed=seed, n=n, char_map=char_map)
    bands, rows = bands_rows or lsh_params(threshold, num_perm)
    keys = band_keys(sigs, bands, rows)
    lengths = np.fromiter((len(t or "") for t in texts), dtype=np.int64, count=len(texts))
    return cluster_duplicates(
        keys,
        len(texts),
        valid=~empty_mask(sigs),
        sigs=sigs,
        verify_threshold=threshold if verify else None,
        rule=rule,
        lengths=lengths,
        scores=scores,
    )
