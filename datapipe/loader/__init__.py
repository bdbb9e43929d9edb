"""Streaming loader for packed token shards: deterministic, mixed, sharded, resumable.

Imports only numpy and pyarrow; torch is imported lazily, only by the adapter.

Global samples
    The loader defines an infinite sequence of *global samples* 0, 1, 2, ... and maps each
    number to a (shard, row) by pure arithmetic. Global batch b is samples
    [b*G, (b+1)*G) with G = batch_size * world_size; rank r takes the contiguous slice
    [b*G + r*batch_size, b*G + (r+1)*batch_size); DataLoader worker w of W takes the
    rank's batches b0+w, b0+w+W, ... (b0 = where this pass starts), which torch's
    round-robin over workers returns in order. Ranks and workers therefore read disjoint
    samples, and every rank has the same number of batches.

Epoch
    An epoch is ``samples_per_epoch`` global samples rounded down to a multiple of G
    (default: all rows of the split, or of the mixture's sources). Iterating the dataset
    yields the batches from the current position to the end of the current epoch.
    Without a mixture, epoch e is a seeded permutation of all rows of the split (a new
    permutation per epoch); when the rows are not a multiple of G, fewer than G rows,
    different ones each epoch, sit out that epoch. Otherwise every row appears exactly once.

Mixture
    ``mixture={"web": 0.7, "code": 0.3}`` weights sources by samples, i.e. by sequence
    slots of seq_len tokens (equal to token proportions up to each shard's last, padded
    row). Weights become exact integer shares a_s with period A = sum(a_s) (decimals and
    simple fractions are exact; anything finer than 1/max_mixture_period is rounded, see
    ``realized_weights``). Sources are interleaved by Tijdeman's chairman-assignment rule,
    so after any prefix of n samples, every source has within one sample of w_s * n
    (``mixture_counts(n)`` reports the exact counts). Each source is read in a seeded
    permutation of its rows; when a source runs out it is repeated with a new permutation,
    and a source whose weight needs fewer rows than it has is truncated (the rows it
    reaches differ each pass). The blend runs continuously across epochs.

State
    ``state_dict()`` is {version, consumed_samples, manifest_fingerprint,
    config_fingerprint, config, sources}. ``consumed_samples`` counts global samples handed out;
    since every rank steps together, the state is identical on every rank.
    ``load_state_dict`` continues at exactly that sample, with any number of ranks or
    workers whose global batch size is the same; a changed manifest (shards of the split
    added, removed or rewritten), tokenizer, seq_len, seed, mixture, split, epoch length or
    global batch size raises ``StateMismatch`` (a mixture over other sources is named as
    such, not as changed shards).
    Iterating the dataset in-process advances the count. With DataLoader workers the main
    process never sees the iteration: use ``ds.dataloader(...)`` (a DataLoader that records
    the ``batch_index`` of each batch it returns), or call ``ds.mark_consumed(batch)``.
"""

from datapipe.loader.dataset import PackedDataset, StateMismatch
from datapipe.loader.order import integer_weights, permute
from datapipe.loader.shards import RunIncomplete, ShardPathError
from datapipe.tokens.shard_format import ShardCorrupt


def _torch_dataset() -> type[PackedDataset]:
    from datapipe.loader.torch_adapter import TorchPackedDataset  # imports torch: only when a dataset is built

    return TorchPackedDataset


# ``PackedDataset(...)`` builds the torch adapter when torch is installed. The choice is wired
# here, above both classes, so that dataset.py need not import the adapter that subclasses it.
PackedDataset.torch_class = staticmethod(_torch_dataset)

__all__ = ["PackedDataset", "RunIncomplete", "ShardCorrupt", "ShardPathError", "StateMismatch", "integer_weights", "permute"]
