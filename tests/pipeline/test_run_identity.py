"""The run identity covers every file a run's decisions depend on (issue 13): rule sets, word and
domain lists, the license class table, models. An edited threshold or word list stops a resume,
naming the file (and the YAML key); `--fresh` accepts it; `explain` grades with the run's own rules."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from datapipe.assets.filters_dir import filter_file
from datapipe.audit.sql import connect as connect_stats
from datapipe.cli import main
from datapipe.engine.runner import PipelineError, run_pipeline
from datapipe.pipeline.identity import resource_changes
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def project(tmp_path: Path, zh_lines: int = 150, en_lines: int = 100) -> Path:
    """A pipeline over real zh (TiDB docs: prose mixed with code) and en (Wikipedia) pages whose quality
    stage reads rule files and a spam word list copied into the project, as a user's own would be."""
    data = tmp_path / "data"
    data.mkdir()
    for name, n in (("zh_pingcap_docs", zh_lines), ("en_wikipedia", en_lines)):
        with shared_path("corpus", f"{name}.jsonl").open(encoding="utf-8") as src:
            (data / f"{name}.jsonl").write_text("".join(next(src) for _ in range(n)), encoding="utf-8")
    (tmp_path / "rules").mkdir()
    (tmp_path / "words").mkdir()
    shutil.copy(filter_file("words", "spam.txt"), tmp_path / "words" / "spam.txt")
    for key in ("zh_web", "en_web"):
        text = filter_file("quality", f"{key}.yaml").read_text(encoding="utf-8")
        # The list path is absolute: relative ones are read from datapipe's filters/ folder.
        text = text.replace("  blocklist:", f"  blocklist:\n    spam_list: {tmp_path / 'words' / 'spam.txt'}", 1)
        (tmp_path / "rules" / f"{key}.yaml").write_text(text, encoding="utf-8")
    return write_pipeline(
        tmp_path,
        {
            "name": "ident",
            "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
            "stages": [
                {"langid": {"keep": ["zh", "en"]}},
                {"quality": {"rules": {"zh_web": "rules/zh_web.yaml", "en_web": "rules/en_web.yaml"}, "builtin": False}},
            ],
        },
    )


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def rule_line(explained: str, rule: str) -> tuple[str, str]:
    """(ok | FAIL, "(min 0.1)") of one rule line of `datapipe explain`."""
    for line in explained.splitlines():
        m = re.match(rf"\s+(ok|FAIL)\s+{re.escape(rule)}\s.*(\((?:min|max) [^)]*\))$", line)
        if m:
            return m.group(1), m.group(2)
    raise AssertionError(f"no rule line for {rule} in:\n{explained}")


# --- without Ray: what is recorded and what counts as a change ----------------------------------


def test_resources_list_rule_files_lists_and_model(tmp_path: Path) -> None:
    pipe = load_pipeline(project(tmp_path, 5, 5))
    entries = {(e["role"], e["path"]): e for e in pipe.resources()}
    assert set(entries) == {
        ("model", "lid.176.ftz"),
        ("rules", "rules/zh_web.yaml"),
        ("rules", "rules/en_web.yaml"),
        ("word_list", "words/spam.txt"),
        ("word_list", "filters/words/adult.txt"),
        ("word_list", "filters/words/gambling.txt"),
        ("domain_list", "filters/blocklist/domains.txt"),
    }
    zh = entries[("rules", "rules/zh_web.yaml")]
    raw = (tmp_path / "rules" / "zh_web.yaml").read_bytes()
    assert zh["key"] == "zh_web" and zh["content"] == raw.decode() and zh["sha256"] == hashlib.sha256(raw).hexdigest()
    model = entries[("model", "lid.176.ftz")]
    assert "content" not in model and len(model["sha256"]) == 64  # models by hash only


def test_builtin_rule_sets_and_license_table_are_covered(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    pipe = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "b",
                "sources": [{"name": "w", "kind": "web", "paths": ["a.jsonl"]}],
                "stages": [{"quality": {"rules": "auto"}}, {"license": {}}],
            },
        )
    )
    paths = {e["path"] for e in pipe.resources()}
    assert {f"filters/quality/{p.name}" for p in filter_file("quality").glob("*.yaml")} <= paths
    assert {"filters/words/spam.txt", "filters/blocklist/domains.txt", "filters/licenses/classes.yaml"} <= paths


def test_fingerprint_is_deterministic_and_covers_thresholds(tmp_path: Path) -> None:
    path = project(tmp_path, 5, 5)
    fingerprint, resources = load_pipeline(path).fingerprint(), load_pipeline(path).resources()
    assert load_pipeline(path).fingerprint() == fingerprint
    rules = tmp_path / "rules" / "zh_web.yaml"
    edit(rules, "han_ratio: 0.1 ", "han_ratio: 0.5 ")
    changed = load_pipeline(path)
    assert changed.fingerprint() != fingerprint
    assert resource_changes(resources, changed.resources()) == ["rules/zh_web.yaml: filters.zh.han_ratio: 0.1 -> 0.5"]


def test_fingerprint_of_a_pipeline_without_resource_files_is_unchanged(tmp_path: Path) -> None:
    """Stages that read no files add nothing: such a pipeline keeps the fingerprint it always had."""
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    pipe = load_pipeline(
        write_pipeline(
            tmp_path, {"name": "c", "sources": [{"name": "w", "paths": ["a.jsonl"]}], "stages": [{"length": {}}, {"dedup": {}}]}
        )
    )
    assert pipe.resources() == []
    assert pipe.fingerprint() == hashlib.sha256(json.dumps(pipe.normalized(), sort_keys=True).encode()).hexdigest()[:16]


def test_comments_and_order_are_no_change_but_entries_are(tmp_path: Path) -> None:
    path = project(tmp_path, 5, 5)
    before = load_pipeline(path).resources()
    words = tmp_path / "words" / "spam.txt"
    lines = words.read_text(encoding="utf-8").splitlines()
    words.write_text("# reviewed\n" + "\n".join(reversed(lines)) + "\n", encoding="utf-8")
    edit(tmp_path / "rules" / "en_web.yaml", "filters:", "# a comment\nfilters:")
    assert resource_changes(before, load_pipeline(path).resources()) == []
    words.write_text(words.read_text(encoding="utf-8") + "Limited Offer Today\n", encoding="utf-8")
    (tmp_path / "rules" / "zh_web.yaml").unlink()
    changes = resource_changes(before, _resources_without_validation(path))
    assert "words/spam.txt: 1 entries added ('limited offer today'), 0 removed" in changes
    assert any(c.startswith("rules/zh_web.yaml: file not found now") for c in changes)


def _resources_without_validation(path: Path) -> list[dict]:
    """Validation refuses a missing rule file; the run identity still has to name it when asked directly."""
    from datapipe.pipeline.identity import record_resources
    from datapipe.stages import STAGES

    quality = STAGES["quality"]
    opts = quality.Options(rules={"zh_web": "rules/zh_web.yaml", "en_web": "rules/en_web.yaml"}, builtin=False)
    langid = STAGES["langid"]
    files = [("langid", f) for f in langid.resource_files(langid.Options(keep=["zh", "en"]), path.parent)]
    files += [("quality", f) for f in quality.resource_files(opts, path.parent)]
    return record_resources(files, path.parent)


def test_a_custom_model_is_recorded_by_its_hash(tmp_path: Path) -> None:
    from datapipe.stages import STAGES

    model = tmp_path / "m.bin"
    model.write_bytes(b"not really a model")
    langid = STAGES["langid"]
    (f,) = langid.resource_files(langid.Options(model="m.bin"), tmp_path)
    assert f.path == model and f.role == "model" and not f.content


# --- one real run: refused, accepted with --fresh, explained with the run's own rules ------------


def test_edited_rules_stop_a_resume_and_explain_uses_the_recorded_ones(ray_local, tmp_path: Path) -> None:
    pipeline = project(tmp_path)
    out = tmp_path / "out"

    def run(**kw):
        return run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None, **kw)

    def query(sql: str) -> list[tuple]:
        with connect_stats(out) as con:
            return con.execute(sql).fetchall()

    first = run()
    recorded = json.loads((out / "run.json").read_text(encoding="utf-8"))["resources"]
    assert any(e["path"] == "rules/zh_web.yaml" and "han_ratio: 0.1 " in e["content"] for e in recorded)
    # Kept zh pages with less than half Han characters (docs with code and SQL): what the edit below drops.
    mixed = [
        r[0]
        for r in query(
            "select id from documents where quality_rules = 'zh_web' and status = 'kept' and zh_han_ratio < 0.5 order by id"
        )
    ]
    assert mixed, "the sample should hold zh pages with code (Han ratio between 0.1 and 0.5)"

    again = run()  # unchanged: resumes, nothing to do
    assert first.executed_tasks > 0 and again.executed_tasks == 0

    # A run.json from before rule files were recorded: explain says it grades against today's file, and a
    # rerun (nothing to compare with) is accepted and records them.
    run_json = out / "run.json"
    old_style = json.loads(run_json.read_text(encoding="utf-8"))
    del old_style["resources"]
    run_json.write_text(json.dumps(old_style), encoding="utf-8")
    shown = CliRunner().invoke(main, ["explain", str(out), mixed[0]])
    assert f"graded against today's {tmp_path / 'rules' / 'zh_web.yaml'}" in shown.output
    assert run().executed_tasks == 0
    assert json.loads(run_json.read_text(encoding="utf-8"))["resources"] == recorded

    words = tmp_path / "words" / "spam.txt"
    original_words = words.read_text(encoding="utf-8")
    words.write_text(original_words + "数据库\n", encoding="utf-8")
    with pytest.raises(PipelineError) as info:
        run()
    assert "words/spam.txt: 1 entries added ('数据库'), 0 removed" in str(info.value)
    words.write_text(original_words, encoding="utf-8")

    rules = tmp_path / "rules" / "zh_web.yaml"
    edit(rules, "han_ratio: 0.1 ", "han_ratio: 0.5 ")
    with pytest.raises(PipelineError) as info:
        run()
    assert "rules/zh_web.yaml: filters.zh.han_ratio: 0.1 -> 0.5" in str(info.value)
    assert "--fresh" in str(info.value)

    # The refused run changed nothing: explain grades with the thresholds the run used, and says the file changed.
    shown = CliRunner().invoke(main, ["explain", str(out), mixed[0]])
    assert shown.exit_code == 0, shown.output
    assert "rules/zh_web.yaml has changed since this run" in shown.output
    assert rule_line(shown.output, "zh:han_ratio") == ("ok", "(min 0.1)")

    fresh = run(fresh=True)
    assert fresh.executed_tasks > 0
    rows = dict(query("select id, reason from documents where id in (" + ",".join(f"'{i}'" for i in mixed) + ")"))
    assert rows == {i: "zh:han_ratio" for i in mixed}  # the new threshold judged every page, in every worker
    shown = CliRunner().invoke(main, ["explain", str(out), mixed[0]])
    assert rule_line(shown.output, "zh:han_ratio") == ("FAIL", "(min 0.5)")
    assert "has changed since this run" not in shown.output


def test_a_rule_file_edited_while_the_run_runs_leaves_it_incomplete(ray_local, tmp_path: Path) -> None:
    pipeline = project(tmp_path, 20, 10)
    out = tmp_path / "out"
    rules = tmp_path / "rules" / "zh_web.yaml"

    def edit_when_running(message: str) -> None:  # the runner logs this once tasks are about to start
        if "running" in message:
            edit(rules, "han_ratio: 0.1 ", "han_ratio: 0.5 ")

    with pytest.raises(PipelineError) as info:
        run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=edit_when_running)
    assert "changed while it ran" in str(info.value)
    assert "rules/zh_web.yaml: filters.zh.han_ratio: 0.1 -> 0.5" in str(info.value)
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["status"] == "running"
    with pytest.raises(PipelineError, match="--fresh"):  # the record still says 0.1
        run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
