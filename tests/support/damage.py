"""Damage as disks and people do it, for the fault tests: bits flipped in place, size kept."""

from __future__ import annotations

from pathlib import Path


def flip_data_page(path: Path, column: str = "text") -> int:
    """Flip one bit in the middle of the pages of ``column`` in the first row group (the compressed
    text: unique texts are mostly in its dictionary page), not in the footer: the file keeps its size
    and its footer parses, and the text decodes to something else (checked). Returns the offset."""
    import pyarrow.parquet as pq

    before = pq.read_table(path, columns=[column])
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    meta = next(chunk.column(i) for i in range(chunk.num_columns) if chunk.column(i).path_in_schema == column)
    start = meta.dictionary_page_offset or meta.data_page_offset
    at = start + meta.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))
    try:
        assert not pq.read_table(path, columns=[column]).equals(before)  # decodes, to other text
    except OSError:
        pass  # or does not decode at all
    return at
