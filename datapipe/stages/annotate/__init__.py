"""LLM annotation: each document (or a seeded sample) asked of an OpenAI-compatible server, the answer's
fields as typed columns.

Signals: ``<prefix>_<property>`` per property of the answer schema; ``<prefix>_error`` and
``<prefix>_error_detail`` (null for a valid answer; else ``not_sampled``, ``not_json``,
``schema_violation``, ``refusal``, ``truncated``, ``empty``, ``request_rejected``, ``request_failed``
or ``not_asked``); provenance ``<prefix>_model``, ``_endpoint`` (host), ``_prompt_sha256``,
``_schema_sha256``, ``_params`` (sampling parameters, JSON) and ``_prompt_tokens`` /
``_completion_tokens`` (what the server reported for the request this document made; 0 for a
document answered by an identical request of another).

Every reply is appended to the task's answers journal as it arrives (``journal.py``), before the
batch is done: a killed or failed task, when run again, reads it first and asks only for what it
lacks. Requests run on ``max_in_flight`` threads per task, with retries (``client.py``). A document
whose answer is invalid or whose request failed gets null answer columns and its error: never an
exception. The stage drops nothing unless ``keep`` rules are given.

With ``sample.max_docs`` the stage is global (``bottom_k.py``): the map tasks before it write each
sampled document's hash (``<prefix>_sample_hash``, dropped again), one combine step finds the
corpus-wide threshold of the ``max_docs`` smallest, and the map tasks after it ask (``apply``, with
the same journal) only for the documents at or below it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from datapipe.errors import DatapipeError
from datapipe.schema import BASE_SCHEMA
from datapipe.stages.annotate.answers import AnswerSchema, Verdict, column_name, field_type, schema_problems
from datapipe.stages.annotate.bottom_k import BottomK, picked, sample_hash
from datapipe.stages.annotate.client import ClientSettings, Failure, ask, completions_url, endpoint_host
from datapipe.stages.annotate.journal import Answer, Journal
from datapipe.stages.annotate.options import PROVENANCE, AnnotateOptions, AnswerRule, endpoint_of
from datapipe.stages.annotate.prompt import placeholders, render, request_body, response_format, sha256_of
from datapipe.stages.base import CheckContext, Decision, Problem, ResourceFile, Resources, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import CombineStep, GlobalStage, GlobalStep, MayBeGlobal, ReduceInputs, no_drops
from datapipe.stages.report_section import Aggregate, column, literal

# Columns every document has when the stage reaches it: the reader's and the length the engine adds.
READ_COLUMNS = frozenset([*BASE_SCHEMA.names, "n_chars"])
_NULL = pa.scalar(None, pa.string())


class AnnotateError(DatapipeError, RuntimeError):
    """The server refuses every request, or too many of a task's requests failed: the task fails, its answers kept."""


def _resolve(path: str, base: Path | str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


def load_texts(o: AnnotateOptions, base: Path | str) -> tuple[str, str | None, dict[str, Any]]:
    """(prompt template, system template, answer schema) from the options or their files."""
    prompt = o.prompt if o.prompt is not None else _resolve(o.prompt_file or "", base).read_text(encoding="utf-8")
    schema = o.output_schema
    if schema is None:
        schema = yaml.safe_load(_resolve(o.output_schema_file or "", base).read_text(encoding="utf-8"))  # JSON is YAML
    return prompt, o.system, schema


def sampling_params(o: AnnotateOptions) -> dict[str, Any]:
    """What the request carries besides the messages: part of every request's hash and the params column."""
    params: dict[str, Any] = {"temperature": o.temperature, "max_tokens": o.max_tokens}
    if o.top_p is not None:
        params["top_p"] = o.top_p
    if o.seed is not None:
        params["seed"] = o.seed
    return {**params, **o.extra}


def in_sample(doc_id: str, fraction: float, seed: int) -> bool:
    """A seeded hash of the id below ``fraction``: the same documents for the same seed, in any run."""
    if fraction >= 1.0:
        return True
    return sample_hash(doc_id, seed) < fraction * 2**64


def hash_column(prefix: str) -> str:
    """The column of each sampled document's hash between the map tasks and the max_docs step."""
    return f"{prefix}_sample_hash"


class Annotate(MayBeGlobal, GlobalStage):
    name = "annotate"
    summary = (
        "asks an OpenAI-compatible LLM server (vLLM, SGLang, llama.cpp, hosted) about each document or a "
        "sample; the answer's fields as typed columns, with tokens and cost"
    )
    signals = (
        "`llm_<property>` per property of the answer schema, `llm_error`, `llm_error_detail`, provenance "
        "(`llm_model`, `llm_endpoint`, `llm_prompt_sha256`, `llm_schema_sha256`, `llm_params`), "
        "`llm_prompt_tokens`, `llm_completion_tokens`"
    )
    reasons = ("annotate:<field>",)
    Options = AnnotateOptions
    resources = Resources(num_cpus=1, memory_mb=300)
    repeatable = True  # two annotate stages need two prefixes
    # Keep rules judge recorded answers: changed alone, a re-decide (`run --from`) asks nothing.
    decision_options = frozenset({"keep"})

    @classmethod
    def keeps_text(cls, options: Any) -> bool:
        return True  # it only adds the answer and provenance columns: recorded answers stand for asking

    @classmethod
    def global_for(cls, options: Any) -> bool:
        """A corpus-wide cap needs every shard's sample before the first request (``bottom_k.py``)."""
        return options.sample.max_docs is not None

    # --- validation -----------------------------------------------------------------------
    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        o: AnnotateOptions = options
        problems = kinds_problems(o.kinds)
        for key, value in (("prompt_file", o.prompt_file), ("output_schema_file", o.output_schema_file)):
            if value is not None and not _resolve(value, context.pipeline_dir).is_file():
                problems.append((key, f"file not found: {_resolve(value, context.pipeline_dir)}"))
        if problems:
            return problems
        try:
            prompt, system, schema = load_texts(o, context.pipeline_dir)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            return [("output_schema_file", f"cannot be read as JSON or YAML: {exc}")]
        schema_key = "output_schema" if o.output_schema is not None else "output_schema_file"
        problems += [(schema_key, m) for m in schema_problems(schema)]
        prompt_key = "prompt" if o.prompt is not None else "prompt_file"
        names = placeholders(prompt) + placeholders(system or "")
        if not placeholders(prompt):
            problems.append((prompt_key, "names no document column ({{text}}, ...): every document would be asked the same"))
        known = set(READ_COLUMNS)
        for kind, before in context.before:
            from datapipe.stages import STAGES  # late: the registry imports this module

            cols = STAGES[kind].output_columns(before, context)
            if cols is None:
                known = set()  # a stage whose columns cannot be known: any name may be right
                break
            known |= cols
        if known:
            for name in names:
                if name not in known:
                    problems.append(
                        (prompt_key, f"{{{{{name}}}}} is no column of the documents here; known: {', '.join(sorted(known))}")
                    )
        if not problems:
            problems += _column_problems(o, schema, schema_key)
        if o.api_key_env and o.api_key_env not in os.environ:
            problems.append(("api_key_env", f"the environment variable {o.api_key_env} is not set"))
        return problems

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return annotation_aggregates(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        try:
            _, _, schema = load_texts(options, context.pipeline_dir)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
        if schema_problems(schema):
            return None
        return {column_name(options.prefix, p) for p in schema["properties"]} | {f"{options.prefix}_{c}" for c in PROVENANCE}

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        files = []
        if options.prompt_file:
            files.append(ResourceFile(_resolve(options.prompt_file, pipeline_dir), "prompt"))
        if options.output_schema_file:
            files.append(ResourceFile(_resolve(options.output_schema_file, pipeline_dir), "schema"))
        return files

    # --- set-up ---------------------------------------------------------------------------
    def _api_key(self) -> str | None:
        env = self.options.api_key_env
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise AnnotateError(
                f"annotate: the environment variable {env} (api_key_env) is not set",
                hint=f"export {env}=... where the run's tasks run (every Ray node of a cluster)",
            )
        return key

    def prepare(self) -> None:
        self._api_key()
        endpoint_of(self.options)  # a bad $endpoint_env fails before any task

    def setup(self) -> None:
        o: AnnotateOptions = self.options
        self._prompt, self._system, schema = load_texts(o, self.context.pipeline_dir)
        self._schema = AnswerSchema(schema, o.prefix)
        self._params = sampling_params(o)
        self._format = response_format(o.response_format, schema)
        self._names = placeholders(self._prompt) + placeholders(self._system or "")
        self._settings = ClientSettings(
            completions_url(endpoint_of(o)), self._api_key(), o.timeout_s, o.max_retries, o.backoff_s, o.max_backoff_s
        )
        self._host = endpoint_host(endpoint_of(o))
        self._prompt_sha = sha256_of({"system": self._system, "prompt": self._prompt})
        self._schema_sha = sha256_of(schema)
        self._params_json = json.dumps({**self._params, "response_format": o.response_format}, sort_keys=True)
        # A task this stage was told of before its setup (start_task of a reused stage) keeps its folder.
        self._task: _Task | None = getattr(self, "_task", None)
        self._work_dir: Path | None = getattr(self, "_work_dir", None)
        self._task_bottom: BottomK | None = getattr(self, "_task_bottom", None)

    # --- one map task ---------------------------------------------------------------------
    def start_task(self, work_dir: Path) -> None:
        # Told of a task before setup() when its recorded answers are reused (run --from): set up on first use.
        if getattr(self, "_task", None) is not None:
            self._close_task()
        self._work_dir = work_dir  # the journal's folder, opened at the task's first batch
        # With max_docs: this task's k smallest hashes so far (compute writes only the hashes that enter them).
        k = self.options.sample.max_docs
        self._task_bottom = BottomK(k) if k is not None else None

    def end_task(self, completed: bool) -> None:
        task, self._task, self._work_dir = getattr(self, "_task", None), None, None
        if task is None:
            return
        try:
            if completed:
                task.check()
        finally:
            task.close()

    def _close_task(self) -> None:
        if self._task is not None:
            self._task.close()
            self._task = None

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    # --- compute and decide ---------------------------------------------------------------
    def compute(self, batch: pa.Table) -> pa.Table:
        """Every sampled document asked; with ``max_docs`` only each sampled document's hash (``apply`` asks)."""
        missing = [n for n in self._names if n not in batch.column_names]
        if missing:
            raise ValueError(f"annotate: the prompt uses {{{{{missing[0]}}}}}, but the documents have no column {missing[0]!r}")
        s = self.options.sample
        if s.max_docs is not None:
            kind = batch["kind"][0].as_py() if batch.num_rows and "kind" in batch.column_names else None
            mine = kind is None or self.applies_to(kind)  # global mode sees every kind: leave the others unhashed
            hashes = [sample_hash(i, s.seed) if mine else None for i in batch["id"].to_pylist()]
            column = pa.array([h if h is not None and h < s.fraction * 2**64 else None for h in hashes], pa.uint64())
            if self._task_bottom is not None:  # in a map task: only the hashes that may be among the corpus's k
                entered = self._task_bottom.add(column, batch["id"])
                column = pc.if_else(pa.array(entered), column, pa.scalar(None, pa.uint64()))
            return set_column(batch, hash_column(self.options.prefix), column)
        return self._running().annotate(batch, [in_sample(i, s.fraction, s.seed) for i in batch["id"].to_pylist()])

    def _running(self) -> _Task:
        if self._task is None:  # outside a map task (a test, a notebook): answers kept in memory
            self._task = _Task(self, Journal(self._work_dir))
        return self._task

    def steps(self) -> tuple[GlobalStep, ...]:
        """One combine task: the threshold of the ``max_docs`` smallest hashes (state, one row); it drops nothing."""
        return (CombineStep(no_drops, self._threshold, name="choosing the sample"),)

    def _threshold(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        # Streams two columns of each map output, holding at most max_docs pairs and one batch: bounded
        # by k, not by the corpus (each map task wrote only its own bottom-k candidates: bottom_k.py).
        assert self.options.sample.max_docs is not None
        col = hash_column(self.options.prefix)
        best = BottomK(self.options.sample.max_docs)
        for path in inputs.files:
            local = inputs.fetch(path) if inputs.fetch is not None else path
            parquet = pq.ParquetFile(local)
            if col not in parquet.schema_arrow.names:
                continue
            for rb in parquet.iter_batches(columns=["id", col]):
                best.add(rb.column(col), rb.column("id"))
        return best.threshold()

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        """With ``max_docs``: the documents at or below the corpus-wide threshold asked, the rest not_sampled."""
        col = hash_column(self.options.prefix)
        if col not in batch.column_names:  # a kind the stage skips (its batches were never computed)
            return batch, Decision.keep_all(batch.num_rows)
        hashes = batch[col].to_pylist()
        batch = batch.drop_columns([col])
        kind = batch["kind"][0].as_py() if batch.num_rows and "kind" in batch.column_names else None
        if kind is not None and not self.applies_to(kind):
            return batch, Decision.keep_all(batch.num_rows)
        batch = self._running().annotate(batch, picked(hashes, batch["id"].to_pylist(), state))
        return batch, self.decide(batch)

    def decide(self, batch: pa.Table) -> Decision:
        reason = pa.nulls(batch.num_rows, pa.string())
        detail = pa.nulls(batch.num_rows, pa.string())
        for rule in reversed(self.options.keep):  # the first failing rule names the drop
            col = column_name(self.options.prefix, rule.field)
            if col not in batch.column_names:
                continue
            bad, text = _rule_fails(batch[col], rule, col)
            reason = pc.if_else(bad, f"annotate:{rule.field}", reason)
            detail = pc.if_else(bad, text, detail)
        return Decision(reason, detail)


def _rule_fails(values: pa.ChunkedArray, rule: AnswerRule, col: str) -> tuple[pa.Array, pa.Array]:
    """Where a rule fails (null answers never do) and the detail of each failure."""
    bad = pa.array([False] * len(values))
    shown = pc.cast(values, pa.string())
    text = pa.nulls(len(values), pa.string())
    for bound, fails, op in ((rule.min, pc.less, "<"), (rule.max, pc.greater, ">")):
        if bound is not None:
            hit = pc.fill_null(fails(values, bound), False)
            bad = pc.or_(bad, hit)
            text = pc.if_else(hit, pc.binary_join_element_wise(f"{col}=", shown, f" {op} {bound:g}", ""), text)
    if rule.values is not None:
        allowed = pa.array([v for v in rule.values if isinstance(v, (str, int, float))]).cast(values.type, safe=False)
        hit = pc.fill_null(pc.invert(pc.is_in(values, value_set=allowed)), False)
        bad = pc.or_(bad, hit)
        listed = ", ".join(str(v) for v in rule.values)
        text = pc.if_else(hit, pc.binary_join_element_wise(f"{col}=", shown, f" not in [{listed}]", ""), text)
    return bad, text


def _column_problems(o: AnnotateOptions, schema: dict[str, Any], schema_key: str) -> list[Problem]:
    problems: list[Problem] = []
    own = {f"{o.prefix}_{c}": c for c in PROVENANCE}
    seen: dict[str, str] = {}
    for prop in schema["properties"]:
        col = column_name(o.prefix, prop)
        if col in own:
            problems.append(
                (f"{schema_key}.properties.{prop}", f"would be column {col}, which the stage writes its {own[col]} to; rename it")
            )
        elif col in seen:
            problems.append((f"{schema_key}.properties.{prop}", f"would be column {col}, like property {seen[col]!r}"))
        seen[col] = prop
    for i, rule in enumerate(o.keep):
        prop = schema["properties"].get(rule.field)
        if prop is None:
            problems.append(
                (
                    f"keep[{i}].field",
                    f"{rule.field!r} is no property of the schema; its properties: {', '.join(schema['properties'])}",
                )
            )
            continue
        dtype = field_type(prop)
        if (rule.min is not None or rule.max is not None) and dtype not in (pa.int64(), pa.float64()):
            problems.append((f"keep[{i}]", f"min and max need a number or integer property; {rule.field!r} is not one"))
        if rule.values is not None and not all(_fits(v, dtype) for v in rule.values):
            problems.append((f"keep[{i}].values", f"{rule.field!r} is {_TYPE_NAMES[dtype]} column: list values of that type"))
    return problems


_TYPE_NAMES = {pa.string(): "a string", pa.int64(): "an integer", pa.float64(): "a number", pa.bool_(): "a boolean"}


def _fits(value: Any, dtype: pa.DataType) -> bool:
    """Whether a keep rule's value can equal an answer in a column of ``dtype``."""
    if dtype == pa.bool_():
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if dtype == pa.int64():
        return isinstance(value, int)
    if dtype == pa.float64():
        return isinstance(value, (int, float))
    return isinstance(value, str)


class _Task:
    """What one map task keeps: its journal, its request threads, its sample and its failures."""

    def __init__(self, stage: Annotate, journal: Journal) -> None:
        self.stage = stage
        self.options: AnnotateOptions = stage.options
        self.journal = journal
        self.failures: dict[str, Failure] = {}  # request hash -> why it got no answer (this attempt only)
        self.asked = 0  # requests sent by this attempt
        self.failed = 0
        self.stop = threading.Event()
        self.stop_reason: Failure | None = None
        self.jobs: queue.Queue[tuple[str, str, dict[str, Any]] | None] = queue.Queue()
        self.results: queue.Queue[tuple[str, Answer | Failure]] = queue.Queue()
        # Daemon threads: an interrupted run exits without waiting for requests in flight.
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(self.options.max_in_flight)]
        self.started = False

    def _work(self) -> None:
        settings = self.stage._settings
        while True:
            job = self.jobs.get()
            if job is None:
                return
            key, doc_id, body = job
            try:
                outcome: Answer | Failure = ask(settings, body, key, doc_id, self.stop)
            except Exception as exc:  # a bug here must not leave the task waiting for ever
                outcome = Failure("request_failed", f"{type(exc).__name__}: {exc}")
            if isinstance(outcome, Failure) and outcome.broken:
                self.stop.set()  # at once: the other threads send nothing more
            self.results.put((key, outcome))

    def annotate(self, batch: pa.Table, asked: list[bool]) -> pa.Table:
        """The batch with answer columns; ``asked``: which documents are sampled (the others not_sampled)."""
        st, o = self.stage, self.options
        ids = batch["id"].to_pylist()
        columns = {name: batch[name].to_pylist() for name in dict.fromkeys(st._names)}
        if "text" in columns:
            columns["text"] = [t[: o.max_chars] if isinstance(t, str) else t for t in columns["text"]]
        keys: list[str | None] = []
        pending: set[str] = set()
        for i, doc_id in enumerate(ids):
            if not asked[i]:
                keys.append(None)
                continue
            values = {name: col[i] for name, col in columns.items()}
            system = render(st._system, values) if st._system is not None else None
            body = request_body(o.model, system, render(st._prompt, values), st._params, st._format)
            key = sha256_of(body)
            keys.append(key)
            if key not in self.journal.answers and key not in self.failures and key not in pending:
                self._submit(key, doc_id, body)  # asked while the rest of the batch is prepared
                pending.add(key)
        self._collect(len(pending))
        return self._columns(batch, ids, keys)

    def _submit(self, key: str, doc_id: str, body: dict[str, Any]) -> None:
        if not self.started:
            for t in self.threads:
                t.start()
            self.started = True
        self.jobs.put((key, doc_id, body))

    def _collect(self, n: int) -> None:
        """The outcomes of ``n`` submitted requests, each answer journaled the moment it arrives."""
        for _ in range(n):
            key, outcome = self.results.get()
            if isinstance(outcome, Answer):
                self.asked += 1
                self.journal.record(outcome)
                continue
            self.failures[key] = outcome
            if outcome.error == "not_asked":
                continue
            self.asked += 1
            self.failed += 1
            if outcome.broken or self.failed > self._budget():
                if self.stop_reason is None:
                    self.stop_reason = outcome
                self.stop.set()  # the rest of the task is not asked; check() fails it
        if n:
            self.journal.sync()

    def _budget(self) -> float:
        return max(self.options.max_failures, self.options.max_failed_fraction * self.asked)

    def _columns(self, batch: pa.Table, ids: list[str], keys: list[str | None]) -> pa.Table:
        st, o = self.stage, self.options
        n = len(ids)
        values: dict[str, list[Any]] = {p: [None] * n for p in st._schema.fields}
        error: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        prompt_tokens: list[int | None] = [None] * n
        completion_tokens: list[int | None] = [None] * n
        hosts: list[str] = [st._host] * n
        for i, key in enumerate(keys):
            if key is None:
                error[i] = "not_sampled"
                continue
            answer = self.journal.answers.get(key)
            if answer is None:
                failure = self.failures[key]
                error[i], detail[i] = failure.error, failure.detail
                continue
            verdict: Verdict = st._schema.judge(answer.content, answer.refusal, answer.finish_reason)
            for p, v in verdict.values.items():
                values[p][i] = v
            error[i], detail[i] = verdict.error, verdict.detail
            mine = answer.id == ids[i]  # a document answered by another's identical request paid nothing
            prompt_tokens[i] = answer.prompt_tokens if mine else 0
            completion_tokens[i] = answer.completion_tokens if mine else 0
            hosts[i] = answer.endpoint or st._host
        p = o.prefix
        for prop, dtype in st._schema.fields.items():
            batch = set_column(batch, st._schema.columns[prop], pa.array(values[prop], dtype))
        own = {
            "error": pa.array(error, pa.string()),
            "error_detail": pa.array(detail, pa.string()),
            "model": pa.array([o.model] * n, pa.string()),
            "endpoint": pa.array(hosts, pa.string()),
            "prompt_sha256": pa.array([st._prompt_sha] * n, pa.string()),
            "schema_sha256": pa.array([st._schema_sha] * n, pa.string()),
            "params": pa.array([st._params_json] * n, pa.string()),
            "prompt_tokens": pa.array(prompt_tokens, pa.int64()),
            "completion_tokens": pa.array(completion_tokens, pa.int64()),
        }
        for name in PROVENANCE:
            batch = set_column(batch, f"{p}_{name}", own[name])
        return batch

    def check(self) -> None:
        """At the task's end: fail it if the server refused every request or too many failed."""
        reason = self.stop_reason
        if reason is None:
            return
        where = f"; its {len(self.journal.answers)} answers are kept in {self.journal.path}" if self.journal.path else ""
        if reason.broken:
            raise AnnotateError(
                f"annotate: {endpoint_of(self.options)} refused a request ({reason.detail}): check the stage's endpoint, "
                f"model and api_key_env{where}",
                hint="check the stage's endpoint, model and api_key_env, then run the same command again",
            )
        raise AnnotateError(
            f"annotate: {self.failed} of {self.asked} requests of this task failed after every retry (more than "
            f"max_failures={self.options.max_failures} and max_failed_fraction={self.options.max_failed_fraction}); "
            f"the last: {reason.detail}{where}",
            hint="run the same command again when the server answers: only what was not answered is asked",
        )

    def close(self) -> None:
        self.stop.set()
        for _ in self.threads:
            self.jobs.put(None)
        self.journal.close()


# --- the audit: what each annotate stage asked and what it cost (``audit/annotations.py`` reads it) ----


def annotation_aggregates(columns: set[str]) -> list[Aggregate]:
    """Per annotate stage (its column prefix), error code and whether the document reached it
    (``<prefix>_model`` set): documents, and the prompt and completion tokens the server reported."""
    prefixes = sorted(c[: -len("_error")] for c in columns if c.endswith("_error") and c[: -len("_error")] + "_model" in columns)
    parts = [
        f"""SELECT {literal(p)} AS prefix, {column(columns, p + "_error")} AS error,
                   {column(columns, p + "_model")} IS NOT NULL AS asked, count(*) AS documents,
                   coalesce(sum({column(columns, p + "_prompt_tokens", "BIGINT")}), 0)::BIGINT AS prompt_tokens,
                   coalesce(sum({column(columns, p + "_completion_tokens", "BIGINT")}), 0)::BIGINT AS completion_tokens
            FROM documents GROUP BY ALL"""
        for p in prefixes
    ]
    return [
        Aggregate(
            "annotations",
            " UNION ALL ".join(parts),
            (
                ("prefix", "VARCHAR"),
                ("error", "VARCHAR"),
                ("asked", "BOOLEAN"),
                ("documents", "BIGINT"),
                ("prompt_tokens", "BIGINT"),
                ("completion_tokens", "BIGINT"),
            ),
            merge={"documents": "sum", "prompt_tokens": "sum", "completion_tokens": "sum"},
            order="prefix, error, asked",
        )
    ]
