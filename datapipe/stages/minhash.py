"""Near-duplicate removal with MinHash LSH across the whole run (datasketch-compatible signatures).

Map phase: per document a MinHash signature (CJK character / Latin word shingles, see
``datapipe.dedup.shingles``), kept as the ``minhash_sig`` column, and one band key per
LSH band, shuffled by key into partitions. Round 0 (partition tasks, in parallel) pairs documents
that share a band key; the signatures to verify those pairs come by a join, not by every partition
reading the map outputs: each map output has an *owner* partition, asked in round 0 for the rows a
partition needs and answering in round 1, reading each of its map outputs once. Round 2 verifies
the pairs by estimated Jaccard and reduces them to a spanning forest with a local union-find. The
forest edges are then shuffled by document: the following rounds alternate small-star and
large-star (``datapipe.dedup.components``), which turn each cluster into a star around its lowest
row key, and a cluster known whole asks its members' id, signature and length (or score) of their
owners and is settled in the partition of its root two rounds later: its survivor chosen by the
rule, its decisions and survivor size written by that partition. Clusters still open after the
last round (rare: long chains of copies) are finished by the combine step with a union-find over
what is left, reading those documents' columns itself.

Rehydration: every kept document gets ``dup_count``, the size of the cluster it survived (1 for a
singleton), so a mixture can upsample by it later as FineWeb-2 does. The partitions hand the
survivors' sizes to the next map segment as per-shard state (12 bytes per cluster).

Memory: a round-0 task holds its share of band keys (16 bytes x bands x documents / partitions),
round 2 the signatures of its paired documents (answered by their owners); a star round its share of the forest edges; a
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

from datapipe.dedup.cluster import Clusters, candidate_edges, estimated_jaccard, spanning_forest, survivors, union_of
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
from datapipe.stages.report_section import Aggregate, ReportSection, column
from datapipe.stages.row_keys import shard_of
from datapipe.stages.steps import Partitions, partitions_option

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
    partitions: Partitions = partitions_option("Parallel tasks of the shuffle")
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
    summary = "near-duplicates by MinHash LSH, with cluster sizes for rehydration"
    signals = "MinHash signature (dropped after the reduce); `dup_count` on kept documents"
    reasons = ("near_duplicate",)
    Options = MinHashOptions
    resources = Resources(num_cpus=1, memory_mb=1024)
    signal_columns = (SIG_COLUMN,)
    transient_columns = (SIG_COLUMN,)  # 4 bytes x num_perm per document: not worth keeping in docs/

    @classmethod
    def keeps_text(cls, options: MinHashOptions) -> bool:
        return True  # decides which copies survive; the text is not touched

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return rehydration_aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return rehydration_sections(columns)

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

    # Pairs of (small-star, large-star) rounds after the verification rounds 0-2. A cluster whose star
    # forms by round 2j+1 is found whole in round 2j+2 and decided in round 2j+4 (its members' columns
    # asked of their owners in between): pairs of copies in round 6, a chain of n copies in about
    # log2(n) + 4 pairs when they come in run order, the slowest case (100 copies: 8 pairs, 500: 10;
    # in random order 1000: 9). Rounds after the last with work have no tasks (the engine skips a
    # round after one that forwarded nothing), so planning many costs nothing; what is still open
    # after the last one goes to the combine step.
    star_pairs: ClassVar[int] = 10

    @classmethod
    def rounds(cls) -> int:
        """Round 0 pairs, 1 answers signatures, 2 verifies; then the star pairs; then one round that
        answers the last settled clusters' columns and one that decides them."""
        return 3 + 2 * cls.star_pairs + 2

    def steps(self) -> tuple[GlobalStep, ...]:
        """The partitions decide (settled clusters); the combine step only finishes what they left open."""
        return (
            PartitionStep(
                self.partitions,
                self.shuffle,
                self.reduce_partition,
                rounds=self.rounds(),
                decides=True,
                owner_reads=True,
                round_names=(
                    "finding candidate pairs",
                    "fetching signatures",
                    "verifying pairs",
                    *["joining clusters"] * (2 * self.star_pairs),
                    "fetching cluster members",
                    "deciding clusters",
                ),
            ),
            CombineStep(self.combine, self.combine_state, reads_files=False, name="deciding the clusters left open"),
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
                "part": pa.array(partition_of(flat, self.partitions).astype(np.int32)),
                "doc": pa.array(docs),
                "key": pa.array(flat),
            }
        )

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        """One round of one partition. Every row it forwards has the columns of ``_rows``.

        Round 0: the partition's candidate pairs (band rows sharing a key), kept here as ``PAIR`` rows,
        and an ``ASK_SIG`` row per paired document to the *owner* of its map output (``_owner``).
        Odd rounds: an owner answers what it was asked, reading each of its map outputs once (only
        the rows asked for); then small-star. Round 2: the pairs verified by estimated Jaccard with
        the signatures answered, reduced to a spanning forest (one edge per paired document),
        forwarded by document. Even rounds from 4: large-star; a cluster known whole asks its
        members' id, signature and length of their owners (``ASK_DOC``) and is decided two rounds
        later from the answers (``DOC`` rows). So no partition reads the map outputs of others:
        a map output is read by one task per answering round, not by every partition
        (docs/scaling.md, "What breaks first", item 1)."""
        assert inputs is not None, "owners read the map outputs"
        if round == 0:
            return PartitionResult(None, self._candidates(rows))
        kind = rows["kind"].to_numpy()
        last_star = self.rounds() - 3  # the last large-star round
        forward: list[pa.Table] = []
        decisions = sizes = None
        edges = rows.filter(pa.array((kind == EDGE) | (kind == CONFIRM)))
        node, nbr = edges["node"].to_numpy(), edges["nbr"].to_numpy()
        edge = edges["kind"].to_numpy() == EDGE
        if round % 2 == 1:
            forward.append(self._answers(rows.filter(pa.array((kind == ASK_SIG) | (kind == ASK_DOC))), inputs))
            forward.append(rows.filter(pa.array(kind == PAIR)))  # to round 2, in this partition
            if round <= last_star:
                (u, v), (centre, leaf) = small_star(node[edge], nbr[edge])
                forward.append(self._edges(u, v, confirm=(centre, leaf)))
            else:
                forward.append(edges)  # after the last star round: left for the combine step
        else:
            if round == 2:
                pairs, sigs = rows.filter(pa.array(kind == PAIR)), rows.filter(pa.array(kind == SIG))
                forward.append(self._edges(*spanning_forest(*self._verified(pairs, sigs))))
            docs = rows.filter(pa.array(kind == DOC))
            if docs.num_rows:
                docs = docs.sort_by([("node", "ascending")])
                decisions, sizes = self._settle(docs["node"].to_numpy(), docs["nbr"].to_numpy(), docs)
            if round <= last_star:
                (u, v), (roots, members) = large_star(node[edge], nbr[edge], (node[~edge], nbr[~edge]))
                forward.append(self._edges(u, v))
                keys, cluster = _star_clusters(roots, members)
                forward.append(self._rows(_owner(keys, self.partitions), keys, cluster, ASK_DOC))
            else:
                forward.append(edges)
        return PartitionResult(decisions, pa.concat_tables(forward), sizes)

    def _candidates(self, rows: pa.Table) -> pa.Table:
        """Round 0: candidate pairs kept in this partition, and the signatures they need asked of the owners."""
        me = int(rows["part"][0].as_py())  # the rows of a partition all carry its number
        u, v = candidate_edges(rows["doc"].to_numpy(), rows["key"].to_numpy())
        pairs = self._rows(np.full(len(u), me, np.int32), u, v, PAIR)
        if not self.options.verify:
            return pairs
        docs = np.unique(np.concatenate([u, v]))
        asks = self._rows(_owner(docs, self.partitions), docs, np.full(len(docs), me, np.int64), ASK_SIG)
        return pa.concat_tables([pairs, asks])

    def _answers(self, asks: pa.Table, inputs: ReduceInputs) -> pa.Table:
        """An owner's answers: each document asked for, read once from its map output, to each asker.
        ``ASK_SIG`` (nbr: the asking partition) gets the signature, ``ASK_DOC`` (nbr: the cluster's
        root, decided in the root's partition) the columns ``_settle`` needs."""
        o = self.options
        out = [self._rows(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), SIG)]
        kind = asks["kind"].to_numpy()
        for ask, answer in ((ASK_SIG, SIG), (ASK_DOC, DOC)):
            sel = asks.filter(pa.array(kind == ask))
            if not sel.num_rows:
                continue
            node, nbr = sel["node"].to_numpy(), sel["nbr"].to_numpy()
            docs = np.unique(node)
            table = inputs.read_rows(docs, self._doc_columns() if answer == DOC else [SIG_COLUMN])
            at = pa.array(np.searchsorted(docs, node))
            part = nbr.astype(np.int32) if answer == SIG else node_partition(nbr, self.partitions)
            columns = {"sig": table[SIG_COLUMN].take(at)}
            if answer == DOC:
                columns |= {
                    "id": table["id"].take(at),
                    "n_chars": table["n_chars"].take(at),
                    "score": table[o.score_column].take(at) if o.survivor == "best" else None,
                }
            out.append(self._rows(part, node, nbr, answer, **columns))
        return pa.concat_tables(out)

    def _doc_columns(self) -> list[str]:
        o = self.options
        return ["id", SIG_COLUMN, "n_chars"] + ([o.score_column] if o.survivor == "best" and o.score_column else [])

    def _verified(self, pairs: pa.Table, answers: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """The candidate pairs whose estimated Jaccard reaches the threshold (all of them without ``verify``)."""
        u, v = pairs["node"].to_numpy(), pairs["nbr"].to_numpy()
        if not self.options.verify or len(u) == 0:
            return u, v
        answers = answers.sort_by([("node", "ascending")])
        docs = answers["node"].to_numpy()
        sigs = _sig_matrix(answers["sig"], self.options.num_perm)
        keep = estimated_jaccard(sigs, np.searchsorted(docs, u), np.searchsorted(docs, v)) >= self.options.threshold
        return u[keep], v[keep]

    def _rows(self, part: np.ndarray, node: np.ndarray, nbr: np.ndarray, kind: int, **columns: Any) -> pa.Table:
        """Forwarded rows: (part, node, nbr, kind) and the answered columns (null where not given), one
        schema for every round so a round's files read as one table."""
        n = len(node)
        schema = self._forward_schema()
        values = {
            "part": pa.array(np.asarray(part, np.int32), pa.int32()),
            "node": pa.array(np.asarray(node, np.int64), pa.int64()),
            "nbr": pa.array(np.asarray(nbr, np.int64), pa.int64()),
            "kind": pa.array(np.full(n, kind, np.int8), pa.int8()),
        }
        for field in schema:
            if field.name not in values:
                given = columns.get(field.name)
                values[field.name] = pa.nulls(n, field.type) if given is None else _one_chunk(given).cast(field.type)
        return pa.table(values, schema=schema)

    def _forward_schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("part", pa.int32()),
                ("node", pa.int64()),
                ("nbr", pa.int64()),
                ("kind", pa.int8()),
                ("sig", pa.binary(4 * self.options.num_perm)),
                ("id", pa.string()),
                ("n_chars", pa.int64()),
                ("score", pa.float64()),
            ]
        )

    def _edges(self, u: np.ndarray, v: np.ndarray, confirm: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
        """Undirected edges as rows (part, node, nbr, kind) for the partitions of both endpoints, and
        confirm rows (centre, leaf) for the centre's partition."""
        node, nbr = both_ways(u, v)
        kind = np.full(len(node), EDGE, np.int8)
        if confirm is not None:
            node, nbr = np.concatenate([node, confirm[0]]), np.concatenate([nbr, confirm[1]])
            kind = np.concatenate([kind, np.full(len(confirm[0]), CONFIRM, np.int8)])
        table = self._rows(node_partition(node, self.partitions), node, nbr, EDGE)
        return table.set_column(table.schema.get_field_index("kind"), "kind", pa.array(kind, pa.int8()))

    def _settle(self, keys: np.ndarray, cluster: np.ndarray, docs: pa.Table) -> tuple[pa.Table, pa.Table]:
        """Decisions and survivor sizes of whole clusters: ``keys`` sorted distinct row keys, ``cluster``
        the lowest row key of each one's cluster, ``docs`` their columns id, ``sig``, n_chars and
        ``score`` (survivor: best), row for row."""
        o = self.options
        if len(keys) == 0:
            return _decisions(keys, [], [], keys, [], [], []), _sizes(keys, np.empty(0, np.int64))
        sigs = _sig_matrix(docs["sig"], o.num_perm)
        scores = docs["score"].to_numpy(zero_copy_only=False) if o.survivor == "best" else None
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
            keys[surv],
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
        empty = _decisions(np.empty(0, np.int64), [], [], np.empty(0, np.int64), [], [], [])
        if not inputs.forwarded:
            return empty
        rows = pa.concat_tables([pq.read_table(p, columns=["node", "nbr", "kind"]) for p in inputs.forwarded])
        edge = rows["kind"].to_numpy() == EDGE
        involved, uf = union_of(rows["node"].to_numpy()[edge], rows["nbr"].to_numpy()[edge])
        if len(involved) == 0:
            return empty
        o = self.options
        read = inputs.read_rows(involved, self._doc_columns())  # the rare leftovers: read directly
        docs = {"id": read["id"], "sig": read[SIG_COLUMN], "n_chars": read["n_chars"]}
        if o.survivor == "best":
            docs["score"] = read[o.score_column]
        decisions, self._survivor_sizes = self._settle(involved, involved[uf.roots()], pa.table(docs))
        return decisions


# Row kinds of the forwarded rows, beside components.EDGE and CONFIRM.
PAIR, ASK_SIG, SIG, ASK_DOC, DOC = 2, 3, 4, 5, 6


def _owner(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition that answers for each row key's map output: its shard modulo the partitions, so
    each map output has one reader per answering round and the owners share the map outputs evenly."""
    return (shard_of(keys) % partitions).astype(np.int32)


def _one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


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


def _decisions(
    keys: np.ndarray, ids: list, survivor_ids: list, survivor_keys: np.ndarray, cluster_ids: list, sizes: list, similarity: list
) -> pa.Table:
    detail = [
        f"near-duplicate of {s} (cluster of {n}, estimated Jaccard {j:.2f})" for s, n, j in zip(survivor_ids, sizes, similarity)
    ]
    return drop_rows(
        keys,
        ids,
        "near_duplicate",
        detail,
        dup_of_keys=survivor_keys,
        dup_of=pa.array(survivor_ids, pa.string()),
        dup_cluster=pa.array(cluster_ids, pa.string()),
    )


# --- the audit: rehydration weights (what FineWeb-2 upsamples by) ------------------------------------


def rehydration_aggregates(columns: set[str]) -> list[Aggregate]:
    """Per source, the kept documents: how many stand for a cluster (dup_count > 1), the largest
    cluster, their tokens and their tokens weighted by cluster size."""
    if "dup_count" not in columns:
        sql = ""
    else:
        tokens = column(columns, "n_tokens", "BIGINT")
        sql = f"""SELECT {column(columns, "source")} AS source, count(*) AS documents,
                   count(*) FILTER (dup_count > 1) AS clusters,
                   max(dup_count)::BIGINT AS largest, coalesce(sum({tokens}), 0)::BIGINT AS tokens,
                   coalesce(sum({tokens} * coalesce(dup_count, 1)), 0)::BIGINT AS rehydrated_tokens
            FROM documents WHERE status = 'kept' GROUP BY ALL"""
    values = ("documents", "clusters", "largest", "tokens", "rehydrated_tokens")
    return [
        Aggregate(
            "rehydration",
            sql,
            (("source", "VARCHAR"), *((v, "BIGINT") for v in values)),
            merge={**dict.fromkeys(values, "sum"), "largest": "max"},
            order="source",
        )
    ]


def rehydration_sections(columns: set[str]) -> list[ReportSection]:
    if "dup_count" not in columns:
        return []
    return [
        ReportSection(
            "Rehydration weights (near-duplicate cluster sizes)",
            "SELECT source, documents, clusters, largest, tokens, rehydrated_tokens FROM agg_rehydration ORDER BY source",
            columns=("source", "kept documents", "that stand for a cluster", "largest cluster", "tokens", "rehydrated tokens"),
        )
    ]
