"""End to end: a real pipeline over the whirlwind WARC, a code archive built here and conv_arithmetic.tex."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from datapipe.audit.sql import connect as connect_stats
from datapipe.engine.errors import PipelineError
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.storage import uri as storage
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def test_ingest_pipeline_conserves_documents_and_records_provenance(ray_local, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(shared_path("web", "warc", "whirlwind_whirlwind.warc.gz"), data)
    shutil.copy(shared_path("web", "warc", "warcio_post-test.warc.gz"), data)  # 3 JSON responses: not_html
    shutil.copy(shared_path("papers", "conv_arithmetic", "conv_arithmetic.tex"), data)
    files = {
        "LICENSE": shared_path("papers", "conv_arithmetic", "LICENSE").read_bytes(),
        "pkg/__init__.py": b"from .core import run\n",
        "pkg/core.py": b"def run():\n    return 42\n",
        "node_modules/x/index.js": b"module.exports = 1;\n",
        "poetry.lock": b"# lock\n",
    }
    with tarfile.open(data / "tool.tar.gz", "w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(f"tool-main/{name}")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "ingest",
            "sources": [
                {"name": "web", "kind": "web", "paths": ["data/*.warc.gz"]},
                {"name": "code", "kind": "code", "paths": ["data/*.tar.gz"]},
                {"name": "papers", "kind": "paper", "paths": ["data/*.tex"]},
            ],
            "stages": [
                {"length": {"min_chars": 10}},
                {"license": {"policy": {"code": {"deny": ["strong_copyleft", "unknown"]}}}},
            ],
        },
    )
    out = tmp_path / "out"
    result = run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    with connect_stats(out) as con:

        def q(sql: str) -> list[tuple]:
            return con.execute(sql).fetchall()

        # Conservation: 1 page + 3 not_html, 5 repository files, 1 paper; every one kept or rejected once.
        ((n, distinct),) = q("select count(*), count(distinct id) from documents")
        assert n == distinct == 10 == result.run["counts"]["documents"]
        by_source = dict(q("select source, count(*) from documents group by all"))
        assert by_source == {"web": 4, "code": 5, "papers": 1}
        reasons = dict(q("select reason, count(*) from documents where status='rejected' group by all"))
        # LICENSE is no source file (no language) but is attached to every file of its repository.
        assert reasons == {"not_html": 3, "vendored": 1, "lockfile": 1, "unknown_language": 1}
        (web,) = q(
            "select url, domain, warc_record_id, fetch_date, content_type, http_status, charset, license_hints "
            "from documents where source='web' and status='kept'"
        )
        assert web[:7] == (
            "https://an.wikipedia.org/wiki/Escopete",
            "an.wikipedia.org",
            "<urn:uuid:2aabeff2-67f5-4608-8466-e87c6296e2b6>",
            "2024-05-18T01:58:10Z",
            "text/html",
            200,
            "utf-8",
        )
        assert "creativecommons.org/licenses/by-sa" in web[7]
        code = q(
            "select path, repo, code_language, repo_license_files from documents "
            "where source='code' and status='kept' order by path"
        )
        assert [c[:3] for c in code] == [("pkg/__init__.py", "tool", "Python"), ("pkg/core.py", "tool", "Python")]
        license_text = shared_path("papers", "conv_arithmetic", "LICENSE").read_text(encoding="utf-8")
        assert json.loads(code[0][3]) == {"LICENSE": license_text}
        (paper,) = q("select path, arxiv_id, license_url, n_chars from documents where source='papers'")
        assert paper[0] == "conv_arithmetic.tex" and paper[1] is None and paper[3] > 30_000
        assert dict(q("select column_name, column_type from (describe documents)"))["http_status"] == "INTEGER"
        # License tagging reads what the readers kept: the page's CC link, the repository's LICENSE.
        tags = dict(
            (s, (lic, cls, ev))
            for s, lic, cls, ev in q(
                "select source, license, license_class, license_evidence from documents "
                "where status='kept' and path not like 'pkg/__init__%'"
            )
        )
        assert tags["web"][0].startswith("CC-BY-SA-") and "creativecommons.org" in tags["web"][2]
        assert tags["code"][:2] == ("MIT", "permissive") and "LICENSE" in tags["code"][2]
        assert tags["papers"][:2] == ("unknown", "unknown")


def test_folder_inputs_run_resume_and_a_changed_file_is_detected(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder is one input (a site of pages, a repository, a paper's sources): the run lists it by
    the size and times of its files, walked once per run start, resumes on the same folder and
    refuses one whose file changed."""
    walks: Counter[str] = Counter()
    walk = storage._walk_folder

    def counted(path):
        walks[Path(path).name] += 1
        return walk(path)

    monkeypatch.setattr(storage, "_walk_folder", counted)
    site = tmp_path / "data" / "udhr"
    site.mkdir(parents=True)
    pages = ["eng.html", "cmn_hans.html", "jpn.html", "kor.html"]
    for name in pages:
        shutil.copy(shared_path("web", "html", "udhr", name), site)
    repo = tmp_path / "data" / "tool"
    (repo / "pkg").mkdir(parents=True)
    (repo / "LICENSE").write_bytes(shared_path("papers", "conv_arithmetic", "LICENSE").read_bytes())
    (repo / "pkg" / "core.py").write_text("def run():\n    return 42\n")
    paper = tmp_path / "data" / "conv_arithmetic"
    paper.mkdir()
    shutil.copy(shared_path("papers", "conv_arithmetic", "conv_arithmetic.tex"), paper)
    spec = {
        "name": "folders",
        "sources": [
            {"name": "web", "kind": "web", "paths": ["data/udhr"]},
            {"name": "code", "kind": "code", "paths": ["data/tool"]},
            {"name": "papers", "kind": "paper", "paths": ["data/conv_arithmetic"]},
        ],
        "stages": [{"length": {"min_chars": 10}}],
    }
    pipeline = write_pipeline(tmp_path, spec)
    out = tmp_path / "out"
    result = run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    assert result.run["counts"]["documents"] == len(pages) + 2 + 1
    # Listed, sized for the split target and planned: one walk each at the start (three without the
    # memo); one more at the end, where each input is checked against what the tasks read.
    assert walks == {"udhr": 2, "tool": 2, "conv_arithmetic": 2}
    listed = {Path(i["path"]).name: i for i in json.loads((out / "run.json").read_text())["inputs"]}
    assert sorted(listed) == ["conv_arithmetic", "tool", "udhr"]
    assert listed["udhr"]["bytes"] == sum((site / p).stat().st_size for p in pages)

    again = run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    assert again.run["counts"] == result.run["counts"]

    with (site / "eng.html").open("ab") as f:
        f.write(b"<!-- edited -->")
    with pytest.raises(PipelineError, match=r"input modified: .*udhr"):
        run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    (repo / "pkg" / "extra.py").write_text("X = 1\n")
    with pytest.raises(PipelineError, match=r"input modified: .*tool"):
        run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    fresh = run_pipeline(load_pipeline(pipeline), output=out, fresh=True, show_progress=False, log=lambda m: None)
    assert fresh.run["counts"]["documents"] == len(pages) + 3 + 1
