"""Exact repeated spans across the whole run (Lee et al. 2022's ExactSubstr), CJK-aware, partitioned.

Every span of at least ``min_tokens`` tokens (words; single Han/kana characters in CJK text; over
the shingles' normalisation, Traditional folded to Simplified: ``datapipe.dedup.substrings``) that
occurs in two or more documents is cut from every document but the earliest (run order, the order
minhash keeps its survivors by), or from all of them with ``keep: none``.

Definition (what ``tests/dedup/test_substrings.py``'s brute-force reference computes): a window
of ``min_tokens`` tokens of document d is *repeated* when the same normalised tokens occur in an
earlier document (``keep: first``) or in any other document (``keep: none``); the tokens of d's
repeated windows are removed, each maximal run of them as one cut from the first character of its
first token to the last character of its last (separators between its tokens go with it, those
around it stay). Repeats inside one document alone are kept.

Steps (a ``PartitionStep`` of five rounds; every round reads only its partition's rows, and the
rounds that need text read the map outputs of their own shards, a few hundred documents at a time):

0. by anchor hash: the map phase emits each document's winnowed anchors (``anchors``: about 7% of
   its positions at min_tokens 50); a hash seen in two documents makes its occurrences candidates,
   forwarded to the partition of their document's shard.
1. by shard: each candidate document is tokenised again and every min_tokens window of its
   candidate regions hashed (``regions``: they contain every window it shares, see the proof in
   ``datapipe.dedup.substrings``), forwarded by window hash.
2. by window hash: a hash in two or more documents gives each occurrence to be cut a *claim*
   against the earliest document holding the hash (with ``keep: none``, the earliest one against
   the second), forwarded to the partition of the claimed source's shard.
3. by source shard: consecutive claims become runs; the source's normalised tokens of each run
   are forwarded, as text, to the partition of the claiming document's shard.
4. by document shard: each run is confirmed token by token against the document's own tokens (a
   hash collision never cuts text); the confirmed windows' tokens are mapped back to character
   spans, handed to ``apply`` as per-shard state.

``apply`` (next map segment) cuts the spans and records ``substr_spans_removed``,
``substr_chars_removed`` and the first ``max_recorded_spans`` removed spans; a document left shorter
than ``min_chars_after`` is rejected as ``substring_only`` with its original text.

Memory per task: round 0 holds its share of the anchors (24 bytes each, about 2 per 27 tokens /
partitions); rounds 1-4 hold their share of candidates, windows, claims or runs (all of them
proportional to the repeated text, not the corpus) and a few hundred documents' texts at a time. The state a map
task loads is its own shard's spans.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.dedup.minhash import partition_of
from datapipe.dedup.substrings import Tokens, anchors, regions, removed_token_spans, tokenize, window_hashes
from datapipe.stages.base import CheckContext, Decision, Problem, Resources, StageOptions, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import GlobalStage, GlobalStep, PartitionResult, PartitionStep, ReduceInputs, state_rows
from datapipe.stages.report_section import Aggregate, ReportSection, column
from datapipe.stages.row_keys import shard_of
from datapipe.stages.steps import Partitions, partitions_option

# Lee et al. (2022) remove repeats of 50 BPE tokens or more; 50 words or Han characters is
# somewhat longer text. Below 8 tokens, idioms and set phrases ("for more information, see the")
# would go from every document but one.
DEFAULT_MIN_TOKENS = 50
MIN_MIN_TOKENS = 8
REMOVED_SPAN_CHARS = 200  # each recorded span is cut to this many characters
REMOVED_TYPE = pa.list_(pa.string())
ROUNDS = 5
READ_DOCS = 256  # documents a round reads at once
TOKENIZE_CHARS = 1 << 20  # characters a round tokenises at once (about 50 bytes each while it does)
REASON = "substring_only"


class SubstringsOptions(StageOptions):
    min_tokens: int = Field(
        DEFAULT_MIN_TOKENS,
        ge=MIN_MIN_TOKENS,
        le=100_000,
        description="Shortest repeated span removed, in tokens (words; single Han/kana characters in CJK text).",
    )
    keep: Literal["first", "none"] = Field(
        "first", description="Keep a repeated span in the earliest document (run order) that has it, or in none."
    )
    min_chars_after: int = Field(
        50,
        ge=0,
        description="Drop a document left shorter than this (substring_only); only documents that lost a span are judged.",
    )
    max_recorded_spans: int = Field(16, ge=0, le=1000, description="Removed spans recorded per document (substr_removed).")
    fold_script: bool = Field(True, description="Fold Traditional to Simplified characters, so a copy across scripts repeats.")
    kinds: list[str] = Field(["web", "text"], description="Source kinds it applies to (code keeps its license headers).")
    partitions: Partitions = partitions_option("Parallel tasks of each shuffle round")


class Substrings(GlobalStage):
    name = "substrings"
    summary = "cuts exact spans of 50+ tokens repeated across documents (Lee et al. 2022), CJK-aware"
    signals = "`substr_spans_removed`, `substr_chars_removed`, `substr_removed` (the spans it cut)"
    reasons = ("substring_only",)
    Options = SubstringsOptions
    resources = Resources(num_cpus=1, memory_mb=1024)

    def edits(self) -> dict[str, str]:
        return {"substr_spans_removed": "repeated spans removed", "substr_chars_removed": "chars removed"}

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        return kinds_problems(options.kinds)

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return substrings_aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return substrings_sections(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return {"substr_spans_removed", "substr_chars_removed", "substr_removed"}

    @classmethod
    def audit_views(cls, columns: set[str]) -> dict[str, str]:
        """``removed_spans``: one row per recorded removed span (id, source, lang, span), for GROUP BY."""
        lang = "lang" if "lang" in columns else "NULL::VARCHAR AS lang"
        return {
            "removed_spans": f"SELECT id, source, {lang}, unnest(substr_removed) AS span FROM documents "
            "WHERE len(substr_removed) > 0"
        }

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def steps(self) -> tuple[GlobalStep, ...]:
        """Five rounds; the last hands ``apply`` its spans as per-shard state (no decisions: apply decides)."""
        names = ("finding shared anchors", "hashing windows", "claiming copies", "joining runs", "confirming spans")
        return (
            PartitionStep(self.partitions, self.shuffle, self.reduce_partition, rounds=ROUNDS, decides=True, round_names=names),
        )

    # -- map phase -----------------------------------------------------------------------------

    def _applies(self, batch: pa.Table) -> np.ndarray:
        return pc.is_in(batch["kind"], value_set=pa.array(self.options.kinds or [""])).to_numpy(zero_copy_only=False)

    def _tokenize(self, texts: list[str | None]) -> Tokens:
        return tokenize([t or "" for t in texts], self.options.fold_script)

    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        rows = np.flatnonzero(self._applies(batch))
        toks = self._tokenize(batch["text"].take(pa.array(rows, pa.int64())).to_pylist())
        doc, pos, hashes = anchors(toks, self.options.min_tokens)
        return pa.table(
            {
                "part": pa.array(partition_of(hashes, self.partitions).astype(np.int32)),
                "key": pa.array(hashes, pa.uint64()),
                "doc": pa.array(rows[doc] + first_row_key, pa.int64()),
                "pos": pa.array(pos, pa.int64()),
            }
        )

    # -- the rounds ----------------------------------------------------------------------------

    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        assert inputs is not None, "rounds 1, 3 and 4 read texts from the map outputs"
        return (self._candidates, self._windows, self._claims, self._runs, self._confirm)[round](rows, inputs)

    def _by_shard(self, docs: np.ndarray) -> np.ndarray:
        return (shard_of(docs) % self.partitions).astype(np.int32)

    def _candidates(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 0: occurrences of anchor hashes that two or more documents hold."""
        key, doc, pos = rows["key"].to_numpy(), rows["doc"].to_numpy(), rows["pos"].to_numpy()
        order = np.lexsort((pos, doc, key))
        key, doc, pos = key[order], doc[order], pos[order]
        group = _starts(key)
        new_doc = group | _starts(doc)
        shared = (np.add.reduceat(new_doc.astype(np.int64), np.flatnonzero(group)) >= 2) if len(key) else np.empty(0, bool)
        hit = np.repeat(shared, np.diff(np.r_[np.flatnonzero(group), len(key)]))
        doc, pos = doc[hit], pos[hit]
        return PartitionResult(None, _table(part=self._by_shard(doc), doc=doc, pos=pos))

    def _windows(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 1: hashes of every min_tokens window in the candidate regions of this partition's documents."""
        n = self.options.min_tokens
        doc, pos = rows["doc"].to_numpy(), rows["pos"].to_numpy()
        order = np.lexsort((pos, doc))
        doc, pos = doc[order], pos[order]
        out_key, out_doc, out_pos = [], [], []
        for keys, toks, groups in self._documents(doc, inputs):
            for i, (lo, hi) in enumerate(groups):
                starts = regions(np.unique(pos[lo:hi]), toks.count(i), n)
                if len(starts):
                    out_key.append(window_hashes(toks, i, n)[starts])
                    out_doc.append(np.full(len(starts), keys[i], np.int64))
                    out_pos.append(starts)
        key = _cat(out_key, np.uint64)
        return PartitionResult(
            None,
            _table(part=partition_of(key, self.partitions).astype(np.int32), key=key, doc=_cat(out_doc), pos=_cat(out_pos)),
        )

    def _claims(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 2: each occurrence to be cut claims the earliest document holding its window hash
        (``keep: none``: the earliest one claims the second)."""
        key, doc, pos = rows["key"].to_numpy(), rows["doc"].to_numpy(), rows["pos"].to_numpy()
        order = np.lexsort((pos, doc, key))
        key, doc, pos = key[order], doc[order], pos[order]
        group = _starts(key)
        new_doc = group | _starts(doc)
        g = np.cumsum(group) - 1  # group index of each row
        first = np.flatnonzero(group)
        n_docs = np.add.reduceat(new_doc.astype(np.int64), first) if len(key) else np.empty(0, np.int64)
        shared = n_docs[g] >= 2
        src, src_pos = doc[first][g], pos[first][g]
        if self.options.keep == "none":
            # the second document of each group: the first row of the group's second distinct doc
            second = np.flatnonzero(new_doc & ~group)
            sec_of_group = np.full(len(first), -1, np.int64)
            sg = g[second]
            keep_first_seen = np.r_[True, sg[1:] != sg[:-1]] if len(sg) else np.empty(0, bool)
            sec_of_group[sg[keep_first_seen]] = second[keep_first_seen]
            own = doc == src
            s = sec_of_group[g]
            src = np.where(own & (s >= 0), doc[np.maximum(s, 0)], src)
            src_pos = np.where(own & (s >= 0), pos[np.maximum(s, 0)], src_pos)
        cut = shared & (doc != src)
        doc, pos, src, src_pos = doc[cut], pos[cut], src[cut], src_pos[cut]
        return PartitionResult(None, _table(part=self._by_shard(src), doc=doc, pos=pos, src=src, src_pos=src_pos))

    def _runs(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 3: consecutive claims on the same source as runs, with the source's tokens of each run."""
        n = self.options.min_tokens
        doc, pos = rows["doc"].to_numpy(), rows["pos"].to_numpy()
        src, src_pos = rows["src"].to_numpy(), rows["src_pos"].to_numpy()
        diag = pos - src_pos
        order = np.lexsort((pos, diag, src, doc))
        doc, pos, src, src_pos, diag = doc[order], pos[order], src[order], src_pos[order], diag[order]
        brk = _starts(doc) | _starts(src) | _starts(diag) | np.r_[True, pos[1:] != pos[:-1] + 1]
        begin = np.flatnonzero(brk)
        length = np.diff(np.r_[begin, len(doc)])  # windows per run
        r_doc, r_pos, r_src, r_src_pos = doc[begin], pos[begin], src[begin], src_pos[begin]
        texts: list[str | None] = [None] * len(begin)
        by_src = np.argsort(r_src, kind="stable")
        for _keys, toks, groups in self._documents(r_src[by_src], inputs):
            for i, (lo, hi) in enumerate(groups):
                for j in range(lo, hi):
                    run = by_src[j]
                    a = int(r_src_pos[run])
                    texts[run] = " ".join(toks.strings(i, a, a + int(length[run]) + n - 1))
        return PartitionResult(
            None,
            pa.table(
                {
                    "part": pa.array(self._by_shard(r_doc)),
                    "doc": pa.array(r_doc, pa.int64()),
                    "pos": pa.array(r_pos, pa.int64()),
                    "tokens": pa.array(texts, pa.large_string()),
                }
            ),
        )

    def _confirm(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 4: runs confirmed on the document's own tokens; confirmed windows as character spans."""
        n = self.options.min_tokens
        order = np.lexsort((rows["pos"].to_numpy(), rows["doc"].to_numpy()))
        rows = rows.take(pa.array(order))
        tokens = rows["tokens"].to_pylist()
        run_pos = rows["pos"].to_numpy()
        out_key, out_start, out_end = [], [], []
        for keys, toks, groups in self._documents(rows["doc"].to_numpy(), inputs):
            for i, (lo, hi) in enumerate(groups):
                windows = []
                for j in range(lo, hi):
                    theirs = tokens[j].split(" ")
                    a = int(run_pos[j])
                    ours = toks.strings(i, a, min(a + len(theirs), toks.count(i)))
                    same = np.fromiter((x == y for x, y in zip(ours, theirs)), bool, len(ours))
                    if len(same) < len(theirs):
                        continue  # cannot happen for an unchanged map output; never cut on doubt
                    # window s of the run is confirmed when its n tokens are all equal
                    bad = np.r_[0, np.cumsum(~same)]
                    ok = np.flatnonzero(bad[n:] - bad[:-n] == 0)
                    windows.append(ok + a)
                if not windows:
                    continue
                base = int(toks.tok_off[i])
                for s, e in removed_token_spans(np.unique(np.concatenate(windows)), n):
                    out_key.append(keys[i])
                    out_start.append(int(toks.char_start[base + s]))
                    out_end.append(int(toks.char_end[base + e - 1]))
        keys_arr = np.array(out_key, np.int64)
        state = state_rows(keys_arr, start=pa.array(out_start, pa.int64()), end=pa.array(out_end, pa.int64()))
        return PartitionResult(None, None, state)

    def _documents(self, doc: np.ndarray, inputs: ReduceInputs) -> Iterator[tuple[np.ndarray, Tokens, list[tuple[int, int]]]]:
        """The documents of ``doc`` (row keys, sorted), a few at a time (at most ``READ_DOCS`` documents
        of one shard, ``TOKENIZE_CHARS`` characters): (their row keys, their tokens, each one's [lo, hi)
        range in ``doc``). Tokenising costs about 50 bytes per character: in chunks, a task's memory
        does not depend on how many of its shard's documents repeat something, nor on their lengths."""
        if len(doc) == 0:
            return
        starts = np.flatnonzero(_starts(doc))
        bounds = np.r_[starts, len(doc)]
        keys = doc[starts]
        shards = shard_of(keys)
        for sh in np.unique(shards):
            of_shard = np.flatnonzero(shards == sh)
            for c in range(0, len(of_shard), READ_DOCS):
                chunk = of_shard[c : c + READ_DOCS]
                texts = [t or "" for t in inputs.read_rows(keys[chunk], ["text"])["text"].to_pylist()]
                # tokenised at most TOKENIZE_CHARS characters at a time (one longer document alone)
                ends = np.cumsum([len(t) for t in texts])
                lo = 0
                while lo < len(texts):
                    hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + TOKENIZE_CHARS, side="right")))
                    idx = chunk[lo:hi]
                    yield keys[idx], self._tokenize(texts[lo:hi]), [(int(bounds[j]), int(bounds[j + 1])) for j in idx]
                    lo = hi

    # -- next map segment ----------------------------------------------------------------------

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        o = self.options
        n = batch.num_rows
        texts = batch["text"].to_pylist()
        new_texts: list[str | None] = list(texts)
        spans_removed = np.zeros(n, np.int64)
        chars_removed = np.zeros(n, np.int64)
        recorded: list[list[str] | None] = [None] * n
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        if state is not None and state.num_rows:
            state = state.sort_by([("row_key", "ascending"), ("start", "ascending")])
            keys = state["row_key"].to_numpy()
            starts, ends = state["start"].to_numpy(), state["end"].to_numpy()
            where = np.searchsorted(np.asarray(row_keys, np.int64), keys)
            found = (where < n) & (np.asarray(row_keys, np.int64)[np.minimum(where, n - 1)] == keys)
            idx = np.flatnonzero(found)
            bounds = np.flatnonzero(np.r_[True, keys[idx][1:] != keys[idx][:-1]]) if len(idx) else np.empty(0, np.int64)
            for lo, hi in zip(bounds, np.r_[bounds[1:], len(idx)]):
                i = int(where[idx[lo]])
                text = texts[i] or ""
                cuts = [(int(starts[j]), int(ends[j])) for j in idx[lo:hi]]
                pieces, removed, at = [], [], 0
                for s, e in cuts:
                    pieces.append(text[at:s])
                    removed.append(text[s:e])
                    at = e
                pieces.append(text[at:])
                left = "".join(pieces)
                spans_removed[i] = len(cuts)
                chars_removed[i] = len(text) - len(left)
                recorded[i] = [r[:REMOVED_SPAN_CHARS] for r in removed[: o.max_recorded_spans]]
                if len(left.strip()) < o.min_chars_after:
                    reason[i] = REASON
                    detail[i] = (
                        f"{len(cuts)} spans of >= {o.min_tokens} tokens repeated in other documents removed, "
                        f"{len(left.strip())} characters left < min_chars_after {o.min_chars_after}"
                    )
                else:
                    new_texts[i] = left  # a dropped document keeps its original text in rejected/
        batch = set_column(batch, "text", pa.array(new_texts, pa.string()))
        if "n_chars" in batch.column_names:  # the length of what is kept, as every later stage sees it
            batch = set_column(batch, "n_chars", pa.array([len(t) if t is not None else 0 for t in new_texts], pa.int64()))
        skipped = ~self._applies(batch)  # null, not 0, for documents of kinds the stage does not judge
        batch = set_column(batch, "substr_spans_removed", pa.array(spans_removed, mask=skipped))
        batch = set_column(batch, "substr_chars_removed", pa.array(chars_removed, mask=skipped))
        batch = set_column(batch, "substr_removed", pa.array(recorded, REMOVED_TYPE))
        return batch, Decision(pa.array(reason, pa.string()), pa.array(detail, pa.string()))


def _starts(values: np.ndarray) -> np.ndarray:
    """True where a sorted array's value differs from the one before (and at 0)."""
    if len(values) == 0:
        return np.empty(0, bool)
    return np.r_[True, values[1:] != values[:-1]]


def _cat(parts: list[np.ndarray], dtype: Any = np.int64) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _table(**columns: np.ndarray) -> pa.Table:
    types = {"part": pa.int32(), "key": pa.uint64()}
    return pa.table({name: pa.array(col, types.get(name, pa.int64())) for name, col in columns.items()})


# --- the audit: what the stage removed, per source and language, and the spans removed most often ------


def substrings_aggregates(columns: set[str]) -> list[Aggregate]:
    if "substr_chars_removed" not in columns:
        per_source = ""
        spans = ""
    else:
        # n_chars is the length after removal, except on a substring_only reject, which kept what came in.
        reason = column(columns, "reason")  # a task that rejected nothing has no such column
        per_source = f"""SELECT {column(columns, "source")} AS source, coalesce({column(columns, "lang")}, 'unknown') AS lang,
                   count(*) FILTER (substr_chars_removed IS NOT NULL) AS documents,
                   count(*) FILTER (substr_spans_removed > 0) AS changed,
                   coalesce(sum(substr_spans_removed), 0)::BIGINT AS spans_removed,
                   coalesce(sum(substr_chars_removed), 0)::BIGINT AS chars_removed,
                   coalesce(sum(n_chars + CASE WHEN {reason} = 'substring_only' THEN 0 ELSE coalesce(substr_chars_removed, 0) END)
                            FILTER (substr_chars_removed IS NOT NULL), 0)::BIGINT AS chars_before,
                   count(*) FILTER ({reason} = 'substring_only') AS only_substrings
            FROM documents GROUP BY ALL"""
        spans = """SELECT left(trim(span), 100) AS span, count(*) AS documents
                   FROM (SELECT unnest(substr_removed) AS span FROM documents) GROUP BY 1"""
    values = ("documents", "changed", "spans_removed", "chars_removed", "chars_before", "only_substrings")
    return [
        Aggregate(
            "substrings",
            per_source,
            (("source", "VARCHAR"), ("lang", "VARCHAR"), *((v, "BIGINT") for v in values)),
            merge=dict.fromkeys(values, "sum"),
            order="source, lang",
        ),
        Aggregate(
            "substring_spans",
            spans,
            (("span", "VARCHAR"), ("documents", "BIGINT")),
            merge={"documents": "sum"},
            order="documents DESC, span",
            limit=1000,
        ),
    ]


def substrings_sections(columns: set[str]) -> list[ReportSection]:
    if "substr_chars_removed" not in columns:
        return []
    return [
        ReportSection(
            "Repeated spans removed",
            """SELECT source, lang, documents, changed, spans_removed, chars_removed,
                      round(chars_removed / nullif(chars_before, 0), 4), only_substrings
               FROM agg_substrings WHERE documents > 0 ORDER BY source, lang""",
            columns=(
                "source",
                "lang",
                "documents",
                "that lost spans",
                "spans removed",
                "characters removed",
                "share of characters",
                "dropped as substring only",
            ),
        ),
        ReportSection(
            "",
            "SELECT span, documents FROM agg_substring_spans ORDER BY documents DESC, span LIMIT 15",
            columns=("most removed span (first 100 characters)", "documents"),
        ),
    ]
