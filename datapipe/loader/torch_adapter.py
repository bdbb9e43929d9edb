"""The torch side of the loader: an IterableDataset and a DataLoader that tracks state.

Imported only when torch is installed (``PackedDataset(...)`` picks it automatically).
Arrays become tensors with ``torch.from_numpy``: no copy, token dtype kept (uint16 for
most vocabularies; call ``.long()`` on the device).

Batches from ``ds.dataloader(num_workers>0)``'s workers cross the process boundary as runs of
consecutive batches packed in *one* shared-memory buffer (``pack`` in the worker, ``unpack`` in
the main process). torch shares each tensor of an item separately: a shared-memory segment
created and mapped, and its file descriptor handed over through an authenticated socket
connection to the worker (~1 ms of CPU on the loaded 2-core box, more than the loader's own
work for a batch of 8 x 2048, ~10-40 us), per tensor and item. Plain ``DataLoader(ds)`` paid it
for every field of every batch (3 tensors a batch tokens-only, 7 with the default fields);
now it is paid once per run of up to ``_RUN_BYTES`` of batches. The loop still gets one
dict of tensors per batch, in global batch order, and the state after each batch is exact.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Iterator
from multiprocessing import context as mp_context
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from datapipe.loader.dataset import PackedDataset


class TorchPackedDataset(PackedDataset, IterableDataset):
    """PackedDataset as a torch IterableDataset: each DataLoader worker reads every
    num_workers-th batch of this rank. Use with ``batch_size=None`` (batches are built here),
    ideally through ``ds.dataloader(...)`` so that ``state_dict()`` stays exact."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # PackedDataset.__init__'s, passed on as they are
        super().__init__(*args, **kwargs)
        # Set by worker processes; lets state_dict() refuse to report a count it cannot know.
        self._workers_ran = multiprocessing.RawValue("b", 0)
        self._tracked = False

    # The same batches as PackedDataset's, as tensors: the adapter's point, not a substitutable override.
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        info = get_worker_info()
        if info is None:
            batches = self.iter_batches()
        else:
            if self._workers_ran is not None:
                self._workers_ran.value = 1
            batches = self.iter_batches(info.id, info.num_workers, in_process=False)
        for batch in batches:
            yield {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}

    def dataloader(self, num_workers: int = 0, **kwargs: Any) -> TrackingDataLoader:  # DataLoader's keywords
        """A torch DataLoader over this dataset that keeps ``state_dict()`` exact. With workers
        (and no ``collate_fn`` of the caller's), each worker sends runs of consecutive batches
        in one shared-memory buffer; the loop gets the same batches, one at a time, as
        without workers."""
        if kwargs.setdefault("batch_size", None) is not None:
            raise ValueError("the dataset yields whole batches; leave the DataLoader's batch_size=None")
        if num_workers > 0:
            # Every torch worker seeds numpy's global generator (torch.utils.data._utils.worker),
            # importing numpy.random unless it is there: imported here, forked workers share it
            # instead of each paying ~0.1 s of CPU and its pages at start.
            import numpy.random  # noqa: F401
        if num_workers > 0 and kwargs.get("collate_fn") is None:
            kwargs["collate_fn"] = _as_is
            return TrackingDataLoader(_WorkerRuns(self), num_workers=num_workers, tracked=self, **kwargs)
        return TrackingDataLoader(self, num_workers=num_workers, **kwargs)

    def mark_consumed(self, batch: dict) -> None:
        self._tracked = True
        super().mark_consumed(batch)

    def state_dict(self) -> dict:
        if self._workers_ran is not None and self._workers_ran.value and not self._tracked:
            raise RuntimeError(
                "DataLoader workers read this dataset but the main process was never told which batches "
                "the training loop consumed, so the saved position would be wrong. Iterate "
                "ds.dataloader(num_workers=...) instead of DataLoader(ds, ...), or call "
                "ds.mark_consumed(batch) for each batch."
            )
        return super().state_dict()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        # Shared memory travels only to processes being started (DataLoader workers);
        # any other pickling (Ray, deepcopy) drops it rather than failing.
        if mp_context.get_spawning_popen() is None:
            state["_workers_ran"] = None
        return state


class TrackingDataLoader(DataLoader):
    """A DataLoader that records the global batch number of every batch it returns, so the
    dataset's ``state_dict()`` resumes right after the last batch the loop received."""

    def __init__(self, dataset: Any, *args: Any, tracked: TorchPackedDataset | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self.tracked: TorchPackedDataset = dataset if tracked is None else tracked

    def __len__(self) -> int:
        return len(self.tracked)  # batches, also when workers send runs of them

    # A generator over DataLoader's own iterator (typed as its _BaseDataLoaderIter class): a plain iterator
    # is all a training loop uses.
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        ds = self.tracked
        for item in super().__iter__():
            for batch in unpack(item) if PACKED in item else (item,):
                ds.mark_consumed(batch)
                yield batch


# A run of batches a worker sends at once: up to this many bytes, at most _MAX_RUN batches.
_RUN_BYTES = 1 << 20
_MAX_RUN = 32
# The key of an item packed by a worker (a dict, so that pin_memory pins its buffer).
PACKED = "datapipe.loader.packed"
_ALIGN = 64  # each field starts on a cache line (and at a multiple of every dtype's size)


class _WorkerRuns(IterableDataset):
    """What ``ds.dataloader``'s workers iterate: after one batch each, runs of ``chunk``
    consecutive batches of the dataset (worker w of W takes runs w, w + W, ...:
    ``PackedDataset.plan``), each packed into one shared-memory buffer."""

    def __init__(self, ds: TorchPackedDataset) -> None:
        self.ds = ds
        one = (
            sum(
                ds.batch_size * (ds.seq_len if f in ("input_ids", "labels", "position_ids", "loss_mask") else ds.max_segments + 1)
                for f in ds.fields
            )
            * 4
        )
        self.chunk = max(1, min(_MAX_RUN, _RUN_BYTES // one))

    def __len__(self) -> int:
        return len(self.ds)  # batches: the items (runs of them) are fewer

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ds, info = self.ds, get_worker_info()
        if info is None:  # only DataLoader workers iterate this
            raise RuntimeError("_WorkerRuns is read by DataLoader workers only; iterate the dataset itself")
        if ds._workers_ran is not None:
            ds._workers_ran.value = 1
        # The objects this worker inherited (torch's, the training script's) leave the cyclic collector's
        # generations (the gc module's recipe for fork without exec), so its full collections do not walk
        # them: a walk writes to every inherited object's header, copying each page from the parent. Done
        # here, in the worker, and not in the training process, whose garbage stays the collector's.
        # On the loaded 2-core box, freezing before the fork made a W=2 epoch's first batch come 0.5-0.9 s
        # after the iterator's creation instead of 1.4-2.3 s.
        gc.freeze()
        run: list[dict[str, np.ndarray]] = []
        size = 1  # the first item is one batch (see PackedDataset.plan), then runs of self.chunk
        for batch in ds.iter_batches(info.id, info.num_workers, in_process=False, chunk=self.chunk):
            run.append(batch)
            if len(run) == size:
                yield pack(run)
                run, size = [], self.chunk
        if run:
            yield pack(run)


def _as_is(item: Any) -> Any:
    """collate_fn of the workers' packed runs (module level: spawned workers unpickle it)."""
    return item


def pack(run: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Batches as one shared-memory uint8 buffer plus their layout (in the worker): one
    segment and one descriptor cross the process boundary per run instead of one per field
    and batch. 0-d fields (``batch_index``) travel as numbers."""
    # Per batch, per field: (name, numpy dtype code, shape or None for a 0-d field, byte offset or value).
    layouts: list[tuple[tuple[str, str, tuple[int, ...] | None, Any], ...]] = []
    total = 0
    for batch in run:
        layout: list[tuple[str, str, tuple[int, ...] | None, Any]] = []
        for name, a in batch.items():
            if a.ndim == 0:
                layout.append((name, a.dtype.str, None, a.item()))
                continue
            layout.append((name, a.dtype.str, a.shape, total))
            total += -(-a.nbytes // _ALIGN) * _ALIGN
        layouts.append(tuple(layout))
    buf = torch.empty(0, dtype=torch.uint8)
    buf.set_(torch.UntypedStorage._new_shared(max(total, 1)))  # created in shared memory: no copy when pickled
    flat = buf.numpy()
    for batch, fields in zip(run, layouts):
        for (_, _, shape, off), a in zip(fields, batch.values()):
            if shape is not None:  # input_ids and labels are strided views of one gather: copied contiguous
                np.copyto(flat[off : off + a.nbytes].view(a.dtype).reshape(shape), a)
    return {PACKED: buf, "layouts": tuple(layouts)}


_DTYPES: dict[str, torch.dtype] = {}


def unpack(item: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """The batches ``pack`` built, as views of its one buffer (pinned too when the DataLoader
    pins memory)."""
    buf, out = item[PACKED], []
    for layout in item["layouts"]:
        batch = {}
        for name, code, shape, value in layout:
            dtype = _DTYPES.get(code)
            if dtype is None:
                dtype = _DTYPES[code] = torch.from_numpy(np.empty(0, np.dtype(code))).dtype
            if shape is None:
                batch[name] = torch.tensor(value, dtype=dtype)
            else:
                n = int(np.prod(shape)) * dtype.itemsize
                batch[name] = buf[value : value + n].view(dtype).view(shape)
        out.append(batch)
    return out
