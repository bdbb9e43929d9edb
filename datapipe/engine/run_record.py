"""A run folder's record (run.json): what a run is, checked on every start, updated as it goes.

A run folder holds one run: the pipeline's normalized config, the rule files and models it reads
(``resources``) and its input files (size, modification time and change token; sha256 where one
task read the file whole). A start with any of them changed is refused (unless ``--fresh``): the
finished tasks would mix two runs. Inputs are also checked against what the finished tasks read
(their markers' hashes, engine/input_identity.py) at every resume and before the run is recorded
complete. The record also keeps how the run was split into map tasks, its attempts, timings and counts.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from datapipe.engine.errors import PipelineError
from datapipe.engine.input_identity import InputChanged, Reads, check_inputs, whole_file_sha256
from datapipe.engine.plan import RunSpec
from datapipe.engine.work_files import STAGE_WORK
from datapipe.errors import EXIT_USAGE
from datapipe.pipeline.identity import config_changes, identity_config, resource_changes
from datapipe.pipeline.load import Pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.storage.uri import folder_stat, input_key, input_stat, is_uri

PACKAGES = ("datapipe", "pyarrow", "ray", "duckdb", "tokenizers", "fastokens", "datasketch", "fasttext-numpy2", "numpy")


@dataclass
class RunRecord:
    """run.json as this attempt keeps it (``run``: saved at each step), with what today's pipeline reads."""

    folder: RunFolder
    run: dict[str, Any]
    normalized: dict[str, Any]
    resources: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    reads: Reads | None = None  # what the finished tasks read, once checked at the end

    @property
    def split(self) -> dict[str, Any]:
        """How the run was split into map tasks (``target_bytes``, ``cpus``, ``map_tasks``); {} before planning."""
        return self.run.get("split") or {}

    def start_attempt(self, pipeline: Pipeline) -> None:
        self.run.update(
            {
                "name": pipeline.name,
                "fingerprint": pipeline.fingerprint(),
                "config": self.normalized,
                "resources": self.resources,
                "inputs": self.inputs,
                "pipeline_file": str(pipeline.file) if pipeline.file else None,
                "status": "running",
                "packages": _package_versions(),
                "python": platform.python_version(),
            }
        )
        self.run.setdefault("started", _now())
        self.run.setdefault("attempts", 0)
        self.run["attempts"] += 1
        self.folder.save_run_json(self.run)

    def record_split(self, target: int, cpus: int, map_tasks: int) -> None:
        # Recorded, so a resumed run forms the same tasks (and finds their markers) on any cluster.
        self.run["split"] = {"target_bytes": target, "cpus": cpus, "map_tasks": map_tasks}
        self.folder.save_run_json(self.run)

    def check_inputs(self, log: Callable[[str], None]) -> None:
        """Every task done: refused (:class:`InputChanged`) if an input is not what the tasks read."""
        self.reads = check_inputs(self.folder, self.inputs, at_end=True, log=log)

    def check_finished(self, pipeline: Pipeline, spec: RunSpec) -> None:
        """Every task done: the inputs' hashes recorded, and the run refused if a rule file changed meanwhile."""
        _record_input_hashes(self.reads or {}, self.inputs)
        _check_resources_unchanged(pipeline, self.resources)

    def complete(self, timings: dict[str, float], counts: dict[str, Any]) -> None:
        self.run.update({"status": "complete", "finished": _now(), "timings": timings, "counts": counts})
        models = trained_models(self.folder)
        if models:
            self.run["models"] = models
        self.folder.save_run_json(self.run)


def trained_models(folder: RunFolder) -> dict[str, Any]:
    """The models the run's stages trained (classify's ``train``), by path in the run folder: what each is,
    its hash, what it learnt from and its held-out quality, as its ``.meta.json`` records them."""
    out: dict[str, Any] = {}
    for meta_file in sorted(folder.models_dir.glob("*/*.meta.json")):
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or not (model := meta_file.parent / str(meta.get("model", ""))).is_file():
            continue
        out[model.relative_to(folder.root).as_posix()] = {
            k: meta.get(k) for k in ("task", "model_sha256", "source", "labels", "counts", "eval")
        }
    return out


def open_record(pipeline: Pipeline, folder: RunFolder, fresh: bool, log: Callable[[str], None]) -> RunRecord:
    """The folder's record, refused if it is of another pipeline, rule files or inputs (``fresh``: wiped
    instead), and the folder ready to run in: created, and temporary files of a killed run swept.
    The caller holds the folder's lock."""
    folder.check_usable()
    folder.pull(full=True)  # a run folder in object storage: its mirror takes what the store committed
    normalized = pipeline.normalized()
    resources = pipeline.resources()
    inputs = input_listing(pipeline)
    previous = None if fresh else folder.load_run_json()  # --fresh: even a damaged one is discarded
    if previous is not None and not fresh:
        _refuse_changed(folder, previous, normalized, resources, inputs, log, pipeline)
        check_inputs(folder, inputs, at_end=False, log=log)  # same size and time: what the tasks read?
    if fresh:
        folder.wipe(keep=(STAGE_WORK,))  # the stages' paid work (answers) is found by request, not by run
    folder.root.mkdir(parents=True, exist_ok=True)
    swept = folder.sweep()  # safe: we hold the lock, so no live writer of this folder exists
    if swept:
        log(f"datapipe: removed {swept} temporary file(s) left by an interrupted run")
    run = previous if previous is not None and not fresh else {}
    return RunRecord(folder, run, normalized, resources, inputs)


class RunFolderHoldsAnotherRun(PipelineError):
    """The output folder holds a run of another pipeline or rule files: as asked, the run cannot be done
    there (a usage problem, exit 2); --fresh, --output, or --from when only thresholds changed."""

    exit_code = EXIT_USAGE


def _refuse_changed(
    folder: RunFolder,
    previous: dict[str, Any],
    normalized: dict[str, Any],
    resources: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    log: Callable[[str], None],
    pipeline: Pipeline,
) -> None:
    # A stage's run settings (a server's address, concurrency) may change between attempts.
    changes = config_changes(identity_config(previous.get("config", {})), identity_config(normalized))
    if "resources" in previous:
        changes += resource_changes(previous["resources"], resources)
    else:  # a run.json from before rule files were recorded: nothing to compare them with
        log(f"datapipe: {folder.run_json} records no rule files or models; recording today's")
    inputs_changed = input_changes(previous.get("inputs", []), inputs, by_reads=True)
    changes += inputs_changed
    if not changes:
        return
    message = f"{folder.root} holds a run of a different pipeline, rule files or inputs; changed since then:\n" + "\n".join(
        f"  - {c}" for c in changes[:30]
    )
    if changes == inputs_changed:  # then putting the files back is a way on too (and resumes: exit 1)
        raise InputChanged(
            message + "\nUse --fresh to discard that run and start over, put the input files back as they were, "
            "or --output to write elsewhere."
        )
    hint = None
    if not inputs_changed and not resource_changes(previous.get("resources", resources), resources):
        if previous.get("status") == "complete" and thresholds_only(previous.get("config", {}), normalized):
            file = str(pipeline.file) if pipeline.file else "PIPELINE"
            hint = (
                f"only thresholds changed: `datapipe run {file} --from {folder.root} --output NEW_FOLDER` "
                "re-decides from this run's recorded signals without computing them again"
            )
    raise RunFolderHoldsAnotherRun(
        message + "\nUse --fresh to discard that run and start over, or --output to write elsewhere.", hint=hint
    )


def thresholds_only(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether two normalized configs differ only in the stages' decision options (``Stage.decision_options``:
    thresholds), the stages being the same in the same order: what ``run --from`` re-decides."""
    from datapipe.stages import STAGES  # late, as identity_config

    def without_thresholds(config: dict[str, Any]) -> Any:
        config = identity_config(config)
        stages = []
        for entry in config.get("stages") or []:
            if isinstance(entry, dict) and len(entry) == 1:
                ((kind, options),) = entry.items()
                drop = STAGES[kind].decision_options if kind in STAGES else frozenset()
                if isinstance(options, dict):
                    entry = {kind: {k: v for k, v in options.items() if k not in drop}}
            stages.append(entry)
        return {**config, "stages": stages}

    return old != new and without_thresholds(old) == without_thresholds(new)


def _check_resources_unchanged(pipeline: Pipeline, recorded: list[dict[str, Any]]) -> None:
    """A rule file edited while tasks ran may have judged some documents by the old rules and some by the
    new (a worker reads it when it first builds the stage): such a run is not marked complete."""
    changes = resource_changes(recorded, pipeline.resources())
    if changes:
        raise PipelineError(
            "files the run depends on changed while it ran, so its documents may be judged by "
            "both versions:\n"
            + "\n".join(f"  - {c}" for c in changes[:30])
            + "\nRun again with --fresh to judge every document by today's files."
        )


def input_changes(old: list[dict[str, Any]], new: list[dict[str, Any]], by_reads: bool = False) -> list[str]:
    """What differs between two listings of the inputs. ``by_reads``: an object of the same size whose
    modification time alone differs is left to the check of what the finished tasks read
    (``input_identity.check_inputs``, which reads the extents they read again where its version
    differs): an object store has no way to put a time back, so a store restored from a copy (the same
    bytes uploaded again) shows new times; the tasks' hashes tell whether it holds what they read, and
    an object no finished task read decides nothing done so far."""
    before = {(i["source"], i["path"]): i for i in old}
    after = {(i["source"], i["path"]): i for i in new}
    out = [f"input added: {p} (source {s})" for s, p in after.keys() - before.keys()]
    out += [f"input removed: {p} (source {s})" for s, p in before.keys() - after.keys()]
    for key in sorted(before.keys() & after.keys()):
        size_kept = before[key].get("bytes") == after[key].get("bytes")
        if size_kept and (before[key].get("mtime") == after[key].get("mtime") or (by_reads and is_uri(key[1]))):
            continue
        out.append(f"input modified: {key[1]} (size or modification time differs)")
    return sorted(out)


def _record_input_hashes(reads: Reads, inputs: list[dict[str, Any]]) -> None:
    """Attach the sha256 of each input a task read whole (hashed as it read it: no second read). A file
    read in ranges (split) or in pieces (Parquet row groups) has none; its tasks' markers keep the
    hashes of what each read."""
    for entry in inputs:
        sha = whole_file_sha256(reads, entry["path"], entry["bytes"])
        if sha is not None:
            entry["sha256"] = sha


def input_listing(pipeline: Pipeline) -> list[dict[str, Any]]:
    listing = []
    for source, files in pipeline.inputs.items():
        for path, fmt in files:
            # an input in object storage: as the store listed it, not downloaded; a folder input: its files
            st = input_stat(path) or folder_stat(path)
            if st is None:
                raise FileNotFoundError(path)
            # an input in object storage by its URI: the same on every machine, whatever its mirror path
            entry = {"source": source, "path": input_key(path), "format": fmt, "bytes": st.size, "mtime": int(st.mtime)}
            if st.change is not None:  # what tells a rewrite with the same size and time (engine/input_identity.py)
                entry.update({"mtime_ns": st.mtime_ns, "change": st.change})
            listing.append(entry)
    return listing


def _package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
