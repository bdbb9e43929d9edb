"""Code points of a batch of texts, decoded from an Arrow string array's UTF-8 in one compiled pass.

A Python string per text, their join and the join encoded as UTF-32 cost more than the pass that
then reads the code points (langid's script counts, MinHash's shingles).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pyarrow as pa

try:  # numba (a datapipe dependency) compiles the decoding loop; Python strings are the fallback
    from datapipe.runtime.jit import arr, lazy_numba

    numba: ModuleType | None = lazy_numba()  # the kernel compiles (or loads) on its first call
except ImportError:  # pragma: no cover
    numba = None


def joined_code_points(texts: list[str] | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Code points of the texts joined by newlines (``"\\n".join(texts)``), and each text's length + 1."""
    if isinstance(texts, pa.Array) and pa.types.is_string(texts.type) and not texts.null_count and _decode_kernel is not None:
        # Decoding the Arrow array's UTF-8 in one compiled pass skips making a Python string of
        # every text, joining them and encoding the join as UTF-32 (most of langid's own CPU otherwise).
        _, off_buf, data_buf = texts.buffers()
        offsets = np.frombuffer(off_buf, dtype=np.int32)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        data.flags.writeable = False  # one compiled signature (kernel_warmup)
        body = data[offsets[0] : offsets[-1]]
        chars = int(np.count_nonzero((body & 0xC0) != 0x80))  # UTF-8 lead bytes
        cps = np.empty(chars + max(len(texts) - 1, 0), dtype=np.uint32)
        lengths = np.empty(len(texts), dtype=np.int64)
        _decode_kernel(data, offsets, cps, lengths)
        cps.flags.writeable = False  # as the strings' path gives it: one signature of the counting kernel
        return cps, lengths
    if isinstance(texts, pa.Array):
        texts = [t or "" for t in texts.to_pylist()]
    cps = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype=np.uint32)
    return cps, np.fromiter((len(t) + 1 for t in texts), dtype=np.int64, count=len(texts))


def _decode_loop(data, offsets, cps, lengths):  # pragma: no cover - compiled
    """UTF-8 (valid: an Arrow string array's) to code points, a newline between texts; chars per text + 1."""
    pos = 0
    for d in range(offsets.shape[0] - 1):
        if d > 0:
            cps[pos] = 10
            pos += 1
        start = pos
        i = offsets[d]
        end = offsets[d + 1]
        while i < end:
            b = data[i]
            if b < 0x80:
                cps[pos] = b
                i += 1
            elif b < 0xE0:
                cps[pos] = ((b & 0x1F) << 6) | (data[i + 1] & 0x3F)
                i += 2
            elif b < 0xF0:
                cps[pos] = ((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
                i += 3
            else:
                cps[pos] = ((b & 0x07) << 18) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F)
                i += 4
            pos += 1
        lengths[d] = pos - start + 1


_decode_kernel = (
    numba.njit(cache=True, nogil=True, warm=[(arr("uint8", readonly=True), arr("int64"), arr("uint32"), arr("int64"))])(
        _decode_loop
    )
    if numba is not None
    else None
)
