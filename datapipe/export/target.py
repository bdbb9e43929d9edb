"""Where an export's files go: a local folder, or a folder in object storage.

An export to object storage (``--output s3://bucket/exports/mds``) writes each file in a local
staging folder (the URI's mirror in the cache) exactly as a local export does, then uploads it and
removes the local copy, so the disk holds one part at a time. The manifest is uploaded after the
files it names: as a task marker is for a run folder, it is the commit point. An object store
shows an object only once its upload completed, so a manifest on the store names files that are
all there whole. A killed export resumes from the store alone, on any machine: the staging folder
starts empty, takes the store's manifest, and the parts it lists (present on the store with their
recorded sizes) are skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from datapipe.export.documents import ExportError
from datapipe.run_folder.layout import LOCK_FILE, LOCK_RECORD
from datapipe.storage import uri as storage


class ExportTarget:
    """The output folder of one export: ``out`` is where files are written (the folder itself,
    or the staging mirror of ``uri``); ``name`` is what the user named (path or URI)."""

    def __init__(self, output: str | Path, manifest_name: str) -> None:
        self.manifest_name = manifest_name
        self.uri: str | None = None
        if storage.is_uri(output):
            self.uri = str(output).rstrip("/")
            try:
                storage.check_bucket(self.uri)
                self.out = storage.mirror_of(self.uri)
            except storage.StorageError as exc:
                raise ExportError(f"--output: {exc}") from None
        else:
            self.out = Path(output).resolve()
        self._sizes: dict[str, int] | None = None

    @property
    def name(self) -> str:
        return self.uri or str(self.out)

    @property
    def remote(self) -> bool:
        return self.uri is not None

    def inside(self, run_location: str) -> bool:
        """Whether this folder is the run folder at ``run_location`` or inside it."""
        if self.uri is None:
            run = Path(run_location)
            return self.out == run or run in self.out.parents
        return self.uri == run_location or self.uri.startswith(run_location.rstrip("/") + "/")

    def pull(self) -> None:
        """Remote: a fresh staging folder holding the store's manifest, if the store has one. Refuses
        a store folder with other objects and no manifest, as a local export refuses such a folder."""
        if self.uri is None:
            return
        listed = {f.uri[len(self.uri) + 1 :]: f.size for f in storage.list_files(self.uri)}
        if set(listed) - {LOCK_RECORD} and self.manifest_name not in listed:
            raise ExportError(
                f"--output: {self.uri} is not empty and holds no {self.manifest_name}; refusing to "
                f"write there (choose an empty or new folder)"
            )
        self._sizes = listed
        # the store is the record; staging is a cache (but for the lock this export holds on it)
        for p in list(self.out.iterdir()) if self.out.is_dir() else []:
            if p.name in (LOCK_FILE, LOCK_RECORD):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.manifest_name in listed:
            storage.download(storage.child(self.uri, self.manifest_name), self.out / self.manifest_name)

    def present(self, rel: str, size: int) -> bool:
        """A file an earlier attempt recorded is whole where it should be."""
        if self.uri is None:
            path = self.out / rel
            return path.is_file() and path.stat().st_size == size
        return (self._sizes or {}).get(rel) == size

    def commit(self, rels: Iterable[str]) -> None:
        """Remote: upload these finished files, then drop their local copies. Local: nothing to do."""
        if self.uri is None:
            return
        for rel in rels:
            storage.upload(self.out / rel, storage.child(self.uri, rel))
            (self.out / rel).unlink()

    def commit_manifest(self) -> None:
        """Remote: upload the manifest (after the files it names)."""
        if self.uri is not None:
            storage.upload(self.out / self.manifest_name, storage.child(self.uri, self.manifest_name))

    def delete(self, rels: Iterable[str]) -> None:
        """--fresh on the store: remove what an earlier export recorded, then its manifest."""
        if self.uri is None:
            return
        for rel in [*rels, self.manifest_name]:
            storage.delete(storage.child(self.uri, rel))
        self._sizes = {}
