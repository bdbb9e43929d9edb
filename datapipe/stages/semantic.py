"""Meaning-level near-duplicates (SemDeDup, Abbas et al. 2023): embed, k-means, pairwise cosine.

Documents are embedded by a local model folder (``model``: a model2vec or sentence-transformers
static-embedding model, a WordLlama export or a Hugging Face encoder; ``datapipe.dedup.embed_models``)
or, without one, by fastText sentence vectors trained on the run's own text. The stage is one partition step in three rounds:

* map (``shuffle``): every document with text is sent to the partition of its row key; each batch
  also sends the documents with the ``sample`` lowest hashes of their row key to partition 0 (so
  partition 0 gets a superset of the run's seeded sample, whatever the batches).
* round 0: partition 0 takes the sample (the ``sample`` lowest hashes), trains fastText on its text
  when there is no model (saved in the run folder's scratch space), embeds it and trains k-means
  (``datapipe.dedup.semantic.kmeans``), and forwards the centroids to every partition; every
  partition forwards its documents to itself.
* round 1: each partition embeds its documents (the text read back from the map outputs; the model
  loaded once per worker), assigns each to its nearest centroid and forwards (document, vector) to
  the partition of the k-means cluster.
* round 2: per k-means cluster, exact pairwise cosine (blocked matrix product), then SemDeDup's
  rule: the documents of the pairs at or above ``threshold`` walked in keep order (the survivor rule,
  as minhash's: ``earliest``, ``longest``, ``best``), each dropped as ``near_semantic`` only when it
  is that close to a document already *kept*, with ``dup_of`` (that kept document's id, the closest
  one), ``dup_cluster`` (the same: the kept document and those dropped for it) and
  ``semantic_similarity`` (its cosine to it). A document close only to dropped ones is kept: no
  chain of close pairs removes a document for one it is not close to.

Pairs split by k-means are never compared (SemDeDup's trade), so each k-means cluster is decided by
one partition.
Memory: partition 0 holds the sample's vectors; a round-2 task holds its clusters' vectors and one
block x cluster-size similarity matrix at a time.

Where: the CPU (numpy and its BLAS) by default, a GPU with torch where the node has one (``device``:
``auto``; the rounds then ask Ray for ``num_gpus`` of one, ``step_resources``): k-means, the
assignment and the pairwise cosine run there, with the same decisions (``datapipe.dedup.semantic``).
Embedding stays on the CPU: a static model is a table look-up and a mean, fastText has no GPU code.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.dedup.components import node_partition
from datapipe.stages.base import CheckContext, Problem, ResourceFile, Resources, StageOptions
from datapipe.stages.global_stage import GlobalStage, GlobalStep, PartitionResult, PartitionStep, ReduceInputs, drop_rows
from datapipe.stages.report_section import Aggregate, ReportSection
from datapipe.stages.steps import Partitions, partitions_option

REASON = "near_semantic"
DOC, CENTROID = 0, 1  # row kinds of round 0's input and output
_EMBED_CHUNK = 2048  # documents read and embedded at a time in round 1
# bench/quality/semantic_eval.py (bench/results/semantic_eval.json): the bag-of-words static model
# has no unrelated pair of 10,000 above 0.8; the fastText vectors trained on the run's own text put
# unrelated documents up to FASTTEXT_UNRELATED_MAX (two Chinese Wikipedia articles on two fish
# species from one template, on 2,000 held-out clean documents after exact and MinHash dedup: the
# one clean document the stage dropped at 0.99), so the default for them is above that.
DEFAULT_THRESHOLD, DEFAULT_FASTTEXT_THRESHOLD = 0.9, 0.995
FASTTEXT_UNRELATED_MAX = 0.993


class SemanticOptions(StageOptions):
    model: str | None = Field(
        None,
        description=(
            "Folder of an embedding model, relative to the pipeline file: a static-embedding model (model2vec, "
            "or a sentence-transformers StaticEmbedding export), a WordLlama export, or a Hugging Face encoder "
            "(its kind found from its files, or given by model_kind). Omitted: fastText sentence vectors "
            "trained on the run's own text (the sample)."
        ),
    )
    model_kind: Literal["auto", "model2vec", "wordllama", "transformers"] = Field(
        "auto",
        description=(
            "What the model folder is: auto finds it from the folder's files; model2vec (static embeddings, "
            "also sentence-transformers StaticEmbedding), wordllama or transformers (a Hugging Face encoder, "
            "mean-pooled; needs torch and transformers) names it."
        ),
    )
    max_tokens: int | None = Field(
        None,
        ge=2,
        description="transformers: tokens of each document the encoder reads, special tokens included "
        "(default 512, or fewer where the model has fewer positions).",
    )
    batch_size: int | None = Field(None, ge=1, le=4096, description="transformers: documents per forward pass (default 32).")
    threshold: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description=(
            "Cosine similarity at or above which two documents are near-duplicates. Default: 0.9 with a "
            "model, 0.995 for the fastText vectors trained without one (their unrelated pairs reach higher; "
            "see the stage's page)."
        ),
    )
    clusters: int = Field(
        64, ge=1, le=65536, description="k-means clusters; pairs are only compared within one (at most sample / 4 are used)."
    )
    sample: int = Field(
        20_000, ge=16, le=5_000_000, description="Documents (a seeded sample) k-means and fastText are trained on."
    )
    iterations: int = Field(20, ge=1, le=500, description="Lloyd iterations of k-means (it stops earlier when it has converged).")
    seed: int = Field(0, ge=0, description="Seed of the sample, the k-means start and fastText.")
    survivor: Literal["earliest", "longest", "best"] = Field(
        "earliest", description="Which document of a component to keep (as minhash)."
    )
    score_column: str | None = Field(None, description="Signal column for survivor: best (higher is better).")
    partitions: Partitions = partitions_option("Parallel tasks of each round")
    fold_script: bool = Field(
        False,
        description=(
            "Fold Traditional to Simplified characters before embedding (as minhash's fold_script), "
            "so a copy in the other script is a near-duplicate."
        ),
    )
    fasttext_dim: int = Field(64, ge=8, le=512, description="Vector size of the fastText model trained when there is no model.")
    fasttext_epoch: int = Field(5, ge=1, le=100, description="Training epochs of that fastText model.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description=(
            "Where k-means and the pairwise cosine run: auto (a GPU with torch where the node has one, else "
            "the CPU), cpu (numpy; no torch needed), or cuda (a GPU, or an error). The same decisions either way."
        ),
    )
    num_gpus: float = Field(
        0.25,
        gt=0.0,
        le=8.0,
        description="With a GPU: the share of one each task of the rounds asks Ray for (0.25: four share one).",
    )

    # where the work runs, not what it computes (the GPU decides as the CPU does): a run resumes with them changed
    run_settings: ClassVar[frozenset[str]] = frozenset({"device", "num_gpus"})


class SemanticDedup(GlobalStage):
    name = "semantic"
    summary = "meaning-level near-duplicates (SemDeDup): document embeddings, k-means, pairwise cosine per cluster"
    signals = "none on kept documents (vectors live only between its rounds); `semantic_similarity` on a dropped one"
    reasons = ("near_semantic",)
    Options = SemanticOptions
    resources = Resources(num_cpus=1, memory_mb=1024)

    @classmethod
    def keeps_text(cls, options: SemanticOptions) -> bool:
        return True  # decides which documents survive; the text is not touched

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return semantic_aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return semantic_sections(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        return set()

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        from datapipe.dedup.embed import EmbedError
        from datapipe.dedup.embed_models import model_folder
        from datapipe.stages.minhash import MinHashDedup

        o: SemanticOptions = options
        if o.survivor == "best" and not o.score_column:
            return [("score_column", "survivor: best needs score_column (a numeric signal column, higher is better)")]
        problems = MinHashDedup.check(o, context)  # the same survivor rule and score_column check
        if o.model is None:
            problems += [(k, "is for a model folder; give model too") for k in _MODEL_ONLY if _given(o, k)]
            return problems
        try:
            kind = model_folder(_resolve(o.model, context.pipeline_dir), o.model_kind).kind
        except EmbedError as exc:
            return [*problems, ("model", str(exc))]
        problems += [
            (k, f"is for a transformers model; {o.model} is a {kind} model") for k in _MODEL_ONLY[1:] if _given(o, k)
        ] * (kind != "transformers")
        return problems

    @classmethod
    def warnings(cls, options: Any, context: CheckContext) -> list[Problem]:
        """A threshold below what the fastText vectors trained on the run can tell apart (no model)."""
        o: SemanticOptions = options
        if o.model is not None or o.threshold is None or o.threshold >= DEFAULT_FASTTEXT_THRESHOLD:
            return []
        return [
            (
                "threshold",
                f"{o.threshold:g} without a model: the fastText vectors trained on the run's own text put unrelated "
                f"documents at cosine up to {FASTTEXT_UNRELATED_MAX} (bench/quality/semantic_eval.py: two articles "
                f"on two fish species among 2,000 held-out Wikipedia documents), so at {o.threshold:g} unrelated "
                f"documents are taken for near-duplicates; give a model, or leave threshold at its default for "
                f"these vectors, {DEFAULT_FASTTEXT_THRESHOLD:g}",
            )
        ]

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        from datapipe.dedup.embed import EmbedError
        from datapipe.dedup.embed_models import model_folder

        if options.model is None:
            return []
        try:
            folder = model_folder(_resolve(options.model, pipeline_dir), options.model_kind)
        except EmbedError:
            return []  # check() reports it
        if folder.kind != "transformers":  # its weights and its tokenizer
            weights, tokenizer = folder.files
            return [
                ResourceFile(weights, "model", key="semantic", content=False),
                ResourceFile(tokenizer, "tokenizer", key="semantic", content=False),
            ]
        # an encoder's config, weights and tokenizer files all decide the vectors
        return [ResourceFile(f, "model", key=f"semantic/{f.name}", content=False) for f in folder.files]

    def step_resources(self) -> Resources:
        """The rounds' tasks ask for a GPU share unless ``device: cpu``: required with ``cuda``; with
        ``auto`` dropped on a cluster without GPUs (``datapipe.engine.executors.ray.executor.fit_gpus``)."""
        base = super().step_resources()
        if self.options.device == "cpu":
            return base
        return replace(base, num_gpus=self.options.num_gpus, gpus_required=self.options.device == "cuda")

    def prepare(self) -> None:
        from datapipe.dedup.embed_models import model_folder

        if self.options.model is not None:
            model_folder(_resolve(self.options.model, self.context.pipeline_dir), self.options.model_kind)

    def steps(self) -> tuple[GlobalStep, ...]:
        first = "training vectors and clustering the sample" if self.options.model is None else "clustering the sample"
        names = (first, "embedding documents", "comparing within clusters")
        return (PartitionStep(self.partitions, self.shuffle, self.reduce_partition, rounds=3, decides=True, round_names=names),)

    # -- map ---------------------------------------------------------------------------------
    def shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        o = self.options
        text = pc.fill_null(batch["text"], "")
        has_text = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0).to_numpy(zero_copy_only=False)
        docs = first_row_key + np.flatnonzero(has_text).astype(np.int64)
        h = _sample_hash(docs, o.seed)
        take = np.lexsort((docs, h))[: o.sample]  # this batch's candidates for the run's sample
        n, m = len(docs), len(take)
        return pa.table(
            {
                "part": pa.array(np.concatenate([node_partition(docs, self.partitions), np.zeros(m, np.int32)]), pa.int32()),
                "doc": pa.array(np.concatenate([docs, docs[take]]), pa.int64()),
                "kind": pa.array(np.concatenate([np.full(n, DOC, np.int8), np.full(m, CENTROID, np.int8)]), pa.int8()),
                "h": pa.array(np.concatenate([np.zeros(n, np.uint64), h[take]]), pa.uint64()),
            }
        )

    # -- rounds ------------------------------------------------------------------------------
    def reduce_partition(self, rows: pa.Table, round: int = 0, inputs: ReduceInputs | None = None) -> PartitionResult:
        assert inputs is not None, "the rounds read the text back from the map outputs"
        if round == 0:
            return self._train(rows, inputs)
        if round == 1:
            return self._assign(rows, inputs)
        return self._pairs(rows, inputs)

    def _train(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 0: partition 0 trains k-means (and fastText) on the sample; every partition forwards its docs."""
        o = self.options
        kind = rows["kind"].to_numpy()
        doc = rows["doc"].to_numpy()
        part = int(rows["part"][0].as_py())
        docs = np.unique(doc[kind == DOC])
        forward = [_forward_rows(np.full(len(docs), part, np.int32), docs, DOC, [None] * len(docs))]
        if (kind == CENTROID).any():
            h = rows["h"].to_numpy()[kind == CENTROID]
            cand = doc[kind == CENTROID]
            sample = np.sort(cand[np.lexsort((cand, h))][: o.sample])  # the run's sample, in run order
            texts = self._texts(inputs, sample)
            if o.model is None:
                from datapipe.dedup.embed import train_fasttext

                train_fasttext(
                    texts,
                    self._fasttext_path(inputs),
                    dim=o.fasttext_dim,
                    epoch=o.fasttext_epoch,
                    seed=o.seed,
                    niceness=self.context.niceness,  # the run's priority, not the Ray worker's
                )
            from datapipe.dedup.semantic import kmeans

            vectors = self._embedder(inputs).encode(texts)
            vectors = vectors[np.linalg.norm(vectors, axis=1) > 0]
            k = min(o.clusters, max(1, len(vectors) // 4))
            centroids = kmeans(vectors, k, o.seed, o.iterations, device=self._device())
            k = len(centroids)
            blobs = [c.tobytes() for c in centroids]
            for q in range(self.partitions):
                forward.append(_forward_rows(np.full(k, q, np.int32), np.arange(k, dtype=np.int64), CENTROID, blobs))
        return PartitionResult(None, pa.concat_tables(forward))

    def _assign(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 1: embed the partition's documents and send each to its k-means cluster's partition."""
        from datapipe.dedup.semantic import nearest

        kind = rows["kind"].to_numpy()
        cent_rows = rows.filter(pa.array(kind == CENTROID)).sort_by("doc")
        docs = np.unique(rows["doc"].to_numpy()[kind == DOC])
        if len(docs) == 0 or cent_rows.num_rows == 0:
            return PartitionResult(None)
        centroids = np.stack([np.frombuffer(b, np.float32) for b in cent_rows["vec"].to_pylist()])
        embedder = self._embedder(inputs)
        out_docs, out_cluster, out_vecs = [], [], []
        for s in range(0, len(docs), _EMBED_CHUNK):
            chunk = docs[s : s + _EMBED_CHUNK]
            vectors = embedder.encode(self._texts(inputs, chunk))
            valid = np.linalg.norm(vectors, axis=1) > 0  # no token the model knows: nothing to compare
            out_docs.append(chunk[valid])
            out_cluster.append(nearest(vectors[valid], centroids, device=self._device()))
            out_vecs.append(vectors[valid])
        d, c, v = np.concatenate(out_docs), np.concatenate(out_cluster), np.concatenate(out_vecs)
        width = 4 * v.shape[1]
        column = pa.Array.from_buffers(pa.binary(width), len(v), [None, pa.py_buffer(np.ascontiguousarray(v).tobytes())])
        return PartitionResult(
            None,
            pa.table(
                {
                    "part": pa.array((c % self.partitions).astype(np.int32), pa.int32()),
                    "doc": pa.array(d, pa.int64()),
                    "cluster": pa.array(c, pa.int32()),
                    "vec": column,
                }
            ),
        )

    def _pairs(self, rows: pa.Table, inputs: ReduceInputs) -> PartitionResult:
        """Round 2: pairwise cosine per k-means cluster, then SemDeDup's rule: the documents of a pair
        walked in keep order (the survivor rule's), each dropped only for a kept one it is at least
        ``threshold`` close to (the closest such), never for one that was itself dropped."""
        from datapipe.dedup.semantic import keep_in_order, similar_pairs

        o = self.options
        device = self._device()
        rows = rows.sort_by([("cluster", "ascending"), ("doc", "ascending")])
        cluster = rows["cluster"].to_numpy()
        docs = rows["doc"].to_numpy()
        vec_col = rows["vec"].combine_chunks()
        width = vec_col.type.byte_width // 4
        vectors = np.frombuffer(vec_col.buffers()[1], np.float32, count=len(docs) * width, offset=vec_col.offset * 4 * width)
        vectors = vectors.reshape(len(docs), width)
        starts = np.flatnonzero(np.r_[True, cluster[1:] != cluster[:-1]])
        ends = np.r_[starts[1:], len(docs)]
        found_i, found_j, found_s = [], [], []  # pairs at or above the threshold, as rows of this partition
        for s, e in zip(starts, ends):
            if e - s >= 2:
                i, j, sim = similar_pairs(vectors[s:e], self.threshold, device=device)
                found_i.append(i + s)
                found_j.append(j + s)
                found_s.append(sim)
        if not found_i or not sum(len(i) for i in found_i):
            return PartitionResult(None)
        i, j, sim = np.concatenate(found_i), np.concatenate(found_j), np.concatenate(found_s)
        paired = np.unique(np.concatenate([i, j]))
        keys = docs[paired]
        columns = ["id", "n_chars"] + ([o.score_column] if o.survivor == "best" and o.score_column else [])
        read = inputs.read_rows(keys, columns)
        # Keep order: the survivor rule's (minhash's: earliest row key, or the longest, or the best
        # score, ties to the earliest); a document's place in it, for each paired row.
        if o.survivor == "longest":
            primary = -read["n_chars"].to_numpy(zero_copy_only=False).astype(np.float64)
        elif o.survivor == "best" and o.score_column:
            scores = read[o.score_column].to_numpy(zero_copy_only=False).astype(np.float64)
            primary = -np.nan_to_num(scores, nan=-np.inf)
        else:
            primary = np.zeros(len(keys))
        order = np.lexsort((keys, primary))
        place = np.empty(len(paired), np.int64)
        place[order] = np.arange(len(paired))
        pi, pj = place[np.searchsorted(paired, i)], place[np.searchsorted(paired, j)]
        dup, _ = keep_in_order(len(paired), np.minimum(pi, pj), np.maximum(pi, pj), sim)
        dropped = np.flatnonzero(dup >= 0)  # by place
        if not len(dropped):
            return PartitionResult(None)
        member, kept = order[dropped], order[dup[dropped]]  # indices into paired / keys
        ids = np.asarray(read["id"].to_pylist(), dtype=object)
        pair = (vectors[paired[member]].astype(np.float64), vectors[paired[kept]].astype(np.float64))
        cosine = np.round(np.einsum("ij,ij->i", *pair), 4)
        kept_ids = ids[kept].tolist()
        detail = [
            f"semantic near-duplicate of {k} (cosine {c:.4f}; threshold {self.threshold:g})"
            for k, c in zip(kept_ids, cosine.tolist())
        ]
        return PartitionResult(
            drop_rows(
                keys[member],
                ids[member].tolist(),
                REASON,
                detail,
                dup_of_keys=keys[kept],
                dup_of=pa.array(kept_ids, pa.string()),
                dup_cluster=pa.array(kept_ids, pa.string()),  # the kept document and those dropped for it
                semantic_similarity=pa.array(cosine, pa.float64()),
            )
        )

    # -- helpers -----------------------------------------------------------------------------
    def _device(self) -> str | None:
        """The torch device of this task, or None (numpy); ``device: cuda`` without a GPU is an error naming the key."""
        from datapipe.dedup.semantic import resolve_device

        return resolve_device(self.options.device, key=f"{self.name}.device")

    @property
    def threshold(self) -> float:
        o = self.options
        if o.threshold is not None:
            return float(o.threshold)
        return DEFAULT_THRESHOLD if o.model is not None else DEFAULT_FASTTEXT_THRESHOLD

    def _texts(self, inputs: ReduceInputs, docs: np.ndarray) -> list[str]:
        texts = [t or "" for t in inputs.read_rows(docs, ["text"])["text"].to_pylist()]
        if self.options.fold_script:
            from datapipe.dedup.fold import fold_traditional

            texts = fold_traditional(texts)
        return texts

    def _fasttext_path(self, inputs: ReduceInputs) -> Path:
        o = self.options
        return Path(inputs.scratch_dir) / f"semantic-fasttext-s{o.seed}-d{o.fasttext_dim}-e{o.fasttext_epoch}-n{o.sample}.bin"

    def _embedder(self, inputs: ReduceInputs) -> Any:
        from datapipe.dedup.embed_models import load_embedder

        o = self.options
        if o.model is not None:
            path = _resolve(o.model, self.context.pipeline_dir)
            # A Hugging Face encoder's forward pass runs on the task's GPU where ``device`` resolves to one.
            return load_embedder(o.model_kind, path, max_tokens=o.max_tokens, batch_size=o.batch_size, device=self._device())
        return load_embedder("fasttext", self._fasttext_path(inputs))


_MODEL_ONLY = ("model_kind", "max_tokens", "batch_size")  # options that mean something with a model folder only


def _given(options: SemanticOptions, key: str) -> bool:
    return getattr(options, key) != SemanticOptions.model_fields[key].default


def _resolve(path: str, base: Path | str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


def _sample_hash(docs: np.ndarray, seed: int) -> np.ndarray:
    """A seeded splitmix64 of each row key: the sample is the documents with the lowest values."""
    x = docs.astype(np.uint64) ^ np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _forward_rows(part: np.ndarray, doc: np.ndarray, kind: int, vec: list[bytes | None]) -> pa.Table:
    return pa.table(
        {
            "part": pa.array(part, pa.int32()),
            "doc": pa.array(doc, pa.int64()),
            "kind": pa.array(np.full(len(doc), kind, np.int8), pa.int8()),
            "vec": pa.array(vec, pa.binary()),
        }
    )


# --- the audit: the kept documents with most copies dropped for them, with the least similar copy ------


def semantic_aggregates(columns: set[str]) -> list[Aggregate]:
    """Per survivor (``dup_of``) of ``near_semantic`` drops: copies, the highest and lowest similarity,
    the least similar copy. The table keeps the 1,000 largest."""
    if not {"semantic_similarity", "reason", "dup_of"} <= columns:  # no near_semantic reject among them
        sql = ""
    else:
        sql = """SELECT CAST(dup_of AS VARCHAR) AS dup_of, count(*) AS copies, max(semantic_similarity)::DOUBLE AS most,
                   min(semantic_similarity)::DOUBLE AS least, arg_min(id, semantic_similarity) AS least_id
            FROM documents WHERE reason = 'near_semantic' GROUP BY ALL"""
    return [
        Aggregate(
            "semantic",
            sql,
            (("dup_of", "VARCHAR"), ("copies", "BIGINT"), ("most", "DOUBLE"), ("least", "DOUBLE"), ("least_id", "VARCHAR")),
            merge={"copies": "sum", "most": "max", "least": "min", "least_id": "arg_min(least_id, least)"},
            order="copies DESC, dup_of",
            limit=1000,
        )
    ]


def semantic_sections(columns: set[str]) -> list[ReportSection]:
    if "semantic_similarity" not in columns:
        return []
    return [
        ReportSection(
            "Semantic near-duplicates",
            """SELECT dup_of, copies + 1, round(most, 4), round(least, 4), least_id
               FROM agg_semantic ORDER BY copies DESC, dup_of LIMIT 10""",
            columns=("kept (survivor)", "documents", "max cosine", "min cosine", "least similar dropped"),
            texts=("kept (survivor)", "least similar dropped"),
            note="The kept documents the semantic stage dropped the most copies for, each with its least similar "
            "dropped copy: the pair to read to judge the threshold.",
        )
    ]
