"""A paper's own LICENSE file (beside its LaTeX sources) decides its licence.

Real data: arXiv:1603.07285 (conv_arithmetic), whose source repository ships an MIT LICENSE;
it is read as a folder, as an arXiv-style tarball, and as a lone .tex, then tagged by the
license stage under the README's paper policy.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pytest

from datapipe.stages.base import StageContext
from datapipe.stages.license import LicenseOptions, LicenseTagger
from tests.support.ingest_helpers import read_all
from tests.support.shared_data import shared_path

README_POLICY = {
    "code": {"deny": ["strong_copyleft", "non_commercial", "no_derivatives", "unknown"]},
    "web": {"deny": ["non_commercial", "no_derivatives"]},
    "paper": {"allow": ["permissive", "weak_copyleft"]},
    "default": {"deny": ["non_commercial"]},
}


def _tag(docs: list[dict]) -> tuple[list[dict], list[str | None]]:
    stage = LicenseTagger(LicenseOptions.model_validate({"policy": README_POLICY}), StageContext(".", "."))
    stage.setup()
    batch = stage.compute(pa.Table.from_pylist(docs))
    return batch.to_pylist(), stage.decide(batch).reason.to_pylist()


def _tarball(tmp_path: Path, with_license: bool, top: str = "conv_arithmetic-master") -> Path:
    src = shared_path("papers", "conv_arithmetic")
    names = ["conv_arithmetic.tex", "bibliography.bib", "README.md"] + (["LICENSE"] if with_license else [])
    tar = tmp_path / ("1603.07285.tar.gz" if with_license else "1603.07285v1.tar.gz")
    with tarfile.open(tar, "w:gz") as t:
        for n in names:
            data = (src / n).read_bytes()
            info = tarfile.TarInfo(f"{top}/{n}" if top else n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return tar


@pytest.mark.parametrize("layout", ["folder", "tarball", "flat-tarball", "lone-tex"])
def test_paper_license_file_is_read_and_kept_by_the_readme_policy(tmp_path: Path, layout: str) -> None:
    src = shared_path("papers", "conv_arithmetic")
    path = {
        "folder": lambda: src,
        "tarball": lambda: _tarball(tmp_path, True),
        "flat-tarball": lambda: _tarball(tmp_path, True, top=""),
        "lone-tex": lambda: src / "conv_arithmetic.tex",
    }[layout]()
    (doc,), rejects = read_all(path, "paper")
    assert rejects == [] and doc["path"].endswith("conv_arithmetic.tex")
    files = json.loads(doc["license_files"])
    assert [Path(p).name for p in files] == ["LICENSE"] and files[next(iter(files))].startswith("The MIT License")
    (tagged,), (reason,) = _tag([doc])
    assert (tagged["license"], tagged["license_class"]) == ("MIT", "permissive")
    assert tagged["license_evidence"].startswith("file:") and "LICENSE" in tagged["license_evidence"]
    assert "permission is hereby granted" in tagged["license_evidence"]
    assert reason is None  # paper: {allow: [permissive, weak_copyleft]} keeps it


def test_paper_without_license_file_stays_unknown_and_is_dropped(tmp_path: Path) -> None:
    (doc,), _ = read_all(_tarball(tmp_path, with_license=False), "paper")
    assert doc["license_files"] is None
    (tagged,), (reason,) = _tag([doc])
    assert tagged["license"] == "unknown" and reason == "license_unknown"


def test_arxiv_nonexclusive_does_not_override_the_authors_grant(tmp_path: Path) -> None:
    meta = tmp_path / "meta.jsonl"
    meta.write_text(
        json.dumps({"id": "1603.07285", "license": "http://arxiv.org/licenses/nonexclusive-distrib/1.0/"})
        + "\n"
        + json.dumps({"id": "1603.07286", "license": "http://creativecommons.org/licenses/by-nc-sa/4.0/"})
    )
    (doc,), _ = read_all(_tarball(tmp_path, True), "paper", options={"metadata": str(meta)})
    (tagged,), (reason,) = _tag([doc])
    assert tagged["license"] == "MIT" and reason is None
    nc = dict(doc, license_url="http://creativecommons.org/licenses/by-nc-sa/4.0/")
    (tagged,), (reason,) = _tag([nc])  # both grants apply: the NC one is not dropped from view
    assert tagged["license"] == "MIT AND CC-BY-NC-SA-4.0" and reason == "license_non_commercial"
