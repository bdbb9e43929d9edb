"""Near-duplicate removal with MinHash LSH across the whole run (datasketch-compatible signatures).

Map phase: per document a MinHash signature (CJK character / Latin word shingles, see
``datapipe.dedup.shingles``), kept as the ``minhash_sig`` column, and per band key of the batch one
row (the key, its earliest document, how many have it), shuffled by key into partitions. Round 0
finds each key's *head* (its lowest row key) and sends it to the *owner* of every map output holding
the key (the partition numbered its shard modulo the partitions), asking the head's owner for its
signature; round 1's owners answer; in round 2 each owner reads its map outputs' signatures, finds
its documents under those keys and verifies each against the key's head by estimated Jaccard: the
verified (head, member) pairs are the graph, the same pairs as pairing every bucket's documents with
its earliest one in memory. Its connected components come from alternating small-star and
large-star steps (``datapipe.dedup.components``), two rounds each: every edge stays with the owner
that verified it, and a node is a row from each holder combined in its own partition, so no task
gathers a node's edges. A cluster known whole (a star every holder passed) goes to its members'
owners, which count it and ask the survivor's and the cluster's first document's owners for their
id (and the survivor's signature), and decide two rounds later: the survivor by the rule (its rank,
the length or score, travels with the edges), the others dropped with the estimated Jaccard to it.
Clusters still open after the last step (long chains of copies) are finished by the combine step
with a union-find over what is left, reading those documents' columns itself.

Rehydration: every kept document gets ``dup_count``, the size of the cluster it survived (1 for a
singleton), so a mixture can upsample by it later as FineWeb-2 does. The owners hand the survivors'
sizes to the next map segment as per-shard state (12 bytes per cluster).

Memory, per task, at any cluster size: round 0 a row per (band key, map batch) of its keys; an owner
its own map outputs' documents (one map output's signatures at a time) and their edges; a node's
partition a row per holder (at most the partitions) for each of its nodes; a survivor's owner a row
per owner that asks for it. So a cluster of ten million copies is spread over the owners of its
members like any ten million documents (``bench/scaling/minhash_cluster.py``); only the combine step, for the
rare clusters left open, holds a cluster's edges.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from datapipe.dedup.cluster import Clusters, pair_jaccard, survivors, union_of
from datapipe.dedup.components import (
    Aggregates,
    combine_partials,
    distinct_edges,
    first_small_star,
    neighbour_partials,
    node_partition,
    settled,
    star_checks,
    star_step,
)
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
from datapipe.stages.row_keys import row_keys, shard_of
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

    # Star steps (small-star first, then alternating): the first in round 2, where the edges are made,
    # then two rounds each. A cluster whose star forms in step j is known whole two rounds later and
    # decided four rounds after that (its members' owners ask for the survivor's columns and the
    # cluster's size meanwhile): pairs of copies in round 9, a chain of n copies in about 2 log2(n)
    # steps when they come in run order, the slowest case. Rounds after the last with work have no
    # tasks (the engine skips a round after one that forwarded nothing), so planning many costs
    # nothing; what is still open after the last step goes to the combine step.
    star_steps: ClassVar[int] = 24

    @classmethod
    def rounds(cls) -> int:
        """Round 0 finds each band key's head, 1 answers the heads' signatures, 2 verifies (and makes the
        first edges and steps them once); then two rounds per further star step, two that check the
        last step's stars, two that settle them, and three in which the owners decide the last
        settled clusters."""
        return 3 + 2 * (cls.star_steps - 1) + 2 + 2 + 3

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
                    *["joining clusters"] * (2 * (self.star_steps - 1)),
                    *["checking the last stars"] * 2,
                    *["settling clusters"] * 2,
                    *["deciding clusters"] * 3,
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
        """Per band key of this batch, one row: the key, its earliest document here and how many have it.
        A key shared by a million copies sends one row per batch, not a million (the head of a bucket
        is the lowest row key; the members are found again by their owners, ``_verify``)."""
        sigs = _sig_matrix(batch[SIG_COLUMN], self.options.num_perm)
        bands, rows = self.band_params()
        keys = band_keys(sigs, bands, rows)
        # Documents without shingles all share the empty signature: never cluster them.
        valid = np.flatnonzero(~empty_mask(sigs))
        flat = keys[valid].reshape(-1)  # document by document, so a key's first place is its earliest document
        distinct, first, count = np.unique(flat, return_index=True, return_counts=True)
        docs = first_row_key + valid[first // bands].astype(np.int64)
        return pa.table(
            {
                "part": pa.array(partition_of(distinct, self.partitions).astype(np.int32)),
                "key": pa.array(distinct, pa.uint64()),
                "doc": pa.array(docs, pa.int64()),
                "count": pa.array(count.astype(np.int32)),
            }
        )

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        """One round of one partition. Every row it forwards has the columns of ``_FORWARD_SCHEMA``.

        Round 0 (the band keys' partitions): each key's head, its lowest row key, sent (``HEAD``) to
        the owner of every map output holding a document with that key, and the head's signature asked
        of its owner (``ASK_SIG``). Round 1: owners answer. Round 2: each owner reads its map outputs'
        signatures, finds its documents under the heads' keys and verifies them against the heads: the
        verified (head, member) edges are the first graph, held by the member's owner. Then the star
        steps (``datapipe.dedup.components``): odd rounds combine the nodes' partials and settle the
        stars every holder passed, even rounds step the edges. A settled cluster's members go to their
        owners, which count them and ask for the survivor's and the cluster's ids (``SETTLE``, then
        ``_settle_*``), and decide two rounds later. So no task holds a cluster: a node of a million
        edges is a row from each holder, and a survivor's columns are read once per owner that asks."""
        assert inputs is not None, "owners read the map outputs"
        if round == 0:
            return PartitionResult(None, self._heads(rows))
        me = int(rows["part"][0].as_py())  # the rows of a partition all carry its number
        kind = rows["kind"].to_numpy()
        by_kind = {k: rows.filter(pa.array(kind == k)) for k in np.unique(kind).tolist()}
        empty = rows.schema.empty_table()
        got = lambda k: by_kind.get(k, empty)  # noqa: E731
        forward = [self._rows(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), LEFT)]
        forward.append(_to(got(LEFT), me))  # edges the star steps left: for the combine step
        decisions = state = None
        if round == 1:
            forward.append(self._answer_sigs(got(ASK_SIG), inputs))
            forward.append(_to(got(HEAD), me))  # for round 2, here
        elif round == 2:
            forward.append(self._verify(got(HEAD), got(SIG), inputs, me))
        elif round % 2:
            forward.append(self._answer_nodes(got(PARTIAL), got(OKP)))
            forward.append(_to(got(EDGE), me))  # stepped next round, here
        else:
            forward.append(self._step(got(EDGE), got(ANSWER), got(SETTLED), step=round // 2 - 1, me=me))
        # Settling runs beside the star steps, in the rounds after a cluster is known whole.
        forward.append(self._settle_members(got(SETTLE), me))
        forward.append(self._count(got(COUNT)))
        forward.append(_to(got(WAIT1), me, WAIT2))
        reads = self._read_for(got(ASK_DOC), got(WAIT2), inputs)
        forward.append(self._answer_docs(got(ASK_DOC), reads))
        if got(WAIT2).num_rows:
            decisions, state = self._decide(got(WAIT2), got(SIZE), got(DOC), reads)
        return PartitionResult(decisions, pa.concat_tables(forward), state)

    # -- rounds 0-2: heads, their signatures, verified edges -------------------------------------
    def _heads(self, rows: pa.Table) -> pa.Table:
        """Round 0: per key of two documents or more, its head (lowest row key) to the owner of each map
        output holding the key, and the head's signature (and rank) asked of the head's owner."""
        key, doc, count = rows["key"].to_numpy(), rows["doc"].to_numpy(), rows["count"].to_numpy()
        order = np.lexsort((doc, key))
        key, doc, count = key[order], doc[order], count[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.empty(0, np.int64)
        total = np.add.reduceat(count.astype(np.int64), starts) if len(key) else np.empty(0, np.int64)
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(key)]))
        shared = (total >= 2)[group]
        head = doc[starts][group][shared]
        key, shard = key[shared], shard_of(doc[shared])
        # One HEAD row per (key, shard): the shard's owner looks for the key among its documents.
        pairs = np.unique(np.stack([key.view(np.int64), shard, head]), axis=1)
        key_i, shard, head = pairs
        dest = (shard % self.partitions).astype(np.int32)
        out = [self._rows(dest, head, shard, HEAD, aux=key_i)]
        if self._needs_head_columns():
            asked = np.unique(np.stack([head, dest.astype(np.int64)]), axis=1)
            out.append(
                self._rows(_owner(asked[0], self.partitions), asked[0], np.zeros(asked.shape[1], np.int64), ASK_SIG, src=asked[1])
            )
        return pa.concat_tables(out)

    def _needs_head_columns(self) -> bool:
        return self.options.verify or self.options.survivor != "earliest"

    def _answer_sigs(self, asks: pa.Table, inputs: ReduceInputs) -> pa.Table:
        """Round 1: an owner's answers: each head's signature and rank, read once, to each owner that asked."""
        if not asks.num_rows:
            return self._rows(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), SIG)
        # A head is asked once per band key it heads by each owner: answer each owner once.
        node, src = np.unique(np.stack([asks["node"].to_numpy(), asks["src"].to_numpy().astype(np.int64)]), axis=1)
        docs = np.unique(node)
        table = inputs.read_rows(docs, self._rank_columns([SIG_COLUMN]))
        at = pa.array(np.searchsorted(docs, node))
        return self._rows(
            src, node, np.zeros(len(node), np.int64), SIG, sig=table[SIG_COLUMN].take(at), rank=self._ranks(table)[at.to_numpy()]
        )

    def _verify(self, heads: pa.Table, sigs: pa.Table, inputs: ReduceInputs, me: int) -> pa.Table:
        """Round 2: this owner's documents under the heads' keys, verified against their heads: the
        first edges (head, member), held here, and their nodes' partials."""
        o = self.options
        bands, rows = self.band_params()
        head_node = sigs["node"].to_numpy()
        order = np.argsort(head_node, kind="stable")
        head_node = head_node[order]
        head_sig = _sig_matrix(sigs["sig"], o.num_perm)[order] if o.verify and sigs.num_rows else None
        head_rank = sigs["rank"].to_numpy()[order]
        lo, hi, rlo, rhi = [], [], [], []
        h_shard = heads["nbr"].to_numpy()
        for shard in np.unique(h_shard).tolist():
            mine = heads.filter(pa.array(h_shard == shard))
            table = inputs.read_shard(int(shard), self._rank_columns([SIG_COLUMN]))
            shard_sigs = _sig_matrix(table[SIG_COLUMN], o.num_perm)
            valid = np.flatnonzero(~empty_mask(shard_sigs))
            keys = band_keys(shard_sigs[valid], bands, rows).reshape(-1)
            wanted = mine["aux"].to_numpy().view(np.uint64)
            by_key = np.argsort(wanted)
            wanted, head_of = wanted[by_key], mine["node"].to_numpy()[by_key]
            at = np.minimum(np.searchsorted(wanted, keys), len(wanted) - 1)
            hit = np.flatnonzero(wanted[at] == keys)
            member_row = valid[hit // bands]
            member = row_keys(int(shard), 0, table.num_rows)[member_row]
            head = head_of[at[hit]]
            keep = member != head
            member, member_row, head = member[keep], member_row[keep], head[keep]
            if o.verify and len(head):
                assert head_sig is not None  # round 0 asked for the heads' signatures
                h = np.searchsorted(head_node, head)
                similar = pair_jaccard(shard_sigs, member_row, head_sig, h) >= o.threshold
                member, member_row, head = member[similar], member_row[similar], head[similar]
            ranks = self._ranks(table)
            lo.append(head)
            hi.append(member)
            rlo.append(head_rank[np.searchsorted(head_node, head)] if len(head_node) else np.zeros(len(head)))
            rhi.append(ranks[member_row])
        ints, floats = np.empty(0, np.int64), np.empty(0, np.float64)
        edges = distinct_edges(
            *(np.concatenate([empty, *x]) for x, empty in ((lo, ints), (hi, ints), (rlo, floats), (rhi, floats)))
        )
        # Every edge of a member to a lower document is made here, by its owner: the first star step
        # (small-star) needs nothing else.
        return self._hold(*first_small_star(*edges), me)

    # -- star steps ------------------------------------------------------------------------------
    def _hold(self, lo: np.ndarray, hi: np.ndarray, rlo: np.ndarray, rhi: np.ndarray, me: int) -> pa.Table:
        """Edges this partition holds (for the next step, here) and one partial per node of them, to
        the node's partition, which answers here."""
        node, low, low_rank, high = neighbour_partials(lo, hi, rlo, rhi)
        return pa.concat_tables(
            [
                self._rows(np.full(len(lo), me, np.int32), lo, hi, EDGE, rank=rlo, rank2=rhi),
                self._rows(
                    node_partition(node, self.partitions), node, low, PARTIAL, aux=high, rank=low_rank, src=np.full(len(node), me)
                ),
            ]
        )

    def _answer_nodes(self, partials: pa.Table, checks: pa.Table) -> pa.Table:
        """Odd rounds at the nodes' partitions: each node's partials combined and answered to every
        holder that sent one; the centres every holder passed settled, told to those holders."""
        node, src = partials["node"].to_numpy(), partials["src"].to_numpy()
        n, low, low_rank, high = combine_partials(
            node, partials["nbr"].to_numpy(), partials["rank"].to_numpy(), partials["aux"].to_numpy()
        )
        asked = np.unique(np.stack([node, src]), axis=1)
        i = np.searchsorted(n, asked[0])
        out = [self._rows(asked[1], n[i], low[i], ANSWER, aux=high[i], rank=low_rank[i])]
        centre, csrc = checks["node"].to_numpy(), checks["src"].to_numpy()
        whole, survivor = settled(centre, checks["aux"].to_numpy() > 0, checks["nbr"].to_numpy(), checks["rank"].to_numpy())
        tell = np.unique(np.stack([centre, csrc]), axis=1)
        j = np.minimum(np.searchsorted(whole, tell[0]), max(len(whole) - 1, 0))
        hit = (whole[j] == tell[0]) if len(whole) else np.zeros(tell.shape[1], bool)
        out.append(self._rows(tell[1][hit], tell[0][hit], survivor[j[hit]], SETTLED))
        return pa.concat_tables(out)

    def _step(self, edges: pa.Table, answers: pa.Table, told: pa.Table, step: int, me: int) -> pa.Table:
        """Even rounds at the holders, which hold the edges after step ``step`` (from 1, the small-star
        round 2 did): the members of settled stars sent to their owners; the other edges checked (a
        star whole?) and stepped, until ``star_steps`` steps are done; then checked once more, and after
        that left for the combine step."""
        lo, hi = edges["node"].to_numpy(), edges["nbr"].to_numpy()
        rlo, rhi = edges["rank"].to_numpy(), edges["rank2"].to_numpy()
        out = []
        c, s = told["node"].to_numpy(), told["nbr"].to_numpy()
        if len(c):
            order = np.argsort(c)
            c, s = c[order], s[order]
            at = np.minimum(np.searchsorted(c, lo), len(c) - 1)
            done = c[at] == lo
            members = np.concatenate([hi[done], lo[done]])  # the leaves, and the centre (once per holder)
            centre = np.concatenate([lo[done], lo[done]])
            survivor = s[np.concatenate([at[done], at[done]])]
            trio = np.unique(np.stack([members, centre, survivor]), axis=1)
            out.append(self._rows(_owner(trio[0], self.partitions), trio[0], trio[1], SETTLE, aux=trio[2]))
            lo, hi, rlo, rhi = lo[~done], hi[~done], rlo[~done], rhi[~done]
        if step > self.star_steps:
            out.append(self._rows(np.full(len(lo), me, np.int32), lo, hi, LEFT))
            return pa.concat_tables(out)
        a = answers.sort_by("node")
        agg = Aggregates(a["node"].to_numpy(), a["nbr"].to_numpy(), a["rank"].to_numpy(), a["aux"].to_numpy())
        centre, ok, best_key, best_rank = star_checks(lo, hi, rlo, rhi, agg)
        flag = np.where(ok, 1, -1)
        out.append(
            self._rows(
                node_partition(centre, self.partitions),
                centre,
                best_key,
                OKP,
                aux=flag,
                rank=best_rank,
                src=np.full(len(centre), me),
            )
        )
        if step == self.star_steps:  # checked once more; not stepped
            out.append(self._rows(np.full(len(lo), me, np.int32), lo, hi, EDGE, rank=rlo, rank2=rhi))
        else:
            # the edges after step ``step`` (round 2 made them after the first, a small-star): alternate
            out.append(self._hold(*star_step(lo, hi, rlo, rhi, agg, large=step % 2 == 1), me))
        return pa.concat_tables(out)

    # -- settling: the owners decide ---------------------------------------------------------------
    def _settle_members(self, settle: pa.Table, me: int) -> pa.Table:
        """A settled cluster's members at their owner: counted for the cluster's partition, the
        survivor's id and signature and the cluster's id asked of their owners, once per owner."""
        v, c, s = np.unique(np.stack([settle[k].to_numpy() for k in ("node", "nbr", "aux")]), axis=1)
        clusters, count = np.unique(c, return_counts=True)
        out = [
            self._rows(
                node_partition(clusters, self.partitions),
                clusters,
                np.zeros(len(clusters), np.int64),
                COUNT,
                aux=count,
                src=np.full(len(clusters), me),
            )
        ]
        # Ask for each survivor's id and signature (aux 1) and each other cluster root's id (aux 0).
        ask = np.concatenate([s, c[c != s]])
        need_sig = np.concatenate([np.ones(len(s), np.int64), np.zeros(int((c != s).sum()), np.int64)])
        order = np.lexsort((-need_sig, ask))
        ask, need_sig = ask[order], need_sig[order]
        first = np.r_[True, ask[1:] != ask[:-1]] if len(ask) else np.empty(0, bool)
        ask, need_sig = ask[first], need_sig[first]
        out.append(
            self._rows(
                _owner(ask, self.partitions), ask, np.zeros(len(ask), np.int64), ASK_DOC, aux=need_sig, src=np.full(len(ask), me)
            )
        )
        out.append(self._rows(np.full(len(v), me, np.int32), v, c, WAIT1, aux=s))
        return pa.concat_tables(out)

    def _count(self, counts: pa.Table) -> pa.Table:
        """A cluster's size, from its members' owners' counts, answered to each of them."""
        c, src, n = counts["node"].to_numpy(), counts["src"].to_numpy(), counts["aux"].to_numpy()
        order = np.argsort(c, kind="stable")
        c, src, n = c[order], src[order], n[order]
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]]) if len(c) else np.empty(0, np.int64)
        size = np.add.reduceat(n, starts) if len(c) else np.empty(0, np.int64)
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(c)]))
        return self._rows(src, c, np.zeros(len(c), np.int64), SIZE, aux=size[group] if len(c) else n)

    def _read_for(self, asks: pa.Table, waiting: pa.Table, inputs: ReduceInputs) -> pa.Table | None:
        """The one read of this round's owner work: the asked documents' id and signature, and those of
        the members it decides (not the survivors: they are kept)."""
        want = [asks["node"].to_numpy()]
        if waiting.num_rows:
            v, s = waiting["node"].to_numpy(), waiting["aux"].to_numpy()
            want.append(v[v != s])
        docs = np.unique(np.concatenate(want))
        if not len(docs):
            return None
        table = inputs.read_rows(docs, ["id", SIG_COLUMN])
        return table.append_column("node", pa.array(docs))

    def _answer_docs(self, asks: pa.Table, read: pa.Table | None) -> pa.Table:
        """Owners answer the asked documents' id (and signature, for a survivor) to each owner that asked."""
        if not asks.num_rows or read is None:
            return self._rows(np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), DOC)
        node, src, need_sig = asks["node"].to_numpy(), asks["src"].to_numpy(), asks["aux"].to_numpy()
        at = np.searchsorted(read["node"].to_numpy(), node)
        # Only the asks that need a signature take one (a null index takes a null): taking every ask's
        # 512 bytes and masking after held them all at once (shuffle1r9's peak at a crawl's proportions).
        sig = read[SIG_COLUMN].take(pa.array(at, mask=need_sig != 1))
        return self._rows(src, node, np.zeros(len(node), np.int64), DOC, id=read["id"].take(pa.array(at)), sig=sig)

    def _decide(self, waiting: pa.Table, sizes: pa.Table, docs: pa.Table, read: pa.Table | None) -> tuple[pa.Table, pa.Table]:
        """The decisions of this owner's members of settled clusters, and the survivors' sizes."""
        o = self.options
        v, c, s = waiting["node"].to_numpy(), waiting["nbr"].to_numpy(), waiting["aux"].to_numpy()
        size_of = dict(zip(sizes["node"].to_pylist(), sizes["aux"].to_pylist()))
        size = np.array([size_of[x] for x in c.tolist()], np.int64)
        kept = v == s
        state = _sizes(v[kept], size[kept])
        d = docs.sort_by("node")
        dnode = d["node"].to_numpy()
        ids = np.asarray(d["id"].to_pylist(), dtype=object)
        dup = np.flatnonzero(~kept)
        v, c, s, size = v[dup], c[dup], s[dup], size[dup]
        if not len(v):
            return _decisions(v, [], [], s, [], [], []), state
        assert read is not None
        mine = read.sort_by("node")
        mi = np.searchsorted(mine["node"].to_numpy(), v)
        si = np.searchsorted(dnode, s)
        member_sig = _sig_matrix(mine[SIG_COLUMN], o.num_perm)[mi]
        survivor_sig = _sig_matrix(d["sig"].take(pa.array(si)), o.num_perm)
        similarity = (member_sig == survivor_sig).mean(axis=1)
        member_ids = np.asarray(mine["id"].to_pylist(), dtype=object)[mi]
        return _decisions(
            v,
            member_ids.tolist(),
            ids[si].tolist(),
            s,
            ids[np.searchsorted(dnode, c)].tolist(),
            size.tolist(),
            similarity.tolist(),
        ), state

    def _doc_columns(self) -> list[str]:
        o = self.options
        return ["id", SIG_COLUMN, "n_chars"] + ([o.score_column] if o.survivor == "best" and o.score_column else [])

    # -- rows -------------------------------------------------------------------------------------
    def _rank_columns(self, columns: list[str]) -> list[str]:
        o = self.options
        if o.survivor == "longest":
            return [*columns, "n_chars"]
        if o.survivor == "best" and o.score_column:
            return [*columns, o.score_column]
        return columns

    def _ranks(self, table: pa.Table) -> np.ndarray:
        """The survivor rule's order as one float64 per document, higher first (ties: lower row key):
        the length for ``longest``, the score for ``best`` (missing: last), 0 for ``earliest``."""
        o = self.options
        if o.survivor == "longest":
            return table["n_chars"].to_numpy(zero_copy_only=False).astype(np.float64)
        if o.survivor == "best" and o.score_column:
            scores = table[o.score_column].to_numpy(zero_copy_only=False).astype(np.float64)
            return np.nan_to_num(scores, nan=-np.inf)
        return np.zeros(table.num_rows, np.float64)

    def _rows(self, part: np.ndarray, node: np.ndarray, nbr: np.ndarray, kind: int, **columns: Any) -> pa.Table:
        """Forwarded rows: (part, kind, node, nbr) and the given columns (zero, or null for id and
        sig, where not given), one schema for every round so a round's files read as one table."""
        n = len(node)
        values: dict[str, Any] = {
            "part": pa.array(np.asarray(part, np.int32), pa.int32()),
            "kind": pa.array(np.full(n, kind, np.int8), pa.int8()),
            "node": pa.array(np.asarray(node, np.int64), pa.int64()),
            "nbr": pa.array(np.asarray(nbr, np.int64), pa.int64()),
        }
        for field in _FORWARD_SCHEMA:
            if field.name in values:
                continue
            given = columns.get(field.name)
            if given is None:
                values[field.name] = (
                    pa.nulls(n, field.type)
                    if field.name in ("sig", "id")
                    else pa.array(np.zeros(n, field.type.to_pandas_dtype()), field.type)
                )
            elif isinstance(given, np.ndarray):
                values[field.name] = pa.array(given.astype(field.type.to_pandas_dtype()), field.type)
            else:
                values[field.name] = _one_chunk(given).cast(field.type)
        return pa.table(values, schema=_FORWARD_SCHEMA)

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
        edge = rows["kind"].to_numpy() == LEFT
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


# Row kinds of the forwarded rows (what each is for: ``reduce_partition``).
HEAD, ASK_SIG, SIG, EDGE, PARTIAL, ANSWER, OKP, SETTLED, SETTLE, COUNT, SIZE, ASK_DOC, DOC, WAIT1, WAIT2, LEFT = range(16)
# One schema for every forwarded row: part and kind, two row keys (node, nbr), then what a kind needs:
# aux (a key, a count, a flag, a row key), src (the partition to answer), two ranks, a signature and
# an id. The signature is variable-width binary so that the rows without one cost 4 bytes, not 512.
_FORWARD_SCHEMA = pa.schema(
    [
        ("part", pa.int32()),
        ("kind", pa.int8()),
        ("node", pa.int64()),
        ("nbr", pa.int64()),
        ("aux", pa.int64()),
        ("src", pa.int32()),
        ("rank", pa.float64()),
        ("rank2", pa.float64()),
        ("sig", pa.binary()),
        ("id", pa.string()),
    ]
)


def _to(rows: pa.Table, part: int, kind: int | None = None) -> pa.Table:
    """Rows sent to partition ``part`` (this one's own: carried to the next round), as ``kind`` if given."""
    rows = rows.set_column(0, "part", pa.array(np.full(rows.num_rows, part, np.int32)))
    if kind is not None:
        rows = rows.set_column(1, "kind", pa.array(np.full(rows.num_rows, kind, np.int8)))
    return rows


def _owner(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition that answers for each row key's map output: its shard modulo the partitions, so
    each map output has one reader per answering round and the owners share the map outputs evenly."""
    return (shard_of(keys) % partitions).astype(np.int32)


def _one_chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _sig_matrix(column: pa.ChunkedArray | pa.Array, num_perm: int) -> np.ndarray:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_fixed_size_binary(arr.type):  # a forwarded signature (variable-width binary)
        arr = arr.cast(pa.binary(4 * num_perm))
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
