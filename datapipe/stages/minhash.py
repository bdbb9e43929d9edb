"""Near-duplicate removal with MinHash LSH across the whole run (datasketch-compatible signatures).

Map phase: per document a MinHash signature (CJK character / Latin word shingles, see
``datapipe.dedup.shingles``), kept as the ``minhash_sig`` column, and one band key per
LSH band, shuffled by key into partitions. Round 0 (partition tasks, in parallel) pairs documents
that share a band key, verifies the pairs by estimated Jaccard (signatures read back from the
map outputs) and reduces them to a spanning forest with a local union-find. The forest edges are
then shuffled by document: rounds 1..2k alternate small-star and large-star
(``datapipe.dedup.components``), which turn each cluster into a star around its lowest row key,
and a cluster is settled in the partition of that root as soon as it is known whole: its survivor
chosen by the rule (n_chars / score read for its members only) and its decisions and survivor size
written by that partition. Clusters still open after the last round (rare: long chains of copies)
are finished by the combine step with a union-find over what is left; it reads nothing else.

Rehydration: every kept document gets ``dup_count``, the size of the cluster it survived (1 for a
singleton), so a mixture can upsample by it later as FineWeb-2 does. The partitions hand the
survivors' sizes to the next map segment as per-shard state (12 bytes per cluster).

Memory: a round-0 task holds its share of band keys (16 bytes x bands x documents / partitions)
and the signatures of its paired documents; a star round its share of the forest edges; a
settling round the signatures and lengths of the clusters rooted in its partition (one cluster is
never split: a cluster of a million copies is settled by one task). No task holds the corpus's
clusters; the combine step holds only the edges of clusters the rounds did not finish.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.dedup.cluster import Clusters, spanning_forest, survivors, union_of, verified_pairs
from datapipe.dedup.components import CONFIRM, EDGE, both_ways, large_star, node_partition, small_star
from datapipe.dedup.fold import fold_traditional
from datapipe.dedup.minhash import (
    DEFAULT_NUM_PERM,
    DEFAULT_SEED,
    DEFAULT_THRESHOLD,
    band_keys,
    empty_mask,
    lsh_params,
    partition_of,
    signatures,
)
from datapipe.dedup.shingles import DEFAULT_N
from datapipe.stages.base import CheckContext, Decision, Problem, Resources, StageOptions
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import (
    CombineStep,
    GlobalStage,
    GlobalStep,
    PartitionResult,
    PartitionStep,
    ReduceInputs,
    drop_rows,
    state_rows,
)

SIG_COLUMN = "minhash_sig"
# Text and hash columns earlier stages add: a survivor cannot be chosen by them.
_NOT_NUMERIC = {
    "id",
    "source",
    "kind",
    "text",
    "url",
    "path",
    "lang",
    "lang_by",
    "script",
    "quality_rules",
    "license",
    "license_class",
    "license_evidence",
    "text_hash",
    "url_key",
}


class MinHashOptions(StageOptions):
    threshold: float = Field(
        DEFAULT_THRESHOLD, gt=0.0, lt=1.0, description="Jaccard similarity above which documents count as near-duplicates."
    )
    num_perm: int = Field(DEFAULT_NUM_PERM, ge=16, le=1024, description="Permutations per signature.")
    bands: int | None = Field(None, ge=1, description="LSH bands; derived from threshold like datasketch if omitted.")
    rows: int | None = Field(None, ge=1, description="Rows per band; set together with bands.")
    ngram: int = Field(DEFAULT_N, ge=1, le=32, description="Shingle size: characters in CJK text, words in Latin.")
    seed: int = Field(DEFAULT_SEED, ge=0, description="Permutation seed (datasketch's `seed`).")
    verify: bool = Field(True, description="Keep only candidate pairs whose estimated Jaccard reaches threshold.")
    survivor: Literal["earliest", "longest", "best"] = Field("earliest", description="Which copy of a cluster to keep.")
    score_column: str | None = Field(None, description="Signal column for survivor: best (higher is better).")
    partitions: int = Field(16, ge=1, le=4096, description="Parallel tasks of the shuffle.")
    fold_script: bool = Field(
        False,
        description="Fold Traditional to Simplified characters first, so copies across the two scripts are near-duplicates.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> MinHashOptions:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set bands and rows together, or neither (derived from threshold)")
        if self.bands is not None and self.rows is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.survivor == "best" and not self.score_column:
            raise ValueError("survivor: best needs score_column (a numeric signal column, higher is better)")
        return self


class MinHashDedup(GlobalStage):
    name = "minhash"
    Options = MinHashOptions
    resources = Resources(num_cpus=1, memory_mb=1024)
    signal_columns = (SIG_COLUMN,)
    transient_columns = (SIG_COLUMN,)  # 4 bytes x num_perm per document: not worth keeping in docs/

    @classmethod
    def keeps_text(cls, options: MinHashOptions) -> bool:
        return True  # decides which copies survive; the text is not touched

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return {"dup_count"}  # the signature is transient

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        """score_column is read only in the combine step, after every map task: check it exists now."""
        from datapipe.stages import STAGES

        o: MinHashOptions = options
        if o.survivor != "best" or not o.score_column:
            return []
        available = {"n_chars"}
        for kind, opts in context.before:
            cols = STAGES[kind].output_columns(opts, context)
            if cols is None:
                return []  # an earlier stage's columns are not known up front: leave it to the run
            available |= cols
        if o.score_column in _NOT_NUMERIC:
            return [
                (
                    "score_column",
                    f"{o.score_column!r} is not numeric; survivor: best needs a numeric signal "
                    f"(higher is better), e.g. lang_score or n_chars",
                )
            ]
        if o.score_column in available:
            return []
        import difflib

        close = difflib.get_close_matches(o.score_column, sorted(available), n=1, cutoff=0.8)
        hint = f"did you mean {close[0]!r}?" if close else f"columns there: {', '.join(sorted(available))}"
        return [("score_column", f"{o.score_column!r} is not a column of the documents at this stage; {hint}")]

    def band_params(self) -> tuple[int, int]:
        o = self.options
        if o.bands is not None:
            return o.bands, o.rows
        return lsh_params(o.threshold, o.num_perm)

    # Pairs of (small-star, large-star) rounds after round 0. A cluster whose star forms by round 2j-1
    # is settled in round 2j: pairs of copies in round 2, a chain of n copies in about log2(n) + 4
    # pairs when they come in run order, the slowest case (100 copies: 8 pairs, 500: 10; in random
    # order 1000: 9). Rounds after the last settled cluster have no tasks (the engine skips a
    # round after one that forwarded nothing), so planning many costs nothing; what is still open
    # after the last one goes to the combine step.
    star_pairs: ClassVar[int] = 10

    def steps(self) -> tuple[GlobalStep, ...]:
        """The partitions decide (settled clusters); the combine step only finishes what they left open."""
        return (
            PartitionStep(
                self.options.partitions, self.shuffle, self.reduce_partition, rounds=1 + 2 * self.star_pairs, decides=True
            ),
            CombineStep(self.combine, self.combine_state),
        )

    def compute(self, batch: pa.Table) -> pa.Table:
        o = self.options
        text = pc.fill_null(batch["text"], "")
        if o.fold_script:
            text = pa.array(fold_traditional(text.to_pylist()), pa.string())
        sigs = signatures(text, num_perm=o.num_perm, seed=o.seed, n=o.ngram)
        width = 4 * o.num_perm
        buf = pa.py_buffer(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        column = pa.Array.from_buffers(pa.binary(width), len(sigs), [None, buf])
        return set_column(batch, SIG_COLUMN, column)

    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        sigs = _sig_matrix(batch[SIG_COLUMN], self.options.num_perm)
        bands, rows = self.band_params()
        keys = band_keys(sigs, bands, rows)
        # Documents without shingles all share the empty signature: never cluster them.
        valid = np.flatnonzero(~empty_mask(sigs))
        docs = np.repeat(first_row_key + valid.astype(np.int64), bands)
        flat = keys[valid].reshape(-1)
        return pa.table(
            {
                "part": pa.array(partition_of(flat, self.options.partitions).astype(np.int32)),
                "doc": pa.array(docs),
                "key": pa.array(flat),
            }
        )

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        """Round 0: the partition's candidate pairs, verified, reduced to a spanning forest (one edge per
        paired document, root the lowest row key of its local component), forwarded by document.
        Odd rounds: small-star; even rounds: large-star, settling the clusters known whole."""
        assert inputs is not None, "verification and settling read columns from the map outputs"
        if round == 0:

            def read_sigs(docs: np.ndarray) -> np.ndarray:
                return _sig_matrix(inputs.read_rows(docs, [SIG_COLUMN])[SIG_COLUMN], self.options.num_perm)

            threshold = self.options.threshold if self.options.verify else None
            u, v, _ = verified_pairs(rows["doc"].to_numpy(), rows["key"].to_numpy(), threshold, read_sigs)
            return PartitionResult(None, self._edges(*spanning_forest(u, v)))
        node, nbr = rows["node"].to_numpy(), rows["nbr"].to_numpy()
        edge = rows["kind"].to_numpy() == EDGE
        if round % 2 == 1:
            (u, v), (centre, leaf) = small_star(node[edge], nbr[edge])
            return PartitionResult(None, self._edges(u, v, confirm=(centre, leaf)))
        (u, v), (roots, members) = large_star(node[edge], nbr[edge], (node[~edge], nbr[~edge]))
        decisions, sizes = self._settle(*_star_clusters(roots, members), inputs)
        return PartitionResult(decisions, self._edges(u, v), sizes)

    def _edges(self, u: np.ndarray, v: np.ndarray, confirm: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
        """Undirected edges as rows (part, node, nbr, kind) for the partitions of both endpoints, and
        confirm rows (centre, leaf) for the centre's partition."""
        node, nbr = both_ways(u, v)
        kind = np.full(len(node), EDGE, np.int8)
        if confirm is not None:
            node, nbr = np.concatenate([node, confirm[0]]), np.concatenate([nbr, confirm[1]])
            kind = np.concatenate([kind, np.full(len(confirm[0]), CONFIRM, np.int8)])
        return pa.table(
            {
                "part": pa.array(node_partition(node, self.options.partitions), pa.int32()),
                "node": pa.array(node, pa.int64()),
                "nbr": pa.array(nbr, pa.int64()),
                "kind": pa.array(kind, pa.int8()),
            }
        )

    def _settle(self, keys: np.ndarray, cluster: np.ndarray, inputs: ReduceInputs) -> tuple[pa.Table, pa.Table]:
        """Decisions and survivor sizes of whole clusters: ``keys`` sorted distinct row keys, ``cluster``
        the lowest row key of each one's cluster. Reads id, signature and length (or score) of these
        documents only."""
        o = self.options
        if len(keys) == 0:
            return _decisions(keys, [], [], [], [], []), _sizes(keys, np.empty(0, np.int64))
        columns = ["id", SIG_COLUMN, "n_chars"] + ([o.score_column] if o.survivor == "best" else [])
        docs = inputs.read_rows(keys, columns)
        sigs = _sig_matrix(docs[SIG_COLUMN], o.num_perm)
        scores = docs[o.score_column].to_numpy(zero_copy_only=False) if o.survivor == "best" else None
        roots = np.searchsorted(keys, cluster)  # index of the cluster's lowest key: what survivors() expects
        surv = survivors(roots, o.survivor, lengths=docs["n_chars"].to_numpy(zero_copy_only=False), scores=scores)
        c = Clusters(roots, surv, np.bincount(roots, minlength=len(roots))[roots])
        head = np.flatnonzero(c.kept)
        sizes = _sizes(keys[head], c.size[head])
        dup = np.flatnonzero(c.duplicate)
        ids = np.asarray(docs["id"].to_pylist(), dtype=object)
        surv = c.survivor[dup]
        similarity = (sigs[dup] == sigs[surv]).mean(axis=1)
        return _decisions(
            keys[dup],
            ids[dup].tolist(),
            ids[surv].tolist(),
            ids[c.cluster[dup]].tolist(),
            c.size[dup].tolist(),
            similarity.tolist(),
        ), sizes

    def combine_state(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table | None:
        """Cluster sizes of the survivors the combine step settled (the engine calls it after ``combine``);
        None when it settled none (the partitions hand on the others' sizes)."""
        return getattr(self, "_survivor_sizes", None)

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        dup_count = np.ones(batch.num_rows, np.int64)
        if state is not None and state.num_rows:
            keys = state["row_key"].to_numpy()
            order = np.argsort(keys)
            j = np.minimum(np.searchsorted(keys[order], row_keys), len(keys) - 1)
            hit = keys[order][j] == row_keys
            dup_count[hit] = state["dup_count"].to_numpy()[order][j[hit]]
        return set_column(batch, "dup_count", pa.array(dup_count)), Decision.keep_all(batch.num_rows)

    def combine(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        """The clusters the rounds left open (normally none: then this reads no file and costs nothing).

        What the last round forwarded is a graph with the same components as those clusters, so a
        union-find over it finds them; its memory is that leftover graph plus its documents' columns."""
        import pyarrow.parquet as pq

        self._survivor_sizes = None
        empty = _decisions(np.empty(0, np.int64), [], [], [], [], [])
        if not inputs.forwarded:
            return empty
        rows = pa.concat_tables([pq.read_table(p, columns=["node", "nbr", "kind"]) for p in inputs.forwarded])
        edge = rows["kind"].to_numpy() == EDGE
        involved, uf = union_of(rows["node"].to_numpy()[edge], rows["nbr"].to_numpy()[edge])
        if len(involved) == 0:
            return empty
        decisions, self._survivor_sizes = self._settle(involved, involved[uf.roots()], inputs)
        return decisions


def _star_clusters(roots: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Settled (root, member) pairs as sorted distinct row keys and each one's cluster root."""
    centres = np.unique(roots)
    keys = np.concatenate([centres, members])
    cluster = np.concatenate([centres, roots])
    order = np.argsort(keys, kind="stable")
    return keys[order], cluster[order]


def _sig_matrix(column: pa.ChunkedArray | pa.Array, num_perm: int) -> np.ndarray:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(arr) == 0:
        return np.empty((0, num_perm), dtype=np.uint32)
    data = arr.buffers()[1]
    start = arr.offset * 4 * num_perm
    return np.frombuffer(data, dtype=np.uint32, count=len(arr) * num_perm, offset=start).reshape(len(arr), num_perm)


def _sizes(row_keys: np.ndarray, sizes: np.ndarray) -> pa.Table:
    return state_rows(row_keys, dup_count=pa.array(sizes.astype(np.int64)))


def _decisions(keys: np.ndarray, ids: list, survivor_ids: list, cluster_ids: list, sizes: list, similarity: list) -> pa.Table:
    detail = [
        f"near-duplicate of {s} (cluster of {n}, estimated Jaccard {j:.2f})" for s, n, j in zip(survivor_ids, sizes, similarity)
    ]
    return drop_rows(
        keys,
        ids,
        "near_duplicate",
        detail,
        dup_of=pa.array(survivor_ids, pa.string()),
        dup_cluster=pa.array(cluster_ids, pa.string()),
    )
