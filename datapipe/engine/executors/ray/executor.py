"""Tasks on Ray: an embedded one-node Ray on loopback, or a cluster (``--ray-address``).

Every task runs ``worker.ray_run_task`` (the engine's ``run_task`` with a Ray worker's hooks); the
driver submits a phase's tasks at once and yields their outcomes as they finish.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from typing import Any

from datapipe.engine.executors.base import Clock, Outcome, local_cpus, phase_section
from datapipe.engine.executors.ray import recycle
from datapipe.engine.executors.ray.notices import hold_retry_notices
from datapipe.engine.executors.ray.runtime import ray_session
from datapipe.engine.executors.ray.worker import SPEC_FIELDS, ray_run_task, spec_slots
from datapipe.engine.phases import Phase, Task
from datapipe.engine.plan import RunSpec, forget_stages
from datapipe.errors import PipelineError
from datapipe.runtime import kernel_warmup
from datapipe.runtime.faults import fault_env
from datapipe.runtime.release_memory import release_memory


class _RetryableKind(type):
    """``isinstance(exc, Retryable)``: the exception says it may pass on another attempt
    (``DatapipeError.retryable``; any other exception may)."""

    def __instancecheck__(cls, exc: object) -> bool:
        return isinstance(exc, Exception) and bool(getattr(exc, "retryable", True))

    def __subclasscheck__(cls, kind: type) -> bool:
        return issubclass(kind, Exception) and bool(getattr(kind, "retryable", True))


class Retryable(Exception, metaclass=_RetryableKind):
    """Ray's ``retry_exceptions`` allow-list of one: the exceptions a task is retried for. Ray asks
    the error, not its type, so a usage error (the same on every attempt) fails the task at once."""


class RayExecutor:
    """Tasks on Ray, each retried up to ``RETRIES`` times (a lost worker or node): the cluster at
    ``address`` (joined with Ray's own defaults), else an embedded one-node Ray on loopback started
    for the run (``num_cpus``: its CPUs; default all). A Ray this process already joined (a test's,
    a notebook's) is used as it is, and left running."""

    RETRIES = 3
    POLL_SECONDS = 0.2

    def __init__(self, address: str | None = None, num_cpus: int | None = None, log: Callable[[str], None] = print) -> None:
        self.address, self.num_cpus, self._log = address, num_cpus, log
        self._stack = ExitStack()
        self._where = ""
        self._warmup: kernel_warmup.Warmup | None = None
        self._remote: Any = None
        self._shared: tuple[RunSpec, Any, Any] | None = None  # the spec, and refs of it with and without its shards
        self._clock: Clock | None = None

    def __enter__(self) -> RayExecutor:
        # On the first run after an install, the kernels compile in a throwaway process while Ray
        # starts, not in every worker (whose memory would keep the compiler's); see kernel_warmup.
        # A cluster's workers are on other machines: they compile for themselves.
        self._warmup = None if self.address else kernel_warmup.start(self._log, self.num_cpus or local_cpus())
        self._where = "on " + self._stack.enter_context(ray_session(self.address, self.num_cpus))
        hold_retry_notices(ray_run_task.__name__)  # a failed task is told once, by the runner (notices.py)
        import ray

        # One remote function for every phase (exported to the cluster once); phases set their resources.
        # max_calls is never reached by counting: it is how a worker that holds too much exits after
        # handing over its task's result (recycle.py).
        # (Ray's type hints allow only a bool for retry_exceptions; Ray takes an allow-list of classes too.)
        options: dict[str, Any] = {"max_retries": self.RETRIES, "retry_exceptions": [Retryable], "max_calls": recycle.MAX_CALLS}
        self._remote = ray.remote(**options)(ray_run_task)
        return self

    def __exit__(self, *exc: object) -> None:
        self._shared = self._remote = self._clock = None
        self._stack.close()

    def observe(self, clock: Clock) -> None:
        """The run is planned: keep the clock, and drop what planning loaded in this driver (its tasks
        run in Ray's workers)."""
        self._clock = clock
        _drop_planning_state()

    def describe(self) -> str:
        return self._where

    def planned_cpus(self) -> int | None:
        """The CPUs ``cpus`` will report, asked before ``__enter__`` (the runner plans while Ray starts):
        an embedded Ray's ``num_cpus``; None where only the started Ray can tell (a cluster, a Ray this
        process already joined, an embedded one sized by Ray's own count of the machine's CPUs)."""
        if self.address or self.num_cpus is None or "ray" in sys.modules and _ray_initialized():
            return None
        return self.num_cpus

    def cpus(self) -> int:
        import ray

        return int(ray.cluster_resources().get("CPU", 1))

    def outcomes(self, spec: RunSpec, phase: Phase, tasks: Sequence[Task]) -> Iterator[Outcome]:
        import ray

        if self._warmup is not None:  # waited for here, so it overlaps Ray's start and the planning
            self._warmup.wait()
            self._warmup = None
        options = {**fit_gpus(phase, ray.cluster_resources().get("GPU", 0.0)), **fault_env()}
        remote = self._remote.options(**options)
        # The spec is each task's argument by ref (put once per run), unpickled by Ray for every task.
        # Without its shards unless the phase reads them (``Phase.full_spec``): with them it was 2 MB
        # and 87 ms per task at a crawl's 37,253 shards (0.9 s at 372,530); a map task is handed its own
        # shard instead. (Kept in the worker across tasks, workers were replaced for memory ~190 times in
        # a run of 1,602 tasks, against 3: docs/scaling.md.)
        shared = self._spec_ref(spec, phase.full_spec)
        slots, args = spec_slots(spec, tasks, SPEC_FIELDS if phase.full_spec else ("segments",))
        # The phase's name, function and the folders each node prunes: one object in Ray's store for all its tasks.
        # What every task is handed alike (``Phase.same_inputs``: the committed entries of every map output)
        # goes in it too, once, not in each task's arguments.
        same = tasks[0].committed if tasks and phase.same_inputs else None
        call = ray.put((phase.name, phase.fn, phase.prune, slots, same)) if tasks else None
        # Each result arrives through a callback on its ref (on Ray's thread, which also deserializes the
        # marker) that queues it, so the loop costs the same per task however many are pending (polling
        # ``ray.wait`` over the pending refs cost every poll O(pending)).
        done: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        pending = {}
        # A task placed on the node that holds what it reads: its node's options, made once per node
        # and phase, not per task (map1, map2, pack and the rounds that read owners' rows place every task).
        on_node: dict[str | None, Any] = {}
        self._mark(phase, "plan")
        for t, given in zip(tasks, args):
            if not _is_node_id(t.node):
                placed = remote
            elif (placed := on_node.get(t.node)) is None:
                placed = on_node[t.node] = self._remote.options(**{**options, "scheduling_strategy": _on_node(t.node)})
            handed = None if same is not None and t.committed is same else t.committed
            ref = placed.remote(call, shared, (t.key, handed, *given))  # what it reads, as committed
            pending[t.key] = ref  # held until its result came: a dropped ref's object may be freed
            _when_done(ref, partial(_queue_outcome, done, t.key))
        self._mark(phase, "submit")
        while pending:
            try:  # a timeout, so Ctrl-C is seen while every task runs
                key, value = done.get(timeout=self.POLL_SECONDS)
            except queue.Empty:
                continue
            del pending[key]
            yield key, _outcome(value)  # an exception: reported with the others (Ray already retried it)

    def _mark(self, phase: Phase, part: str) -> None:
        if self._clock is not None:
            self._clock.mark(phase_section(phase.name, part))

    def _spec_ref(self, spec: RunSpec, full: bool) -> Any:
        """The spec in Ray's object store (with its shards, or without: ``Phase.full_spec``), each put
        there once per run (not pickled into every task)."""
        import ray

        if self._shared is None or self._shared[0] is not spec:
            self._shared = (spec, ray.put(spec), ray.put(replace(spec, shards=())))
        return self._shared[1] if full else self._shared[2]


def _ray_initialized() -> bool:
    import ray

    return bool(ray.is_initialized())


def _drop_planning_state() -> None:
    """A driver whose tasks run in Ray's workers drops what planning loaded (the tokenizer and the
    fast encoder's plan and verdict) and hands the pages back: it would otherwise hold them through
    every phase, at the run's peak too (bench/perf/pipeline.py). The built stages go with them: a
    stage marked set up must not outlive the models its setup loaded (a later in-process run in this
    process would find it set up and its models gone). Done once the run is planned (``observe``),
    not at enter: a new run is planned after the executor is entered, for the CPUs it has."""
    forget_stages()
    release_memory()


def _when_done(ref: Any, callback: Callable[[Any], None]) -> None:
    """Call ``callback`` (on Ray's thread) with ``ref``'s value, or the exception its task ended with.

    Ray's ``ObjectRef._on_completed``, which ``ObjectRef.future()`` wraps: without the
    ``concurrent.futures.Future`` (its lock and condition), submitting a task costs the driver's own
    thread less (``bench/scaling/driver_scale.py --dispatch``). A Ray without it: the future."""
    on_completed = getattr(ref, "_on_completed", None)
    if on_completed is not None:
        on_completed(callback)
        return

    def settled(fut: Future[Any]) -> None:
        try:
            callback(fut.result())
        except Exception as exc:  # noqa: BLE001 - handed over as the task's outcome
            callback(exc)

    ref.future().add_done_callback(settled)


def _queue_outcome(done: queue.SimpleQueue[tuple[str, Any]], key: str, value: Any) -> None:
    done.put((key, value))


def _outcome(value: Any) -> dict[str, Any] | bytes | Exception:
    """A task's result as ``outcomes`` yields it: a task's own error as the exception it raised (as
    ``ObjectRef.future()`` gives it: Ray's error, also an instance of the cause), others as they are."""
    if isinstance(value, Exception):
        from ray.exceptions import RayTaskError

        if isinstance(value, RayTaskError):
            return value.as_instanceof_cause()
    return value


def _is_node_id(node: str | None) -> bool:
    """A Ray node id (56 hex digits): not None, nor "local" (a run without Ray wrote the marker)."""
    return node is not None and len(node) == 56 and all(c in "0123456789abcdef" for c in node)


def _on_node(node: Any) -> Any:
    """Run on ``node`` while it is alive (waiting for its CPUs), elsewhere once it is gone (soft)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node, soft=True)


def fit_gpus(phase: Phase, cluster_gpus: float) -> dict[str, Any]:
    """A phase's Ray options on this cluster: a GPU request where the cluster has none is dropped when
    optional (the stage runs on CPU there: classify's ``device: auto``) and an error when required
    (a task asking for what no node has would wait forever)."""
    resources = dict(phase.resources)
    if resources.get("num_gpus", 0) and not cluster_gpus:
        if phase.gpus_required:
            raise PipelineError(
                f"phase {phase.name}: its tasks need a GPU (a stage with device: cuda), and the Ray cluster has none",
                hint="run on a cluster with GPU nodes, or use device: auto or cpu",
            )
        resources.pop("num_gpus")
    return resources
