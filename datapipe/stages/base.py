"""The stage contract: a batch in, signals added as columns, then a separate decision.

Computing and deciding are split (as Data-Juicer does) so thresholds can be re-tuned
from recorded signals without recomputing them, and every drop is explainable:
``decide`` returns, per row, null to keep or a short reason string to drop, plus an
optional human-readable detail (the signal values behind the drop). This is
datatrove's ``filter -> keep | (drop, reason)`` over a whole batch.

Stages know nothing of Ray, the CLI or the run folder. They declare the resources
a task needs (NeMo Curator style) and the engine schedules them. A stage whose decision needs the
whole corpus declares its corpus-wide steps as well: ``datapipe.stages.global_stage``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from datapipe.config.sections import SOURCE_KINDS

if TYPE_CHECKING:
    from datapipe.stages.explain_section import ExplainSection, RecordedRun, Threshold
    from datapipe.stages.report_section import Aggregate, ReportSection
    from datapipe.stages.steps import GlobalStep


class StageOptions(BaseModel):
    """Base for stage options: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Options that say how a run does its work, not what it computes (where a server is, how many
    # requests at once, retries): recorded in run.json but not part of the run's identity, so a
    # run resumes with them changed (datapipe.pipeline.identity.identity_config).
    run_settings: ClassVar[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Resources:
    num_cpus: float = 1.0
    memory_mb: int = 0  # 0: no explicit reservation
    num_gpus: float = 0.0  # GPUs a task asks for (a fraction shares one)
    gpus_required: bool = False  # False: on a cluster without GPUs the task runs without one


@dataclass(frozen=True)
class Decision:
    """Per-row outcome: ``reason`` null keeps the row, a string drops it."""

    reason: pa.Array  # string, null = keep
    detail: pa.Array | None = None  # string, why in numbers; null where not useful

    @staticmethod
    def keep_all(n: int) -> Decision:
        return Decision(pa.nulls(n, pa.string()))


@dataclass(frozen=True)
class StageContext:
    """What a stage may know about where it runs; nothing engine-specific."""

    pipeline_dir: str
    cache_dir: str
    # The run's CPU priority (the driver's niceness; None: this process's): what a process the stage
    # starts for its own work should run at, rather than inherit a Ray worker's 15 steps nicer.
    niceness: int | None = None


Problem = tuple[str, str]  # (key path inside the stage's options, "" for the stage itself; message)


@dataclass(frozen=True)
class CheckContext:
    """What pipeline validation knows when it asks a stage to check its options against the world."""

    pipeline_dir: Path
    kinds: frozenset[str]  # source kinds of the pipeline
    before: tuple[tuple[str, StageOptions], ...] = ()  # (stage type, options) of the stages that run earlier


@dataclass(frozen=True)
class ResourceFile:
    """A file a stage's signals or decisions depend on (rule set, word list, model).

    The run records each one in run.json (path, sha256 and, for small text files, the content), so
    a rerun against a changed file is refused naming it, and ``explain`` grades against what the
    run used rather than today's file.
    """

    path: Path
    role: str  # what it is to the stage: "rules", "word_list", "domain_list", "license_classes", "model"
    key: str | None = None  # the stage's own name for it, e.g. the quality rule-set key "zh_web"
    content: bool = True  # record the text (small data files); False: the hash only (models)
    name: str | None = None  # shown and compared instead of the path (a model found by env or cache)
    sha256: str | None = None  # a pinned hash that stands for the file (lid.176, checked when fetched)


def kinds_problems(kinds: list[str], key: str = "kinds") -> list[Problem]:
    """A kind outside web/code/paper/text matches no source: the stage would silently skip everything."""
    return [
        (f"{key}[{i}]", f"{k!r} is not a source kind; allowed: {', '.join(SOURCE_KINDS)}")
        for i, k in enumerate(kinds)
        if k not in SOURCE_KINDS
    ]


class Stage:
    """A per-document stage. Subclasses set ``name`` and ``Options`` and implement compute/decide."""

    name: ClassVar[str]
    # What the stage index (docs/stages/index.md, generated from the registry) says of the stage:
    # what it does in one line, the columns it adds (markdown: a pattern where options name them,
    # `cls_<model>_<label>`), and every reason it drops with (a pattern, `license_<class>`, where
    # the reason carries a value; empty: it drops nothing). A built-in stage must set all three.
    summary: ClassVar[str] = ""
    signals: ClassVar[str] = ""
    reasons: ClassVar[tuple[str, ...]] = ()
    Options: ClassVar[type[StageOptions]] = StageOptions
    resources: ClassVar[Resources] = Resources()
    repeatable: ClassVar[bool] = False  # may the stage appear twice in one pipeline?
    # What a stage that changes documents did, for the run summary and the ``stage_edits`` table:
    # signal column -> what its sum over the documents the stage passed on counts ("emails replaced").
    # The engine sums them in each task (numbers or booleans), so the summary never reads the corpus.
    edit_counts: ClassVar[dict[str, str]] = {}

    def edits(self) -> dict[str, str]:
        """``edit_counts`` for these options (a stage whose wording depends on them overrides this)."""
        return dict(self.edit_counts)

    # Option fields only ``decide`` reads (thresholds). A run re-decided from an earlier one's recorded
    # signals (``datapipe run --from``) reuses this stage's signals when nothing else of its options
    # (and none of its resource files) changed: ``compute`` would give the same columns again.
    decision_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: StageOptions, context: StageContext) -> None:
        self.options: Any = options
        self.context = context

    def task_resources(self) -> Resources:
        """What a task running this stage asks for with these options (``resources`` unless the options
        change it: classify asks for a GPU for a transformers model)."""
        return self.resources

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        """Everything a run would only find out later (files, model labels, names), checked at validation.

        Must not load big models or read inputs: ``datapipe validate`` stays fast. Returns every
        problem, each with the key path inside the options, so a user fixes the file in one go.
        """
        return []

    @classmethod
    def warnings(cls, options: Any, context: CheckContext) -> list[Problem]:
        """Settings that run but are unlikely to do what was meant (a threshold the stage's own signals
        cannot support), each with the measured reason: printed by ``datapipe validate`` and at the
        start of a run, which still runs. Like ``check``: no big model loaded, no input read."""
        return []

    @classmethod
    def global_for(cls, options: Any) -> bool:
        """Whether the stage needs a corpus-wide step between map phases with these options: the one
        question the planner asks. A per-document stage never does; a ``GlobalStage`` always does,
        one that is ``MayBeGlobal`` with some options only (classify: with a percentile rule)."""
        return False

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        """The signal columns the stage adds to every batch; None where they cannot be known up front."""
        return set()

    @classmethod
    def audit_views(cls, columns: set[str]) -> dict[str, str]:
        """Views this stage adds to the run's audit database: name -> a SELECT over its tables.

        ``columns`` are those of the ``documents`` table in this run (one row per input document, the
        stage's signals among them). Created at the end of every run with the stage, beside the views
        of every run (``datapipe.audit.views``); a name already taken there is an error.
        """
        return {}

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        """The counts this stage's report sections read, as GROUP BYs over documents (``Aggregate``).

        Every map task runs them over the documents it wrote (``columns``: theirs, which may lack this
        stage's signals: read them as NULL then, never leave an aggregate out) and the end of the run
        merges them into ``agg_<name>`` tables, so the report never scans the corpus.
        """
        return []

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        """This stage's parts of ``datapipe report``: headings and SELECTs over the ``agg_`` tables
        (``ReportSection``), in page order; ``columns`` are those of the run's ``documents``."""
        return []

    @classmethod
    def explain(cls, row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
        """This stage's parts of ``datapipe explain`` for one document (its ``documents`` row): the
        document graded against the stage's rules as the run recorded them (``ExplainSection``)."""
        return []

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        """The bounds ``decide`` applies to signal columns, from the options the run recorded (a dict:
        a run of an older datapipe may hold keys today's options reject): what the viewer draws."""
        return []

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        """The files besides the pipeline file that the stage's outputs depend on: part of the run's identity.

        Called on the driver for validated options; must be cheap (no model loading). A stage that
        reads a data file it does not list here could resume silently with half a run judged by old rules.
        """
        return []

    @classmethod
    def keeps_text(cls, options: Any) -> bool:
        """Whether the stage only adds its ``output_columns``, leaving the text and every other column
        as they were: then recorded values of those columns stand for ``compute`` (``run --from``).

        False by default, so a stage that says nothing is always computed, and a change of its options
        also recomputes the stages after it (their signals were computed on its output).
        """
        return False

    def prepare(self) -> None:
        """Called once on the driver before any task: fetch models, fail early with a clear error."""

    def setup(self) -> None:
        """Load models and indexes: called by the engine once per worker process (``build_stage``)
        before the stage's first batch; code that builds a stage itself calls it before ``compute``."""

    def start_task(self, work_dir: Path) -> None:
        """Called by the engine before a map task's first batch. ``work_dir`` is the task's own folder
        for this stage in the run folder's ``_work/`` (created by the stage if it writes there): it
        survives a killed or failed attempt of the task, so work paid for once (answers of a remote
        model) is read back instead of done again; ``--fresh`` removes it."""

    def end_task(self, completed: bool) -> None:
        """Called after a map task's last batch (``completed``: before its outputs are committed; the
        stage may raise to fail the task) or when the task fails (``completed`` False: release only)."""

    def applies_to(self, kind: str) -> bool:
        """Whether documents of this source kind go through the stage (others pass untouched)."""
        return True

    def compute(self, batch: pa.Table) -> pa.Table:
        """Return the batch with this stage's signal columns added (or text transformed)."""
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        """Keep or drop each row of a computed batch, from signals and thresholds only."""
        return Decision.keep_all(batch.num_rows)

    def steps(self) -> tuple[GlobalStep, ...]:
        """The corpus-wide steps a global stage declares (``GlobalStage``); a per-document stage has none."""
        return ()
