"""The files a run depends on besides its pipeline file: how run.json records them, and what changed.

Each stage lists its files (``Stage.resource_files``): quality rule sets, the word and domain
lists they read, the license class table, models. run.json keeps one entry per file: its name
(relative to ``filters/`` or the pipeline file), its sha256 and, for text files up to
``MAX_CONTENT_BYTES``, its text. A rerun compares today's files with that record and is refused
when one means something else now, naming the file and, for YAML, the key
(``filters/quality/zh_web.yaml: filters.zh.min_han_ratio: 0.5 -> 0.6``). ``explain`` grades a
document against the recorded rules, not today's file. Models are recorded by hash only.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datapipe.stages.base import ResourceFile

# Rule sets and word lists are a few KB; a real domain blocklist can be tens of MB, which run.json
# should not carry: above this a file is recorded (and compared) by its hash alone.
MAX_CONTENT_BYTES = 256 * 1024
LIST_ROLES = ("word_list", "domain_list")


def record_resources(files: list[tuple[str, ResourceFile]], pipeline_dir: Path) -> list[dict[str, Any]]:
    """run.json entries for (stage type, file) pairs, in stage order; a file listed twice is recorded once."""
    entries: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for stage, f in files:
        path = f.path.expanduser()
        entry: dict[str, Any] = {
            "stage": stage,
            "role": f.role,
            "path": f.name or display_path(path, pipeline_dir),
            "file": str(path.resolve()),
        }
        if f.key is not None:
            entry["key"] = f.key
        if _ident(entry) in seen:
            continue
        seen.add(_ident(entry))
        if f.sha256:
            entry["sha256"] = f.sha256
        elif f.content and _size(path) <= MAX_CONTENT_BYTES:
            data = path.read_bytes()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            try:
                entry["content"] = data.decode("utf-8")
            except UnicodeDecodeError:
                pass  # not text: the hash alone
        else:
            entry["sha256"] = file_sha256(path)
        entries.append(entry)
    return entries


def identity(entries: list[dict[str, Any]]) -> list[list[Any]]:
    """What of the entries enters the run fingerprint: names and hashes, not machine-specific paths."""
    return [[*_ident(e), e.get("sha256")] for e in entries]


def identity_config(config: dict[str, Any]) -> dict[str, Any]:
    """A normalized config (``Pipeline.normalized()`` or run.json's ``config``) less each stage's run
    settings (``StageOptions.run_settings``: a server's address, concurrency, retries): what the
    fingerprint hashes and a resume compares. A stage type not registered here is kept whole."""
    from datapipe.stages import STAGES  # late: only pipelines with stages need the registry

    stages = config.get("stages") if isinstance(config, dict) else None
    if not isinstance(stages, list):
        return config
    out = []
    for entry in stages:
        if isinstance(entry, dict) and len(entry) == 1:
            ((kind, options),) = entry.items()
            settings = _run_settings(STAGES, kind)
            if settings and isinstance(options, dict):
                entry = {kind: {k: v for k, v in options.items() if k not in settings}}
        out.append(entry)
    return {**config, "stages": out}


def _run_settings(stages: Any, kind: str) -> frozenset[str]:
    try:
        return stages[kind].Options.run_settings if kind in stages else frozenset()
    except Exception:  # a plugin that cannot be imported: its options are compared whole
        return frozenset()


def resource_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """One line per file that is read now and was not, is no longer read, or means something else now.

    A file whose bytes changed but whose meaning did not (a comment, the order of a word list, YAML
    formatting) is no change: the run's decisions would be the same.
    """
    before = {_ident(e): e for e in old}
    after = {_ident(e): e for e in new}
    out = [
        f"{after[i]['path']}: now read ({_what(after[i])}), the earlier run did not read it"
        for i in sorted(after.keys() - before.keys(), key=str)
    ]
    out += [f"{before[i]['path']}: no longer read ({_what(before[i])})" for i in sorted(before.keys() - after.keys(), key=str)]
    for i in sorted(before.keys() & after.keys(), key=str):
        out += _file_changes(before[i], after[i])
    return out


def config_changes(old: Any, new: Any, path: str = "") -> list[str]:
    """Key paths whose values differ between two nested mappings (normalized configs, parsed rule sets)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{sub}: added ({_brief(new[key])})")
            elif key not in new:
                out.append(f"{sub}: removed (was {_brief(old[key])})")
            else:
                out.extend(config_changes(old[key], new[key], sub))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in config_changes(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {_brief(old)} -> {_brief(new)}"]


def current_sha256(entry: dict[str, Any]) -> str | None:
    """The sha256 of the file an entry names as it is today (None when it is gone)."""
    path = Path(entry.get("file") or entry["path"])
    return file_sha256(path) if path.is_file() else None


def recorded_meaning(entry: dict[str, Any]) -> Any:
    """What the recorded text means to its reader: parsed YAML, a list's entries; None without content."""
    text = entry.get("content")
    if text is None:
        return None
    if entry.get("role") in LIST_ROLES:
        from datapipe.stages.quality.blocklist import parse_list

        return parse_list(text)
    if entry["path"].endswith((".yaml", ".yml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return text
    return text


def display_path(path: Path, pipeline_dir: Path) -> str:
    """``filters/...`` for the built-in data files, relative to the pipeline file inside its folder, else absolute.

    Names, not absolute paths, enter the fingerprint and the comparison: a project moved or checked
    out elsewhere is the same run.
    """
    from datapipe.assets.filters_dir import filters_dir

    resolved = path.resolve()
    for base, prefix in ((filters_dir().resolve(), "filters"), (pipeline_dir.resolve(), "")):
        if resolved.is_relative_to(base):
            rel = resolved.relative_to(base).as_posix()
            return f"{prefix}/{rel}" if prefix else rel
    return resolved.as_posix()


def file_sha256(path: Path) -> str | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _hash_file(str(path.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _hash_file(path: str, mtime_ns: int, size: int) -> str:
    """Cached by modification time and size: a model of 100+ MB is hashed once per process, not per call."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return MAX_CONTENT_BYTES + 1  # missing: recorded with sha256 None, by file_sha256


def _file_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    name = new["path"]
    if new.get("sha256") is None:
        return [f"{name}: file not found now ({_what(new)}; the run read it)"]
    if old.get("sha256") == new["sha256"]:
        return []
    before, after = recorded_meaning(old), recorded_meaning(new)
    if before is not None and after is not None:
        if before == after:
            return []  # comments, order or formatting only
        if isinstance(before, tuple) and isinstance(after, tuple):  # list entries
            added = sorted(set(after) - set(before))
            removed = sorted(set(before) - set(after))
            return [f"{name}: {len(added)} entries added{_examples(added)}, {len(removed)} removed{_examples(removed)}"]
        if isinstance(before, dict) and isinstance(after, dict):
            return [f"{name}: {c}" for c in config_changes(before, after)]
    return [f"{name}: changed (sha256 {str(old.get('sha256'))[:12]} -> {new['sha256'][:12]})"]


def _ident(entry: dict[str, Any]) -> tuple[Any, ...]:
    return entry["stage"], entry["role"], entry.get("key"), entry["path"]


def _what(entry: dict[str, Any]) -> str:
    key = entry.get("key")
    return f"{entry['stage']} {entry['role']}" + (f" {key}" if key else "")


def _examples(items: list[str]) -> str:
    return f" ({', '.join(map(repr, items[:3]))}{', ...' if len(items) > 3 else ''})" if items else ""


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."
