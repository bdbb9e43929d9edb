"""What a reader declares about its input format, once, in its own module.

Every place that needs to know something about a format asks its ``ReaderSpec`` (through the
registry in ``datapipe/readers/__init__.py``): format inference from names, folders and archives,
the options check, whether an object in object storage is read in place, how the engine may cut a
large file into ranges, the record-numbering pre-pass of split files, and the field probe of
``validate``. A new input format is one module declaring a spec plus one registration line (or an
entry point in group ``datapipe.readers`` of another package: ``datapipe/plugins``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from datapipe.readers.base import InputFile, ReadBatch

Reader = Callable[[InputFile, int], Iterator[ReadBatch]]
# (path, size in bytes, target bytes per range, even byte cuts 0 = c0 < c1 < ...) -> range starts.
# The engine chooses how many ranges a file should get (its even cuts); the format moves each cut to
# where a record starts, or plans its own units (Parquet: row groups near the target). A start list
# of one element ([0]) means the file is read whole.
SplitPoints = Callable[[Path, int, int, list[int]], list[int]]
# (path, start, end) -> what InputFile.first_record counts in that byte range (JSONL: newlines).
# Additive over adjacent ranges: the count before a range is the sum over the ranges before it.
RangeCount = Callable[[str, int, int | None], int]
# (path, limits.max_record_bytes) -> field names of the file's first records (None: no record could
# be read to tell). A probe holds no more of one record than the reader would (max_record_bytes).
FieldProbe = Callable[[Path, int], set[str] | None]


@dataclass(frozen=True)
class ReaderSpec:
    format: str  # the name pipeline files give as sources[i].format
    read: Reader
    options: type[BaseModel] | None = None  # the model of sources[i].options; None: the reader takes none
    suffixes: tuple[str, ...] = ()  # lower-case file name endings; the longest match over all formats wins
    # Endings this format claims only for sources of a kind (arXiv ships single-file sources as a
    # bare gzipped .tex, 1603.07285.gz): matched like ``suffixes``, a kind's ending before an equal general one.
    kind_suffixes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    # An object in object storage is read in place (storage.open_input, ranged reads). False: the
    # reader gets a whole local copy (it walks folders or archive members).
    streamed: bool = False
    folders: bool = False  # an input may be a folder (a repository, a folder of HTML pages)
    folder_kinds: frozenset[str] = frozenset()  # a folder in a source of these kinds is this format
    archive_kinds: frozenset[str] = frozenset()  # so is a .tar.gz/.zip/... in a source of these kinds
    split_points: SplitPoints | None = None  # None: a file is always one range
    split_unit: Literal["bytes", "row_groups"] = "bytes"  # what split points count (InputFile.start/end)
    prepass_count: RangeCount | None = None  # records numbered across ranges need a counting pre-pass
    # Records are mappings of named fields: sources[i].license_field (like text_field) is read from them.
    named_fields: bool = False
    probe_fields: FieldProbe | None = None  # validate checks text_field against the first file's fields
    probed_as: str = "field of the first records of"  # how that check's message names what it read

    def __post_init__(self) -> None:
        problems = []
        if not self.format or not isinstance(self.format, str):
            problems.append(f"format must be a non-empty string, got {self.format!r}")
        if not callable(self.read):
            problems.append("read must be a function (InputFile, batch_size) -> ReadBatch iterator")
        if self.options is not None and not (isinstance(self.options, type) and issubclass(self.options, BaseModel)):
            problems.append(f"options must be a pydantic model class or None, got {self.options!r}")
        endings = [*self.suffixes, *(s for group in self.kind_suffixes.values() for s in group)]
        bad = [s for s in endings if not (isinstance(s, str) and s.startswith(".") and s == s.lower())]
        if bad:
            problems.append(f"suffixes must be lower-case strings starting with '.', got {bad}")
        if self.folder_kinds and not self.folders:
            problems.append("folder_kinds needs folders=True")
        if self.split_unit not in ("bytes", "row_groups"):
            problems.append(f"split_unit must be 'bytes' or 'row_groups', got {self.split_unit!r}")
        if self.prepass_count is not None and self.split_unit != "bytes":
            problems.append("prepass_count counts within byte ranges: it needs split_unit='bytes'")
        if problems:
            raise ValueError(f"reader spec {self.format!r}: " + "; ".join(problems))


__all__ = ["FieldProbe", "RangeCount", "Reader", "ReaderSpec", "SplitPoints"]
