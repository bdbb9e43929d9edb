"""`datapipe run --from OLD_RUN`: re-deciding with changed thresholds from an earlier run's recorded
signals gives what a fresh run with those thresholds gives, and reads the signals instead of
computing them (issue 35, item 3).

On small real data (tests/support/small_real_run.py's inputs, a part of them): the old run drops short documents
early (length 400), so they never got langid's and quality's signals; the new one keeps them
(length 50) and is stricter on language (min_score 0.8): those documents' signals are computed,
every other document's are read from the old run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from click.testing import CliRunner

from datapipe.audit.sql import connect as audit_connect
from datapipe.cli import main
from datapipe.engine.errors import PipelineError
from datapipe.engine.tasks import map as map_task
from datapipe.stages.langid import LangId
from datapipe.stages.quality import Quality
from datapipe.tokens.encode import encode_documents
from tests.support.damage import flip_data_page
from tests.support.shared_data import PROJECT_ROOT
from tests.support.small_real_run import output_digests, real_config, run_in_process


def _pipeline(folder: Path, name: str, min_chars: int, min_score: float, deny: tuple[str, ...] = (), **langid: Any) -> Path:
    """English data-juicer excerpts and the first 300 articles of Chinese Wikipedia (seconds, not a minute)."""
    config = real_config()
    zh = folder / "zh_wikipedia_300.jsonl"
    if not zh.exists():
        with open(config["sources"][1]["paths"][0], encoding="utf-8") as fh:
            zh.write_text("".join(line for _, line in zip(range(300), fh)), encoding="utf-8")
    config["sources"][1]["paths"] = [str(zh)]
    config["stages"] = [
        {"length": {"min_chars": min_chars}},
        {"langid": {"keep": ["zh", "en"], "min_score": min_score, **langid}},
        {"quality": {"rules": "auto"}},
        {"dedup": {"exact": True}},
        {"license": {"policy": {"default": {"deny": list(deny)}}}},  # a policy is a threshold: the tags are read
    ]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def _documents(root: Path) -> list[tuple[Any, ...]]:
    with audit_connect(root) as con:
        return con.execute("select * from documents order by id").fetchall()


def _ids(root: Path, *stages: str, negate: bool = False) -> set[str]:
    """Ids of the documents dropped by one of ``stages`` (``negate``: of all others, kept ones included)."""
    where = f"coalesce(stage, '') {'not ' if negate else ''}in ({', '.join(repr(s) for s in stages)})"
    with audit_connect(root) as con:
        return {r[0] for r in con.execute(f"select id from documents where {where}").fetchall()}


def _stages(root: Path) -> list[str]:
    with audit_connect(root) as con:
        return [r[0] for r in con.execute("select distinct stage from documents where stage is not null").fetchall()]


class _Counting:
    """Counts the documents a stage's compute is given (the stage class's compute, wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
        self.ids: list[str] = []
        original = cls.compute

        def compute(stage: Any, batch: pa.Table) -> pa.Table:
            self.ids += batch["id"].to_pylist()
            return original(stage, batch)

        monkeypatch.setattr(cls, "compute", compute)


def _count_encoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts map tasks encode from now on (``encode_documents`` wrapped), in a list filled as they do."""
    encoded: list[str] = []

    def encode(texts: list[str], info: Any, arrow: pa.Array | None = None) -> pa.Array:
        encoded.extend(texts)
        return encode_documents(texts, info, arrow)

    monkeypatch.setattr(map_task, "encode_documents", encode)
    return encoded


def test_redecide_equals_a_fresh_run_and_computes_only_unrecorded_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new, fresh = tmp_path / "old", tmp_path / "new", tmp_path / "fresh"
    run_in_process(_pipeline(tmp_path, "old", 400, 0.5), output=old)
    changed = _pipeline(tmp_path, "changed", 50, 0.8, deny=("non_commercial", "no_derivatives"))
    run_in_process(changed, output=fresh)

    langid, quality = _Counting(monkeypatch, LangId), _Counting(monkeypatch, Quality)
    encoded = _count_encoded(monkeypatch)
    run_in_process(changed, output=new, reuse_from=old)

    assert output_digests(new) == output_digests(fresh)  # every shard, docs and rejected file's bytes
    assert _documents(new) == _documents(fresh)  # every column of the documents table
    # Computed: exactly the documents the old run dropped before the stage (length, at 400
    # characters; for quality also langid), now let through. The rest were read.
    before_langid, before_quality = _ids(old, "read", "length"), _ids(old, "read", "length", "langid")
    reached_langid, reached_quality = _ids(new, "read", "length", negate=True), _ids(new, "read", "length", "langid", negate=True)
    assert langid.ids and sorted(langid.ids) == sorted(reached_langid & before_langid)
    assert quality.ids and sorted(quality.ids) == sorted(reached_quality & before_quality)
    assert len(reached_langid) > 2 * len(langid.ids)  # most were read, not computed
    # Token lists: encoded for the documents the old run did not keep, read for the others.
    newly_kept = _ids(new, *_stages(new), negate=True) - _ids(old, *_stages(old), negate=True)
    assert encoded and len(encoded) == len(newly_kept)
    record = (new / "run.json").read_text()
    assert '"reused": [' in record and "2 langid" in record and "3 quality" in record
    assert "5 license" in json.loads(record)["from"]["reused"]  # it only tags: its tags are read, the policy decides


def test_changed_signal_option_recomputes_the_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A langid option its signals depend on (max_chars) is no threshold: langid is computed for every
    document that reaches it, and so is quality after it (it picks its rule set by langid's ``lang``);
    the outputs are still a fresh run's."""
    old, new, fresh = tmp_path / "old", tmp_path / "new", tmp_path / "fresh"
    en = real_config()["sources"][0]["paths"][:2]  # English only: small
    for name, max_chars in (("old", 20_000), ("new", 300)):
        path = _pipeline(tmp_path, name, 50, 0.5, max_chars=max_chars)
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        config["sources"] = [{**config["sources"][0], "paths": en}]
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    run_in_process(tmp_path / "old.yaml", output=old)
    run_in_process(tmp_path / "new.yaml", output=fresh)
    langid, quality = _Counting(monkeypatch, LangId), _Counting(monkeypatch, Quality)
    run_in_process(tmp_path / "new.yaml", output=new, reuse_from=old)
    assert output_digests(new) == output_digests(fresh)
    assert langid.ids and sorted(langid.ids) == sorted(_ids(new, "read", "length", negate=True))
    assert quality.ids and sorted(quality.ids) == sorted(_ids(new, "read", "length", "langid", negate=True))
    computed = json.loads((new / "run.json").read_text())["from"]["computed"]
    assert computed["2 langid"] == "stages[1].langid.max_chars: 20000 -> 300"
    assert computed["3 quality"] == "its input may differ: stages[1].langid.max_chars: 20000 -> 300"


def test_other_documents_are_refused(tmp_path: Path) -> None:
    old = tmp_path / "old"
    run_in_process(_pipeline(tmp_path, "old", 400, 0.5), output=old)
    config = yaml.safe_load((tmp_path / "old.yaml").read_text(encoding="utf-8"))
    config["sources"] = config["sources"][1:]  # the zh source only
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    with pytest.raises(PipelineError, match=r"(?s)not of this pipeline's documents.*sources"):
        run_in_process(other, output=tmp_path / "new", reuse_from=old)
    assert not (tmp_path / "new" / "docs").exists()
    # The command: exit 2 (as asked, it cannot be done), one error line, no traceback.
    res = CliRunner().invoke(main, ["run", str(tmp_path / "old.yaml"), "--from", str(old), "--output", str(old)])
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"error: --from {old} is the output folder itself"), res.stderr


def _record_as_written(run: Path, paths: list[Path]) -> None:
    """The markers naming ``paths`` say their size and sha256 now (what a task that wrote them says)."""
    import hashlib

    wanted = {p.relative_to(run).as_posix(): p for p in paths}
    for marker in (run / "_work" / "markers").rglob("*.json"):
        data = json.loads(marker.read_text())
        for entry in data.get("files", []):
            if entry["path"] in wanted:
                body = wanted[entry["path"]].read_bytes()
                entry.update({"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()})
        marker.write_text(json.dumps(data, sort_keys=True))


def test_redecide_reads_compressed_token_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run folder in object storage writes its token lists zstd-compressed (engine/tasks/sinks.py);
    --from such a run reads them as it reads uncompressed ones: the same shards, nothing re-encoded."""
    old, new, fresh = tmp_path / "old", tmp_path / "new", tmp_path / "fresh"
    run_in_process(_pipeline(tmp_path, "old", 400, 0.5), output=old)
    token_files = sorted((old / "_work" / "tokens").rglob("*.arrow"))
    assert token_files, "the old run left no token lists"
    before = sum(p.stat().st_size for p in token_files)
    for path in token_files:  # rewritten as a remote run folder writes them
        table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()  # not mapped: rewritten below
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
    assert sum(p.stat().st_size for p in token_files) < before / 2  # compressed indeed
    _record_as_written(old, token_files)  # and named so in their markers, as a task writing them would
    changed = _pipeline(tmp_path, "changed", 50, 0.8)
    run_in_process(changed, output=fresh)

    encoded = _count_encoded(monkeypatch)
    run_in_process(changed, output=new, reuse_from=old)

    assert output_digests(new) == output_digests(fresh)
    newly_kept = _ids(new, *_stages(new), negate=True) - _ids(old, *_stages(old), negate=True)
    assert encoded and len(encoded) == len(newly_kept)  # the compressed lists were read, not re-encoded


def test_a_damaged_source_is_named_and_is_not_rewritten_while_it_is_read(tmp_path: Path) -> None:
    """`run --from OLD` over an OLD with one bit flipped in a documents file: one error naming OLD and
    the file, with OLD's own command to repair it (before: the damage went unnoticed, or failed
    without naming either). While a re-decide reads OLD, a `--fresh` rewrite of OLD is refused,
    naming the reader (before: it ran beside it); the re-decide then completes."""
    old = tmp_path / "old"
    old_pipeline = _pipeline(tmp_path, "old", 400, 0.5)
    run_in_process(old_pipeline, output=old)
    changed = _pipeline(tmp_path, "changed", 50, 0.8)
    victim = old / "docs" / "zh" / "00000.parquet"
    intact = victim.read_bytes()
    flip_data_page(victim)
    res = CliRunner().invoke(main, ["run", str(changed), "--from", str(old), "--output", str(tmp_path / "new"), "--in-process"])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "Traceback" not in res.output, res.output
    assert errors[0].startswith(f"error: --from {old}: {victim}: its sha256 differs"), res.output
    assert f"hint: run `datapipe run {old_pipeline} --output {old}` again" in res.output, res.output
    victim.write_bytes(intact)

    pause = tmp_path / "pause"
    env = {
        **os.environ,
        "DATAPIPE_FAULT_PAUSE_AT": "map0:1",
        "DATAPIPE_FAULT_PAUSE_FILE": str(pause),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = ["run", str(changed), "--from", str(old), "--output", str(tmp_path / "new2"), "--in-process", "--no-progress"]
    reader = subprocess.Popen(
        [sys.executable, "-m", "datapipe.cli", *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.time() + 300
        while not Path(f"{pause}.paused").exists():  # re-deciding, with OLD held for reading
            assert reader.poll() is None and time.time() < deadline, reader.communicate()[0]
            time.sleep(0.05)
        res = CliRunner().invoke(main, ["run", str(old_pipeline), "--output", str(old), "--fresh", "--in-process"])
        assert res.exit_code == 1, res.output
        assert f"run folder {old} is being read by another datapipe process: pid {reader.pid}" in res.output, res.output
        assert (old / "run.json").is_file() and victim.read_bytes() == intact  # nothing of OLD was touched
        pause.touch()
        out, _ = reader.communicate(timeout=600)
    finally:
        reader.kill()
    assert reader.returncode == 0, out
