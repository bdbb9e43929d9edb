"""A BatchBuilder that also carries a reader's provenance columns, typed the same in every batch.

Documents and rejects get the same extra columns (null when absent), so the audit database
can say where a rejected record came from as well as a kept one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from datapipe.readers.base import BatchBuilder, InputFile, ReadBatch

_TYPES = {"string": pa.string(), "int32": pa.int32()}


@dataclass
class ColumnsBuilder(BatchBuilder):
    columns: dict[str, str] = field(default_factory=dict)  # name -> "string" | "int32"
    extra_docs: dict[str, list] = field(default_factory=dict)
    extra_rejects: dict[str, list] = field(default_factory=dict)

    @classmethod
    def create(cls, file: InputFile, batch_size: int, columns: dict[str, str]) -> ColumnsBuilder:
        return cls(file, batch_size, columns=columns, extra_docs={c: [] for c in columns}, extra_rejects={c: [] for c in columns})

    def add(self, record: int | str, text: str | None, url: str | None = None, path: str | None = None) -> None:
        super().add(record, text, url, path)
        for values in self.extra_docs.values():
            values.append(None)  # plain add() (shared reader code): the extra columns are null

    def reject(self, record: int | str, reason: str, detail: str, text: str | None = None) -> None:
        super().reject(record, reason, detail, text)
        for values in self.extra_rejects.values():
            values.append(None)

    def add_row(self, record: int | str, text: str, url: str | None = None, path: str | None = None, **cols: object) -> None:
        self.add(record, text, url, path)
        for name, values in self.extra_docs.items():
            values[-1] = cols.get(name)

    def reject_row(
        self,
        record: int | str,
        reason: str,
        detail: str,
        text: str | None = None,
        url: str | None = None,
        path: str | None = None,
        **cols: object,
    ) -> None:
        self.reject(record, reason, detail, text)
        self.rejects["url"][-1] = url  # BatchBuilder.reject leaves url null and path = the input file
        if path is not None:
            self.rejects["path"][-1] = path
        for name, values in self.extra_rejects.items():
            values[-1] = cols.get(name)

    def _doc_lists(self) -> list[list]:
        return [*self.docs.values(), *self.extra_docs.values()]

    def _reject_lists(self) -> list[list]:
        return [*self.rejects.values(), *self.extra_rejects.values()]

    def _doc_types(self) -> list[pa.DataType]:
        return [*super()._doc_types(), *(_TYPES[self.columns[n]] for n in self.extra_docs)]

    def _build(self) -> ReadBatch:
        # Extra columns first: if one cannot be stored, nothing is cleared yet and flush() retries.
        docs_cols = {n: pa.array(v, _TYPES[self.columns[n]]) for n, v in self.extra_docs.items()}
        reject_cols = {n: pa.array(v, _TYPES[self.columns[n]]) for n, v in self.extra_rejects.items()}
        batch = super()._build()
        for values in (*self.extra_docs.values(), *self.extra_rejects.values()):
            values.clear()
        docs, rejects = batch.docs, batch.rejects
        for name, arr in docs_cols.items():
            docs = docs.append_column(pa.field(name, arr.type), arr)
        if rejects is not None:
            for name, arr in reject_cols.items():
                rejects = rejects.append_column(pa.field(name, arr.type), arr)
        return ReadBatch(docs, rejects)
