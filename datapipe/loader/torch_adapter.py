"""The torch side of the loader: an IterableDataset and a DataLoader that tracks state.

Imported only when torch is installed (``PackedDataset(...)`` picks it automatically).
Arrays become tensors with ``torch.from_numpy``: no copy, token dtype kept (uint16 for
most vocabularies; call ``.long()`` on the device).
"""

from __future__ import annotations

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
        """A torch DataLoader over this dataset that keeps ``state_dict()`` exact."""
        if kwargs.setdefault("batch_size", None) is not None:
            raise ValueError("the dataset yields whole batches; leave the DataLoader's batch_size=None")
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

    # A generator over DataLoader's own iterator (typed as its _BaseDataLoaderIter class): a plain iterator
    # is all a training loop uses.
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        ds: TorchPackedDataset = self.dataset  # type: ignore[assignment]
        for batch in super().__iter__():
            ds.mark_consumed(batch)
            yield batch
