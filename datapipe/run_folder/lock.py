"""One driver per run folder: an OS lock on ``<run>/.datapipe.lock`` and a readable record beside it.

Two drivers on one folder would sweep each other's temporary files and mix two configs,
so every driver takes this lock before it reads or writes anything in the folder
(``--fresh`` included) and holds it until it exits.

* The lock is ``flock(LOCK_EX | LOCK_NB)`` on ``.datapipe.lock``. The kernel releases it when
  the process dies however it dies (SIGKILL, OOM killer), so a dead driver on this machine
  never blocks the next run. The lock file itself is never deleted: a second process could
  otherwise lock an unlinked inode while a third locks the new file.
* ``.datapipe.lock.json`` says who holds it (host, pid, process start time, start time,
  command) for the refusal message, and its modification time is a heartbeat: the holder
  touches it every ``HEARTBEAT_S`` seconds.
* A record left by a dead driver is taken over. On this host: the OS lock was free, or (on
  a file system without flock) the pid is gone or now belongs to a process with another
  start time. On another host (a shared file system, ``--ray-address`` runs): flock over
  NFSv4 is shared between clients, but not on every network file system, so a record of
  another host whose heartbeat is younger than ``DATAPIPE_LOCK_STALE_S`` (default 120 s)
  refuses the run even when the OS lock was granted; an older one is taken over. This
  assumes the hosts' clocks agree to well within that time.
* A run folder in object storage (``s3://...``) has no flock: besides the lock of its local mirror,
  the driver creates ``<run>/.datapipe.lock.json`` on the store with a *conditional* put
  (``If-None-Match: *``, which S3 has honoured since 2024), so of two drivers racing for it exactly
  one succeeds; a record of a dead driver (same rules as above, with the object's modification
  time as heartbeat) is taken over with ``If-Match`` on its ETag, so two drivers taking over the same
  dead record cannot both win. Limitation: this needs boto3 and an S3 store that honours the
  conditions; on other stores (gs://, hdfs://) or without boto3 the record is written and read back
  after 0.2 s, which narrows but does not close the race of two drivers starting at the same moment.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from datapipe.run_folder.layout import LOCK_FILE, LOCK_RECORD, RunFolderError
from datapipe.storage import uri as storage
from datapipe.storage.atomic import write_text_atomic

HEARTBEAT_S = 10.0
DEFAULT_STALE_S = 120.0


class RunLockedError(RunFolderError):
    """Another live driver holds the run folder."""


class RunLock:
    """``what``: what the folder is, for the refusal ("run folder"; exports lock their output folder too)."""

    def __init__(self, root: Path, log: Callable[[str], None] = print, what: str = "run folder") -> None:
        self.root = root
        self.log = log
        self.what = what
        self.token = uuid.uuid4().hex
        self._fd: int | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._remote: RemoteLock | None = None  # the lock record on the store, for a remote run folder

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def record_path(self) -> Path:
        return self.root / LOCK_RECORD

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by Ray's processes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os_locked = True
        except BlockingIOError:
            os.close(fd)
            holder = read_record(self.record_path)
            if holder is None and (reader := live_reader(self.root)) is not None:  # held shared: read by another run
                raise RunLockedError(reader_refusal(self.what, self.root, reader)) from None
            raise RunLockedError(self._refusal(holder, None)) from None
        except OSError:  # ENOLCK/EOPNOTSUPP: a file system without flock; the record alone decides
            os_locked = False
        holder = read_record(self.record_path)
        if holder is not None and holder.get("token") != self.token:
            alive, why = holder_alive(holder, os_locked, self.record_path)
            if alive:
                os.close(fd)
                raise RunLockedError(self._refusal(holder, why))
            self.log(f"datapipe: taking over the lock of a driver that is gone ({describe(holder)}; {why})")
        self._fd = fd
        write_text_atomic(self.record_path, json.dumps(self._record(), indent=2, ensure_ascii=False) + "\n")
        if not os_locked:  # narrow the race of two drivers writing records at once
            time.sleep(0.2)
            mine = read_record(self.record_path)
            if mine is None or mine.get("token") != self.token:
                self.release()
                raise RunLockedError(self._refusal(mine, "it took the lock at the same moment"))
        uri = storage.remote_of(self.root)
        if uri is not None:
            remote = RemoteLock(uri, self._record(), self.log, self.what)
            try:
                remote.acquire()
            except BaseException:
                self.release()
                raise
            self._remote = remote
        self._heartbeat = threading.Thread(target=self._beat, name="datapipe-lock-heartbeat", daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
            self._heartbeat = None
        if self._remote is not None:
            try:
                self._remote.release()
            except Exception as exc:  # the store gone too: say so, but do not hide why the run stopped
                self.log(
                    f"datapipe: could not remove the lock record {self._remote.uri} ({exc}); the next "
                    f"run takes it over (at once on this host, after {DEFAULT_STALE_S:.0f} s on another)"
                )
            self._remote = None
        if self._fd is None:
            return
        record = read_record(self.record_path)
        if record is not None and record.get("token") == self.token:
            self.record_path.unlink(missing_ok=True)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                now = time.time()
                os.utime(self.record_path, (now, now))
                if self._remote is not None:
                    self._remote.beat()
            except Exception:  # OSError, StorageError, botocore's: never a traceback of this thread
                pass  # a missed beat only makes a takeover from another host possible sooner

    def _record(self) -> dict[str, Any]:
        return {**this_process(), "token": self.token, "heartbeat_every_s": HEARTBEAT_S}

    def _refusal(self, holder: dict[str, Any] | None, why: str | None) -> str:
        return refusal(self.what, self.root, holder, why, "a driver that dies releases the lock by itself")


READERS_DIR = ".datapipe.readers"  # one record per process reading the folder (ReadLock), by pid and token


class ReadLock:
    """A run folder held for reading while another command reads it whole (``run --from OLD`` reads
    OLD's recorded signals through all its map tasks): a shared ``flock`` on the same
    ``.datapipe.lock`` a driver locks exclusively, so a driver writing OLD (a ``--fresh`` rewrite, a
    rerun) is refused while it is read (naming the reader, whose record is in ``.datapipe.readers/``),
    and a folder a driver is writing is refused to the reader. Readers do not exclude each other.
    The kernel releases the lock of a reader that dies (its stale record is then skipped: its
    process is gone). A folder whose lock file cannot be created (read-only) is read without one."""

    def __init__(self, root: Path, what: str = "run folder") -> None:
        self.root, self.what = Path(root), what
        self.token = uuid.uuid4().hex
        self._fd: int | None = None
        self._record: Path | None = None

    def __enter__(self) -> ReadLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        lock = self.root / LOCK_FILE
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            try:
                fd = os.open(lock, os.O_RDONLY)
            except OSError:
                return  # a read-only folder without a lock file: nobody can write it either
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_record(self.root / LOCK_RECORD)
            raise RunLockedError(
                f"{self.what} {self.root} is being written by another datapipe driver: "
                f"{describe(holder) if holder else 'its lock record is not readable yet'}. It cannot be read while "
                f"it is written: wait for that run to finish, then run this command again."
            ) from None
        except OSError:
            pass  # a file system without flock: the readers' records still tell a writer
        self._fd = fd
        record = self.root / READERS_DIR / f"{socket.gethostname()}-{os.getpid()}-{self.token}.json"
        try:
            record.parent.mkdir(exist_ok=True)
            write_text_atomic(record, json.dumps(this_process(), indent=2, ensure_ascii=False) + "\n")
            self._record = record
        except OSError:
            self._record = None  # a read-only folder: the lock alone

    def release(self) -> None:
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


def this_process() -> dict[str, Any]:
    """Who holds a lock, for its record: host, pid, the process's start time, when, the command."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(_command()),
    }


def live_reader(root: Path) -> dict[str, Any] | None:
    """The record of a process of this host reading ``root`` now (``ReadLock``), or None."""
    folder = Path(root) / READERS_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        holder = read_record(path)
        if holder is None:
            continue
        if holder.get("host") != socket.gethostname():
            return holder  # another host's reader: alive as far as this host can tell
        pid = holder.get("pid")
        if isinstance(pid, int) and process_start(pid) == holder.get("pid_start"):
            return holder
    return None


def reader_refusal(what: str, root: object, reader: dict[str, Any]) -> str:
    """The refusal of a driver that would write a folder another process reads (``ReadLock``)."""
    return (
        f"{what} {root} is being read by another datapipe process: {describe(reader)}. It is not "
        f"written while it is read (a run re-deciding from it reads its files throughout): wait for that "
        f"process to finish or stop it, or use --output for another folder."
    )


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["heartbeat"] = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}, command: {holder.get('command')}"
    )


def holder_alive(holder: dict[str, Any], os_locked: bool, record: Path) -> tuple[bool, str]:
    """Whether the driver named in a lock record still runs, and why we think so."""
    if holder.get("host") == socket.gethostname():
        if os_locked:
            return False, "its OS lock was released, so that process has exited"
        pid = holder.get("pid")
        if not isinstance(pid, int) or process_start(pid) is None:
            return False, f"process {pid} no longer exists"
        if process_start(pid) != holder.get("pid_start"):
            return False, f"pid {pid} now belongs to another process"
        return True, "that process still runs"
    stale_s = float(os.environ.get("DATAPIPE_LOCK_STALE_S", DEFAULT_STALE_S))
    age = time.time() - float(holder.get("heartbeat", 0.0))
    if age < stale_s:
        return True, (
            f"its last heartbeat was {age:.0f} s ago; a lock of another host is taken over after {stale_s:.0f} s without one"
        )
    return False, f"no heartbeat for {age:.0f} s (more than {stale_s:.0f} s)"


def process_start(pid: int) -> str | None:
    """The start time of a process in clock ticks since boot (None if it does not exist):
    together with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "unknown"
        return "unknown"  # no /proc (macOS): alive, start time unknown
    return stat[stat.rindex(")") + 2 :].split()[19]


def _command() -> list[str]:
    argv = list(sys.argv)
    if argv and argv[0].endswith(("cli.py", "__main__.py", "datapipe")):
        argv[0] = "datapipe"
    return argv


class RemoteLock:
    """The lock record of a run folder in object storage (see the module doc)."""

    def __init__(self, uri: str, record: dict[str, Any], log: Callable[[str], None], what: str = "run folder") -> None:
        self.what = what
        self.uri = storage.child(uri, LOCK_RECORD)
        self.root = uri
        self.record = record
        self.log = log
        self.etag: str | None = None
        self._s3 = _s3_client() if uri.startswith("s3://") else None

    def _body(self) -> bytes:
        return (json.dumps(self.record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.uri[len("s3://") :].partition("/")
        return bucket, key

    def _put(self, **condition: str) -> bool:
        """Put the record under a condition; False when the store refused it (the condition failed)."""
        if self._s3 is None:
            storage.write_bytes(self.uri, self._body())
            return True
        from botocore.exceptions import ClientError

        bucket, key = self._bucket_key()
        s3 = self._s3
        try:
            self.etag = storage.retrying(
                self.uri, "writing the lock record", lambda: s3.put_object(Bucket=bucket, Key=key, Body=self._body(), **condition)
            )["ETag"]
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return False
            raise storage.StorageError(f"{self.uri}: writing the lock record failed ({code or exc})") from None
        return True

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        if self._s3 is None:
            body, etag = storage.read_bytes(self.uri), None
            f = storage.info(self.uri)
        else:
            from botocore.exceptions import ClientError

            bucket, key = self._bucket_key()
            s3 = self._s3
            try:
                got = storage.retrying(self.uri, "reading the lock record", lambda: s3.get_object(Bucket=bucket, Key=key))
                body = storage.retrying(self.uri, "reading the lock record", got["Body"].read)
            except ClientError:
                return None, None
            etag, f = got["ETag"], None
            mtime = got["LastModified"].timestamp()
        if body is None:
            return None, None
        try:
            data = json.loads(body)
        except ValueError:
            return None, etag
        if not isinstance(data, dict):
            return None, etag
        data["heartbeat"] = mtime if self._s3 is not None else (f.mtime if f else 0.0)
        return data, etag

    def acquire(self) -> None:
        for _ in range(3):
            if self._s3 is not None and self._put(IfNoneMatch="*"):
                return
            holder, etag = self._read()
            if self._s3 is None and holder is None:  # no conditional put: write, then check who won
                self._put()
                time.sleep(0.2)
                mine, _ = self._read()
                if mine is not None and mine.get("token") == self.record["token"]:
                    return
                raise RunLockedError(self._refusal(mine, "it took the lock at the same moment"))
            if holder is None:
                continue  # released (or unreadable) just now: try again
            alive, why = holder_alive(holder, False, Path(self.uri))
            if alive:
                raise RunLockedError(self._refusal(holder, why))
            self.log(f"datapipe: taking over the lock of a driver that is gone ({describe(holder)}; {why})")
            if self._s3 is None:
                self._put()
                return
            if etag is not None and self._put(IfMatch=etag):
                return
        raise RunLockedError(self._refusal(self._read()[0], "another driver took the lock at the same moment"))

    def beat(self) -> None:
        """Rewrite the record (its modification time is the heartbeat) unless another driver took it."""
        if self._s3 is None:
            self._put()
        elif self.etag is not None and not self._put(IfMatch=self.etag):
            self.log(f"datapipe: the lock record {self.uri} was taken over by another driver")

    def release(self) -> None:
        holder, _ = self._read()
        if holder is not None and holder.get("token") == self.record["token"]:
            storage.delete(self.uri)

    def _refusal(self, holder: dict[str, Any] | None, why: str | None) -> str:
        return refusal(
            self.what, self.root, holder, why, f"a lock record without a heartbeat for {DEFAULT_STALE_S:.0f} s is taken over"
        )


def _s3_client() -> Any:
    """boto3's S3 client (endpoint from AWS_ENDPOINT_URL, as pyarrow's), or None without boto3."""
    try:
        import boto3
    except ImportError:
        return None
    return boto3.client("s3")


def refusal(what: str, root: object, holder: dict[str, Any] | None, why: str | None, released: str) -> str:
    """The one-line refusal of a folder held by another driver; ``released``: how the lock frees itself."""
    who = describe(holder) if holder else "another process (its lock record is not readable yet)"
    return (
        f"{what} {root} is in use by another datapipe driver: {who}"
        + (f" ({why})" if why else "")
        + f". Only one driver may write a {what} at a time: wait for it to finish or stop it "
        f"({released}), or use --output for another folder."
    )
