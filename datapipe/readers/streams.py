"""Opening input files as byte streams, decompressing by extension."""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path
from typing import IO


def open_maybe_compressed(path: Path) -> IO[bytes]:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        import pyarrow as pa

        return pa.input_stream(str(path), compression="zstd")  # type: ignore[return-value]
    return path.open("rb")
