"""Re-deciding from an earlier run's recorded signals (``datapipe run --from OLD_RUN``).

Every input document of a finished run is a row of its ``docs/`` (kept) or ``rejected/`` (dropped)
files, with the signal columns of every stage it went through. A new run of the same inputs whose
stages differ only in thresholds (``Stage.decision_options``) reads those columns instead of
computing them again, and decides anew; everything after the decisions (dedup survivors, tokens,
shards, statistics) is done as in any run, so its outputs are those of a fresh run.

What is reused, stage by stage (``plan_reuse``): the signals of a per-document stage that only adds
columns (``Stage.keeps_text``), whose options other than its decision options and whose resource
files are those of the earlier run, and whose input is the same: no stage before it was changed
(other than in thresholds), since a stage's signals may depend on the text an earlier stage left
and on earlier signals (quality picks its rule set by langid's ``lang``). A document the earlier
run dropped before such a stage has no recorded values for it: the map task computes them
(``engine/tasks/recorded.py``). Anything else is computed. The documents themselves must be the
same (sources, record limits, input files, the stages in the same order), else the run is
refused: the recorded rows would be of other documents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from datapipe.engine.errors import PipelineError
from datapipe.engine.plan import Recorded
from datapipe.engine.run_record import input_changes, input_listing
from datapipe.errors import EXIT_USAGE
from datapipe.pipeline.identity import config_changes, resource_changes
from datapipe.pipeline.load import Pipeline
from datapipe.run_folder.checked import DamagedRunFile, RecordedFiles, damage
from datapipe.run_folder.layout import RunFolder
from datapipe.stages import STAGES
from datapipe.stages.base import CheckContext
from datapipe.storage.uri import is_uri


class CannotRedecide(PipelineError):
    """``--from`` names no run whose recorded signals are of this pipeline's documents."""

    exit_code = EXIT_USAGE  # as asked, it cannot be done: another --from, or a run without it


# Config sections that say which documents a run has and how they are read: a change in any of them
# makes the earlier run's rows other documents (``inputs`` are compared by run_record.input_changes).
DOCUMENT_KEYS = ("sources", "limits")
ONLY_UNRECORDED = "computed only for documents without recorded values: those the earlier run dropped before the stage"


@dataclass(frozen=True)
class ReusePlan:
    recorded: Recorded
    split: dict[str, Any]  # the earlier run's split into map tasks: the same tasks, so its files per task
    record: dict[str, Any]  # run.json's "from": where the run came from and what it reused


def plan_reuse(pipeline: Pipeline, source: Path | str, output: RunFolder, log: Callable[[str], None]) -> ReusePlan:
    """Which recorded signals of the run in ``source`` a run of ``pipeline`` into ``output`` reuses;
    refused (PipelineError, naming what differs) where the earlier run's rows are not its documents."""
    if is_uri(source):
        raise CannotRedecide(f"--from {source}: re-deciding reads a run folder on this machine, not in object storage")
    old = RunFolder(source)
    if old.root == output.root:
        raise CannotRedecide(
            f"--from {old.root} is the output folder itself: re-deciding writes a new run folder (give another one with --output)"
        )
    run = old.load_run_json() if old.root.is_dir() else None
    if run is None:
        raise CannotRedecide(f"--from {old.root}: not a run folder (no run.json)")
    if run.get("status") != "complete":
        raise CannotRedecide(
            f"--from {old.root}: that run is not complete (status {run.get('status')!r}); finish it first "
            f"(run its command again), then re-decide from it"
        )
    config = run.get("config", {})
    normalized = pipeline.normalized()
    changes = [c for key in DOCUMENT_KEYS for c in config_changes(config.get(key), normalized.get(key), key)]
    changes += input_changes(run.get("inputs", []), input_listing(pipeline))
    old_kinds = [next(iter(s)) for s in config.get("stages", [])]
    kinds = [kind for kind, _ in pipeline.stage_options]
    if old_kinds != kinds:
        changes.append(f"stages: {', '.join(old_kinds) or 'none'} -> {', '.join(kinds) or 'none'}")
    if changes:
        raise CannotRedecide(
            f"--from {old.root}: its recorded signals are not of this pipeline's documents; changed since then:\n"
            + "\n".join(f"  - {c}" for c in changes[:30])
            + "\nRe-deciding needs the same sources, inputs and stages (in the same order); only stage "
            "options may differ. Run without --from to compute everything."
        )
    reused, computed = _reusable(pipeline, config, run.get("resources", []))
    _check_sizes(old, run)  # a stat per file: its tasks check the sha256 of each file they read
    columns = _column_order(old, run)
    ordered: list[tuple[int, tuple[str, ...]]] = []
    for pos, cols in reused.items():
        found = tuple(c for c in columns if c in cols)
        if len(found) == len(cols):
            ordered.append((pos, found))
        else:  # the earlier run never computed it (every document dropped before): nothing to reuse
            computed[pos] = "no recorded values"
    split = run.get("split") or {}
    if not split.get("target_bytes"):
        raise CannotRedecide(f"--from {old.root}: its run.json records no split (target_bytes); it cannot be re-decided from")
    names = {pos: f"{pos} {kind}" for pos, kind in enumerate(kinds, start=1)}
    tokens = _tokens_reusable(pipeline, config, normalized)
    # A stage's own task folders (annotate's answers journals) are carried over (engine/work_files.py).
    carried = [names[p] for p, kind in enumerate(kinds, start=1) if (old.work / f"stage{p:02d}-{kind}").is_dir()]
    log(
        f"datapipe: re-deciding from {old.root}: signals reused for "
        + (", ".join(names[p] for p, _ in ordered) or "no stage")
        + (f" ({ONLY_UNRECORDED})" if ordered else "")
        + "".join(f"; stage {names[p]} computed ({why})" for p, why in sorted(computed.items()))
        + ("; token lists reused" if tokens else "")
        + "".join(f"; {n}: the earlier run's answers carried over (a request answered there is not sent again)" for n in carried)
    )
    record = {
        "run": str(old.root),
        "fingerprint": run.get("fingerprint"),
        "reused": [names[p] for p, _ in ordered],
        "computed": {names[p]: why for p, why in sorted(computed.items())},
        "tokens_reused": tokens,
        "carried_over": carried,
    }
    return ReusePlan(Recorded(str(old.root), tuple(ordered), tokens), dict(split), record)


def _tokens_reusable(pipeline: Pipeline, old_config: dict[str, Any], normalized: dict[str, Any]) -> bool:
    """Whether a document's token list in the earlier run is the one this run would encode: the same
    tokenizer and settings, and a text no stage of either run changed (then it is the text read)."""
    if not normalized.get("tokenize") or old_config.get("tokenize") != normalized["tokenize"]:
        return False
    for (kind, options), old in zip(pipeline.stage_options, old_config["stages"]):
        cls = STAGES[kind]
        try:
            old_options = cls.Options.model_validate(old[kind])
        except ValueError:  # recorded by another datapipe, with other options: cannot tell
            return False
        if not (cls.keeps_text(options) and cls.keeps_text(old_options)):
            return False
    return True


def _reusable(
    pipeline: Pipeline, old_config: dict[str, Any], old_resources: list[dict[str, Any]]
) -> tuple[dict[int, set[str]], dict[int, str]]:
    """(position -> its output columns) of the stages whose recorded signals stand for ``compute``, and
    (position -> why not) of the per-document stages that are computed."""
    new_resources = pipeline.resources()
    kinds = frozenset(s.kind for s in pipeline.config.sources)
    reused: dict[int, set[str]] = {}
    computed: dict[int, str] = {}
    changed = ""  # the first earlier stage changed other than in thresholds: what it says changed
    owners: dict[str, list[int]] = {}
    for pos, (kind, options) in enumerate(pipeline.stage_options, start=1):
        cls = STAGES[kind]
        old = old_config["stages"][pos - 1][kind]
        new = options.model_dump(mode="json")
        signal = [k for k in sorted(set(old) | set(new)) if k not in cls.decision_options]
        changes = config_changes({k: old.get(k) for k in signal}, {k: new.get(k) for k in signal}, f"stages[{pos - 1}].{kind}")
        changes += resource_changes(
            [e for e in old_resources if e.get("stage") == kind], [e for e in new_resources if e.get("stage") == kind]
        )
        context = CheckContext(pipeline.base_dir, kinds, tuple(pipeline.stage_options[: pos - 1]))
        columns = cls.output_columns(options, context)
        for c in columns or ():
            owners.setdefault(c, []).append(pos)
        if cls.global_for(options):
            pass  # a global stage's signals are computed with its corpus-wide step: always computed
        elif changes:
            computed[pos] = changes[0]
        elif changed:
            computed[pos] = f"its input may differ: {changed}"
        elif not cls.keeps_text(options):
            computed[pos] = "it may rewrite the text"
        elif not columns:
            computed[pos] = "its columns are not known up front" if columns is None else "it adds no signal"
        else:
            reused[pos] = columns
        changed = changed or (changes[0] if changes else "")
    for c, positions in owners.items():  # a column two stages write holds the later one's values
        for pos in positions if len(positions) > 1 else ():
            if reused.pop(pos, None) is not None:
                computed[pos] = f"column {c!r} is written by stages {positions} too"
    return reused, computed


def _column_order(folder: RunFolder, run: dict[str, Any]) -> list[str]:
    """Every column of the run's kept and rejected documents, in the order they were added."""
    order: dict[str, None] = {}
    for top in (folder.docs_dir, folder.rejected_dir):
        for path in sorted(top.rglob("*.parquet")):
            try:
                order.update(dict.fromkeys(pq.read_schema(path).names))
            except (OSError, ValueError) as exc:  # a footer that does not parse
                raise damaged_source(folder, run, path.relative_to(folder.root).as_posix(), f"unreadable ({exc})") from None
    return list(order)


def _check_sizes(folder: RunFolder, run: dict[str, Any]) -> None:
    """Refuse (naming the folder and the file) a run whose documents or token lists a map task would
    read are missing or of another size than their tasks recorded: one stat per file."""
    recorded = RecordedFiles(folder)
    tokens = folder.tokens_dir.relative_to(folder.root).as_posix()
    for rel, entry in sorted(recorded.files(("docs/", "rejected/", f"{tokens}/")).items()):
        what = damage(folder.root / rel, replace(entry, sha256=None))
        if what is not None:
            raise damaged_source(folder, run, rel, what)


def damaged_source(folder: RunFolder, run: dict[str, Any], rel: str, what: str) -> DamagedRunFile:
    """The error for a file of the run re-decided from (``--from``) that is not what its task wrote:
    it names that run folder and the file, and says how to repair it (that run's own command)."""
    command = f"datapipe run {run['pipeline_file']} --output {folder.root}" if run.get("pipeline_file") else None
    return DamagedRunFile(
        f"--from {folder.root}: {folder.root}/{rel}: {what}; it is not the file its task wrote, so its "
        f"recorded signals cannot be read",
        hint=(f"run `{command}` again" if command else f"run the command that wrote {folder.root} again")
        + ": it redoes the damaged file (the same bytes); then run this command again",
    )
