"""Where a path lives: local disk or object storage (``s3://``, ``gs://``, ``hdfs://``), and the file
operations datapipe needs on either, through ``pyarrow.fs``. Every file-system decision is here.

Credentials and endpoints come from the usual environment of each store, read by pyarrow itself:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``/``AWS_PROFILE``,
``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL`` (an S3-compatible server: MinIO, moto, Ceph) for S3;
``GOOGLE_APPLICATION_CREDENTIALS`` for GCS; ``HADOOP_HOME``/``CLASSPATH`` for HDFS. A scheme
pyarrow lacks is taken from fsspec when it is installed (``pyarrow.fs.FSSpecHandler``).

A remote path has a local *mirror* path under ``<cache>/remote-mirror/<scheme>/<bucket>/<key>``,
which names the remote one (:func:`remote_of`), so any process of the run, on any node, finds the
object behind a mirror path it is handed. A run folder in object storage is worked on in its
mirror and committed to the store by completion markers (``run_folder/remote.py``).

An input in object storage is named by its mirror path but never downloaded whole by the driver:
its size and time come from the store's listing (:func:`input_stat`), and whatever reads it
(split planning, the ``text_field`` check, the JSONL/Parquet/WARC readers of a map task) opens it
with :func:`open_input`, which reads the object in place through ranged requests. Only readers
that need a real local file (folders and archives: html, repo, arxiv) get a mirror copy
(:func:`ensure_local`, once per node, again when the object's size or time changes).

Inside a map task, :func:`open_input` also records what is read (``storage/input_reads.py``): the
file's identity when opened (:func:`input_identity`) and a hash of the bytes read, so a run can
tell later whether its inputs still hold what its tasks read (``engine/input_identity.py``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from datapipe.config.input_names import display_name
from datapipe.errors import DatapipeError
from datapipe.storage.input_reads import HashingRaw, extents_sha256, note_read, note_unavailable, recording

# The mirror's folder name: a mirror path is recognised by it, so a Ray worker whose cache
# folder differs from the driver's still finds the URI behind the path it is handed.
MIRROR_DIR = "remote-mirror"
T = TypeVar("T")


class StorageError(DatapipeError, RuntimeError):
    """A remote path that cannot be used; the message names it and says what is wrong."""


class InputUnavailable(StorageError):
    """An input the run planned cannot be read because of where it is kept, not because of its bytes:
    an object gone from its store (it was listed when the run was planned), a store that does not
    answer within the retries, a local file removed or not readable. Never a reject: a reader that
    catches it (they turn unreadable bytes into ``unreadable_input`` rejects) does not hide it, since
    it is noted for the task as it is raised (``storage/input_reads.py``) and the map task raises it
    again (engine/tasks/map.py ``_guarded``); the task fails, is retried, and the run stops with one
    error naming the store and the files (engine/runner.py)."""

    def __init__(self, path: str, what: str, hint: str | None = None) -> None:
        super().__init__(f"{path}: {what}", hint=hint)
        self.path = path

    @property
    def store(self) -> str:
        """Where the input is kept, for messages: ``s3://bucket``, or the local disk."""
        scheme, rest = _split(self.path) if is_uri(self.path) else ("", "")
        return f"{scheme}://{rest.split('/', 1)[0]}" if scheme else "the local disk"


def _unavailable(path: str, what: str, hint: str | None = None) -> InputUnavailable:
    """An ``InputUnavailable``, noted for the task reading (``input_reads.note_unavailable``)."""
    exc = InputUnavailable(path, what, hint)
    note_unavailable(exc)
    return exc


@dataclass(frozen=True)
class RemoteFile:
    uri: str
    size: int
    mtime: float  # seconds since the epoch (0.0 where the store gives none)
    mtime_ns: int | None = None  # exact, where known (local files and folders)
    change: str | None = None  # what changes on any change of content (see input_identity); None: unknown


def is_uri(path: str | os.PathLike[str]) -> bool:
    """A path with a scheme (``s3://...``); ``file://`` counts too (it is resolved like the others)."""
    return "://" in os.fspath(path)


def _split(uri: str) -> tuple[str, str]:
    scheme, _, rest = uri.partition("://")
    return scheme.lower(), rest.strip("/")


# Object stores whose file system serves every bucket the same way, so one is kept per bucket: building
# one (``FileSystem.from_uri``) costs ~1 ms of CPU and starts the SDK's machinery, and a driver or a
# worker reading markers made one per object read.
_SHARED_FS = ("s3", "gs", "gcs")
_FILE_SYSTEMS: dict[tuple[Any, ...], Any] = {}


def resolve(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) for a URI, with an error that names the URI on failure."""
    scheme, rest = _split(uri)
    key = None
    if scheme in _SHARED_FS and "?" not in uri:
        # The environment is part of the key: credentials, endpoint and region are read from it.
        key = (
            scheme,
            rest.partition("/")[0],
            tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_")))),
        )
        fs = _FILE_SYSTEMS.get(key)
        if fs is not None:
            return fs, rest.rstrip("/")
    fs, path = _resolve(uri)
    if key is not None and path == rest.rstrip("/"):
        _FILE_SYSTEMS[key] = fs
    return fs, path


def _resolve(uri: str) -> tuple[Any, str]:
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except pa.ArrowInvalid as exc:
        if "Unrecognized filesystem type" not in str(exc):
            raise StorageError(f"{uri}: not a usable URI ({_first_line(exc)})") from None
        fs, path = _fsspec(uri)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"{uri}: cannot open its file system ({_first_line(exc)}){_hint(uri)}") from None
    return fs, path.rstrip("/")


def _fsspec(uri: str) -> tuple[Any, str]:
    """A store pyarrow has no file system for, through fsspec (when it is installed and knows the scheme)."""
    scheme, rest = _split(uri)
    try:
        import fsspec
        import pyarrow.fs as pafs

        handler = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme)))
    except (ImportError, ValueError) as exc:
        raise StorageError(
            f"{uri}: unknown storage scheme {scheme!r}; allowed: s3://, gs://, hdfs:// and local "
            f"paths (or a scheme fsspec knows, with fsspec installed: {_first_line(exc)})"
        ) from None
    return handler, rest


def _hint(uri: str) -> str:
    scheme, _ = _split(uri)
    if scheme == "s3":
        return (
            "; S3 reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION and, for an "
            "S3-compatible server, AWS_ENDPOINT_URL"
        )
    if scheme in ("gs", "gcs"):
        return "; GCS reads GOOGLE_APPLICATION_CREDENTIALS"
    if scheme in ("hdfs", "viewfs"):
        return "; HDFS needs HADOOP_HOME and CLASSPATH (see pyarrow's HadoopFileSystem)"
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(uri: str, what: str, exc: BaseException) -> StorageError:
    return StorageError(f"{uri}: {what} failed ({_first_line(exc)}){_hint(uri)}")


# --- retries ---------------------------------------------------------------------------

RETRY_ENV = "DATAPIPE_STORE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 60.0
# Failures of the connection or of the store's availability, not of the request: worth another try
# (pyarrow's AWS SDK messages, botocore's, and the OS's). Anything else (no such bucket, access
# denied, a failed condition) fails at once.
_TRANSIENT = re.compile(
    r"NETWORK_CONNECTION|SERVICE_UNAVAILABLE|SLOW_DOWN|SlowDown|ServiceUnavailable|THROTTL|"
    r"Throttl|INTERNAL_FAILURE|InternalError|REQUEST_TIMEOUT|RequestTimeout|HTTP status 5\d\d|"
    r"curlCode|[Cc]onnection (refused|reset|aborted|closed)|timed out|[Bb]roken pipe|"
    r"[Cc]ould not connect|[Tt]emporary failure in name resolution"
)
_TRANSIENT_TYPES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ConnectionError",
        "TimeoutError",
    }
)


def retry_seconds() -> float:
    """How long a store operation is retried while the store does not answer (``DATAPIPE_STORE_RETRY_SECONDS``)."""
    try:
        return max(0.0, float(os.environ.get(RETRY_ENV, DEFAULT_RETRY_SECONDS)))
    except ValueError:
        return DEFAULT_RETRY_SECONDS


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached or was briefly unavailable."""
    if isinstance(exc, (FileNotFoundError, PermissionError, StorageError)):
        return False
    if any(t.__name__ in _TRANSIENT_TYPES for t in type(exc).__mro__):
        return True
    return bool(_TRANSIENT.search(str(exc)))


def retrying(
    uri: str, what: str, call: Callable[[], T], before_retry: Callable[[], None] | None = None, missing: bool = False
) -> T:
    """``call()``, tried again with exponential backoff (0.5 s doubling, at most 8 s apart) while it fails
    because the store cannot be reached, for ``retry_seconds()`` from the first failure (an endpoint
    restarting, a network blip); then one ``StorageError`` saying so. Other errors are raised as they are.
    ``before_retry`` restores what a failed attempt may have changed (a read position). ``missing``: an
    object that should be there (an input listed when the run was planned) and is not counts as the
    store's failure too (a store restarted without its data until it is restored); past the deadline
    the ``FileNotFoundError`` is raised as it is."""
    deadline: float | None = None
    delay = 0.5
    while True:
        try:
            return call()
        except Exception as exc:
            gone = missing and isinstance(exc, FileNotFoundError)
            if not transient(exc) and not gone:
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + retry_seconds()
            if now >= deadline and gone:
                raise
            if now >= deadline:
                raise StorageError(
                    f"{uri}: {what} failed: the store did not answer for {retry_seconds():.0f} s "
                    f"({_first_line(exc)}){_hint(uri)}",
                    hint=f"check that the store is up and reachable, then run the same command again; "
                    f"{RETRY_ENV}={retry_seconds() * 2:.0f} waits longer",
                ) from None
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 8.0)
            if before_retry is not None:
                before_retry()


# --- the local mirror --------------------------------------------------------------


def mirror_base() -> Path:
    from datapipe.storage.cache import cache_dir

    return (cache_dir() / MIRROR_DIR).resolve()


def mirror_of(uri: str) -> Path:
    """The local path standing for ``uri`` (inputs are downloaded there, a run folder is worked on there)."""
    scheme, rest = _split(uri)
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise StorageError(f"{uri}: '.' and '..' are not allowed in a remote path")
    return mirror_base().joinpath(scheme, *parts)


def remote_of(path: str | os.PathLike[str]) -> str | None:
    """The URI a mirror path stands for, or None for an ordinary local path."""
    parts = Path(os.path.normpath(os.path.abspath(os.fspath(path)))).parts
    if MIRROR_DIR not in parts:
        return None
    rel = parts[parts.index(MIRROR_DIR) + 1 :]
    if len(rel) < 2:
        return None
    return f"{rel[0]}://{'/'.join(rel[1:])}"


def input_key(path: str | os.PathLike[str]) -> str:
    """How a run names an input file: an object by its URI (the same on every machine, whatever its
    mirror path), a local file by its resolved path."""
    return remote_of(path) or display_name(str(Path(path).resolve()))  # a non-UTF-8 name as \xNN escapes


def child(uri: str, rel: str) -> str:
    return f"{uri.rstrip('/')}/{rel}"


# --- operations ----------------------------------------------------------------------


def info(uri: str) -> RemoteFile | None:
    """Size and modification time of an object; None when there is none (a folder counts as none)."""
    import pyarrow.fs as pafs

    fs, path = resolve(uri)
    try:
        fi = retrying(uri, "reading its metadata", lambda: fs.get_file_info(path))
    except OSError as exc:
        raise _fail(uri, "reading its metadata", exc) from None
    if fi.type != pafs.FileType.File:
        return None
    return RemoteFile(uri, int(fi.size or 0), fi.mtime.timestamp() if fi.mtime is not None else 0.0)


def check_bucket(uri: str) -> None:
    """Fail clearly when the bucket (or root folder) of a URI does not exist or cannot be reached."""
    import pyarrow.fs as pafs

    fs, path = resolve(uri)
    bucket = path.split("/", 1)[0]
    try:
        kind = retrying(uri, f"reaching bucket {bucket!r}", lambda: fs.get_file_info(bucket).type)
    except OSError as exc:
        raise _fail(uri, f"reaching bucket {bucket!r}", exc) from None
    if kind == pafs.FileType.NotFound:
        raise StorageError(f"{uri}: bucket {bucket!r} does not exist (create it first){_hint(uri)}")


def list_files(uri: str) -> list[RemoteFile]:
    """Every object under a folder URI, recursively (empty when there is none)."""
    import pyarrow.fs as pafs

    fs, base = resolve(uri)
    try:
        infos = retrying(uri, "listing", lambda: fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)))
    except OSError as exc:
        raise _fail(uri, "listing", exc) from None
    scheme, _ = _split(uri)
    out = []
    for fi in infos:
        if fi.type == pafs.FileType.File:
            out.append(
                RemoteFile(f"{scheme}://{fi.path}", int(fi.size or 0), fi.mtime.timestamp() if fi.mtime is not None else 0.0)
            )
    _LISTED.update((f.uri, f) for f in out)
    return sorted(out, key=lambda f: f.uri)


def glob_files(pattern: str) -> list[RemoteFile]:
    """Objects matching a glob URI (``*``, ``?``, ``[...]`` within one path component, ``**`` across)."""
    scheme, rest = _split(pattern)
    parts = rest.split("/")
    fixed = []
    for part in parts:
        if re.search(r"[*?\[]", part):
            break
        fixed.append(part)
    if len(fixed) == len(parts):  # no wildcard: the object itself
        f = info(pattern)
        if f is not None:
            _LISTED[f.uri] = f
        return [f] if f is not None else []
    check_bucket(pattern)
    regex = re.compile(_glob_regex("/".join(parts)))
    prefix = f"{scheme}://{'/'.join(fixed)}"
    return [f for f in list_files(prefix) if regex.fullmatch(_split(f.uri)[1])]


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (j := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1 : j]
            out.append("[^" + re.escape(body[1:]) + "]" if body.startswith("!") else "[" + re.escape(body) + "]")
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def read_bytes(uri: str) -> bytes | None:
    """An object's bytes, or None when it does not exist."""
    fs, path = resolve(uri)

    def read() -> bytes:
        with fs.open_input_stream(path) as f:
            return f.read()

    try:
        return retrying(uri, "reading", read)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if info(uri) is None:
            return None
        raise _fail(uri, "reading", exc) from None


def write_bytes(uri: str, data: bytes) -> None:
    """Write one object whole. An object store makes it visible only once the upload completes (a
    PUT or a completed multipart upload), so readers never see half of it; a file system with
    rename (HDFS) gets a unique temporary name first, renamed into place."""
    fs, path = resolve(uri)

    def write() -> None:
        if _renames(fs):
            tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            with fs.open_output_stream(tmp) as f:
                f.write(data)
            fs.move(tmp, path)
        else:
            with fs.open_output_stream(path) as f:
                f.write(data)

    try:
        retrying(uri, "writing", write)
    except OSError as exc:
        raise _fail(uri, "writing", exc) from None


def upload(local: Path, uri: str) -> None:
    """Copy a local file to ``uri`` (whole, as :func:`write_bytes`), streaming."""
    import pyarrow.fs as pafs

    fs, path = resolve(uri)
    target = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}" if _renames(fs) else path

    def copy() -> None:
        pafs.copy_files(str(local), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        if target != path:
            fs.move(target, path)

    try:
        retrying(uri, f"uploading {local}", copy)
    except OSError as exc:
        raise _fail(uri, f"uploading {local}", exc) from None


def download(uri: str, local: Path, mtime: float | None = None) -> None:
    """Copy ``uri`` to ``local`` atomically (temporary name, then rename), keeping its modification
    time so a second download can be skipped and recorded input times agree on every node."""
    import pyarrow.fs as pafs

    from datapipe.storage.atomic import atomic_path

    fs, path = resolve(uri)
    try:
        FETCHED.downloads += 1
        # Not recorded as written: a task that downloads another task's file must not upload it
        # again as one of its own outputs (and name it in its marker).
        with atomic_path(local, record=False) as tmp:
            retrying(
                uri,
                "downloading",
                lambda: pafs.copy_files(path, str(tmp), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem()),
            )
            FETCHED.bytes += tmp.stat().st_size
            if mtime:
                os.utime(tmp, (mtime, mtime))
    except FileNotFoundError:
        raise StorageError(f"{uri}: no such object") from None
    except OSError as exc:
        raise _fail(uri, "downloading", exc) from None


def fetch(f: RemoteFile) -> Path:
    """The local mirror copy of a remote file, downloaded unless an identical one (size and time) is there."""
    local = mirror_of(f.uri)
    try:
        st = local.stat()
        if st.st_size == f.size and (not f.mtime or int(st.st_mtime) == int(f.mtime)):
            return local
    except FileNotFoundError:
        pass
    download(f.uri, local, f.mtime)
    return local


def ensure_local(path: str | os.PathLike[str]) -> Path:
    """``path`` itself; if it is the mirror of a remote input missing on this node, downloaded first."""
    p = Path(path)
    uri = remote_of(p)
    if uri is not None and not p.exists():
        try:
            f = retrying(uri, "reading its metadata", lambda: _must_exist(uri), missing=True)
            fetch(f)
        except FileNotFoundError:
            raise _unavailable(uri, _GONE.format(seconds=retry_seconds()), _unavailable_hint()) from None
        except StorageError as exc:
            raise _unavailable(uri, str(exc)[len(uri) + 2 :] if str(exc).startswith(uri) else str(exc), exc.hint) from None
    return p


def _must_exist(uri: str) -> RemoteFile:
    f = info(uri)
    if f is None:
        raise FileNotFoundError(uri)
    return f


_GONE = "no such object, though it was listed when the run was planned (asked again for {seconds:.0f} s)"


def _unavailable_hint() -> str:
    return (
        f"check that the store is up and holds the file (a store restarted without its data?), then run the same "
        f"command again; {RETRY_ENV}={retry_seconds() * 2:.0f} waits longer"
    )


# --- inputs read in place ----------------------------------------------------------------

# What this process listed in object storage: the planner and the input listing take sizes and
# times from here (one LIST per pattern), not from a request per object nor from a download.
_LISTED: dict[str, RemoteFile] = {}


@dataclass
class Fetched:
    """Bytes this process read from object storage for inputs: ranged reads and whole downloads
    (counted so tests and benchmarks can show what planning or a task really read)."""

    bytes: int = 0
    requests: int = 0
    downloads: int = 0


FETCHED = Fetched()

PROBE_BUFFER = 64 << 10  # read size when looking at a few bytes (a record boundary, a first record)
READ_BUFFER = 8 << 20  # read size of a task streaming its input: few requests, bounded memory
# Buffer of a local input opened by a task (its reads hashed): large enough that a reader reading
# in small pieces (gzip: 8 KiB) costs one Python-level read per 256 KiB, not per piece.
HASHED_LOCAL_BUFFER = 256 << 10


def input_stat(path: str | os.PathLike[str]) -> RemoteFile | None:
    """Size and modification time of an input file: a local file's ``stat``; for the mirror path of
    an object, what the store listed (or a metadata request), never a download. None: no file."""
    uri = remote_of(path)
    if uri is None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return RemoteFile(os.fspath(path), st.st_size, st.st_mtime, st.st_mtime_ns, _local_change(st))
    return _LISTED.get(uri) or info(uri)


def _local_change(st: os.stat_result) -> str:
    """What tells one version of a local file from another when its size and mtime are the same:
    its inode and its ``st_ctime_ns``. The kernel sets ctime on every change of the file (a write, a
    truncate, a chmod, a rename) and no user can set it (``os.utime``/``touch -d`` set only mtime
    and atime), so a file rewritten in place with its size kept and its mtime put back still shows
    a new ctime. The inode tells a file replaced by another (a copy renamed over it: rsync, an
    editor saving) even where ctimes tie. Device numbers are left out: one network file system can
    show a different one on each node."""
    return f"{st.st_ino}:{st.st_ctime_ns}"


def _local_identity(st: os.stat_result) -> dict[str, Any]:
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "change": _local_change(st)}


# Response headers that change whenever an object is overwritten: the version (S3 VersionId, GCS
# generation) where the bucket keeps versions, and the ETag (a new one on every PUT, even of the
# same bytes by a multipart upload: then the recorded hashes decide).
_VERSION_HEADERS = ("versionid", "x-amz-version-id", "generation", "x-goog-generation", "etag")


def _object_identity(f: Any) -> dict[str, Any]:
    """Identity of an object opened for reading (its metadata comes with the open: no extra request)."""
    try:
        meta = {str(k).lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in dict(f.metadata()).items()}
    except Exception:  # noqa: BLE001 - a store without metadata: known by size only, the hashes decide
        meta = {}
    change = " ".join(f"{k}={meta[k]}" for k in _VERSION_HEADERS if meta.get(k)) or None
    return {"bytes": int(f.size()), "mtime_ns": None, "change": change}


def input_identity(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """An input as it is now, asked afresh (no listing or folder walk remembered): ``bytes``,
    ``mtime_ns`` and ``change``, a token that differs whenever the content may differ (local file:
    inode and ctime; folder: the latest ctime in it; object: its version or ETag; None where the
    store gives none). None: the input is gone."""
    uri = remote_of(path)
    if uri is not None:
        fs, key = resolve(uri)
        try:
            with fs.open_input_file(key) as f:  # one metadata request, no bytes
                return _object_identity(f)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _fail(uri, "reading its metadata", exc) from None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        return _local_identity(st)
    folder = _walk_folder(path)
    if folder is None:
        return None
    return {"bytes": folder.size, "mtime_ns": folder.mtime_ns, "change": folder.change}


def read_again_sha256(path: str | os.PathLike[str], extents: list[list[int]]) -> str | None:
    """The sha256 of the bytes at ``extents`` of an input now (see storage/input_reads.py); None when
    it is gone or shorter. Ranged reads on object storage: only those bytes are fetched."""
    try:
        return extents_sha256(lambda: open_input(path, buffer=0), extents)
    except (FileNotFoundError, StorageError):
        return None


# Within folder_stats_once(): folder_stat's answers by path, so a run start walks each folder once.
_FOLDER_STATS: dict[str, RemoteFile | None] | None = None


@contextlib.contextmanager
def folder_stats_once() -> Iterator[None]:
    """Inside, ``folder_stat`` walks each folder once and answers later calls from memory. A run's
    start asks about every folder input three times (its listing, the corpus size that sets the
    split target, the task plan); a walk of 100,000 files takes ~0.5 s here (warm cache), more on a
    network file system. Use it around one run start only: a folder edited inside is not seen again."""
    global _FOLDER_STATS
    outer = _FOLDER_STATS
    if outer is None:
        _FOLDER_STATS = {}
    try:
        yield
    finally:
        _FOLDER_STATS = outer


def folder_stat(path: str | os.PathLike[str]) -> RemoteFile | None:
    """A local folder read as one input (a site of HTML pages, a code repository, an unpacked arXiv
    source): the total size of its files and the latest modification time of its files and folders,
    so that a file added, removed or edited anywhere in it changes the listing. None: no folder."""
    memo, key = _FOLDER_STATS, os.path.abspath(path)
    if memo is None:
        return _walk_folder(path)
    if key not in memo:
        memo[key] = _walk_folder(path)
    return memo[key]


def _walk_folder(path: str | os.PathLike[str]) -> RemoteFile | None:
    if not os.path.isdir(path):
        return None
    top = os.stat(path)
    size, mtime, mtime_ns, ctime_ns = 0, top.st_mtime, top.st_mtime_ns, top.st_ctime_ns
    for root, dirs, files in os.walk(path):
        for is_file, names in ((False, dirs), (True, files)):
            for name in names:
                try:
                    st = os.stat(os.path.join(root, name))
                except OSError:  # a dangling link: the readers skip it too
                    continue
                mtime = max(mtime, st.st_mtime)
                mtime_ns = max(mtime_ns, st.st_mtime_ns)
                ctime_ns = max(ctime_ns, st.st_ctime_ns)  # any file rewritten, added or removed (see _local_change)
                if is_file and stat.S_ISREG(st.st_mode):
                    size += st.st_size
    return RemoteFile(os.fspath(path), size, mtime, mtime_ns, f"ctime:{ctime_ns}")


def is_input_file(path: str | os.PathLike[str]) -> bool:
    return input_stat(path) is not None


class _RemoteRaw(io.RawIOBase):
    """A pyarrow random-access file of an object as a Python raw stream: every read is one ranged
    request, so wrapped in a ``BufferedReader`` it reads only the windows it is asked for."""

    def __init__(self, f: Any, stop: int | None, uri: str = "") -> None:
        self.f = f
        self.uri = uri
        self.stop = stop  # a task's range end: no read crosses it; past it, small reads (a record's tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        want = len(b)
        if self.stop is not None:
            pos = self.f.tell()
            want = min(want, self.stop - pos) if pos < self.stop else min(want, PROBE_BUFFER)
        at = self.f.tell()
        try:
            data = retrying(self.uri, "reading", lambda: self.f.read(want), lambda: self.f.seek(at))
        except StorageError as exc:  # the store stopped answering mid-read: not the file's bytes
            raise _unavailable(self.uri, f"reading stopped at byte {at:,}: {exc}", exc.hint) from None
        except OSError as exc:
            raise _unavailable(self.uri, f"reading stopped at byte {at:,} ({_first_line(exc)})", _unavailable_hint()) from None
        n = len(data)
        b[:n] = data
        FETCHED.bytes += n
        FETCHED.requests += 1
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        if not self.closed:
            self.f.close()
        super().close()


def open_input(path: str | os.PathLike[str], buffer: int = READ_BUFFER, stop: int | None = None) -> IO[bytes]:
    """An input file opened for reading (binary, seekable). A local path is opened as it is; the
    mirror path of an object is read in place from the store, ``buffer`` bytes per request (even
    when a mirror copy is there: it may be a stale one). ``stop``: where the caller's byte range
    ends, so read-ahead does not fetch a buffer's worth of the next range. ``buffer=0``: no read
    ahead at all, each read one request (for a caller that reads a few windows of its own size)."""
    p = Path(path)
    uri = remote_of(p)
    if uri is None:
        if not recording():
            return p.open("rb")
        # A task reading (storage/input_reads.py): the file's identity as opened, and every byte
        # read hashed on its way in.
        try:
            local = io.FileIO(p, "rb")
        except (FileNotFoundError, PermissionError) as exc:  # planned, then removed or locked away: not its bytes
            raise _unavailable(input_key(p), f"cannot be opened ({exc.strerror}), though the run planned it") from None
        record = note_read(input_key(p), _local_identity(os.fstat(local.fileno())))
        return io.BufferedReader(HashingRaw(local, record), buffer_size=HASHED_LOCAL_BUFFER)  # type: ignore[arg-type]
    fs, key = resolve(uri)
    try:
        f = retrying(uri, "opening", lambda: fs.open_input_file(key), missing=True)
    except FileNotFoundError:
        raise _unavailable(uri, _GONE.format(seconds=retry_seconds()), _unavailable_hint()) from None
    except StorageError as exc:
        raise _unavailable(uri, f"opening failed: {exc}", exc.hint) from None
    except OSError as exc:
        raise _unavailable(uri, f"opening failed ({_first_line(exc)}){_hint(uri)}", _unavailable_hint()) from None
    raw: io.RawIOBase = _RemoteRaw(f, stop, uri)
    if recording():
        raw = HashingRaw(raw, note_read(uri, _object_identity(f)))  # type: ignore[arg-type]
    return io.BufferedReader(raw, buffer_size=buffer) if buffer > 0 else raw  # type: ignore[return-value]


def parquet_source(path: str | os.PathLike[str]) -> Any:
    """What ``pq.ParquetFile`` should open: a local path as it is (planning, probes); an object as a
    file read in place, so the footer and then only the row groups asked for are requested (Parquet
    reads are large and positioned: a small buffer wastes nothing). In a task recording its reads,
    a local file is opened the same way, so the footer and column chunks it reads are hashed."""
    if remote_of(path) is None and not recording():
        return os.fspath(path)
    return open_input(path, PROBE_BUFFER)  # in a task, a local file too: its reads are hashed


def delete(uri: str) -> None:
    fs, path = resolve(uri)
    try:
        retrying(uri, "deleting", lambda: fs.delete_file(path))
    except FileNotFoundError:
        pass
    except OSError as exc:
        if info(uri) is not None:
            raise _fail(uri, "deleting", exc) from None


def delete_tree(uri: str) -> None:
    """Delete everything under a folder URI (nothing when there is none)."""
    fs, path = resolve(uri)
    try:
        # not delete_dir_contents: on S3 that leaves an empty folder marker behind
        retrying(uri, "deleting", lambda: fs.delete_dir(path))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _fail(uri, "deleting", exc) from None


def _renames(fs: Any) -> bool:
    """Whether ``fs`` renames atomically (HDFS, local); object stores copy instead, so they get a direct put."""
    return type(fs).__name__ in ("HadoopFileSystem", "LocalFileSystem")


# --- the run folder of read-only commands ---------------------------------------------

# What the driver writes into a run folder (the rest comes from tasks, named by their markers), and
# what a read-only command needs of it.
RUN_FILES = ("run.json", "stats.duckdb", "shards/manifest.parquet", "shards/manifest.json")


def local_run_dir(run_dir: str | os.PathLike[str], files: tuple[str, ...] = RUN_FILES) -> Path:
    """A run folder to read (``sql``, ``stats``, ``report``, ``explain``, ``export``): a local path as
    it is; for a URI, its mirror with ``files`` (run.json, stats.duckdb and the shard manifest and its copy)
    downloaded (again only when they changed). The documents' Parquet files stay remote: the text
    views and exports read them in place."""
    if not is_uri(run_dir):
        return Path(run_dir)
    uri = os.fspath(run_dir).rstrip("/")
    check_bucket(uri)
    if info(child(uri, "run.json")) is None:
        raise StorageError(f"{uri}: no run.json there; is it the run folder of a finished `datapipe run`?")
    for rel in files:
        f = info(child(uri, rel))
        if f is not None:
            fetch(f)
    return mirror_of(uri)
