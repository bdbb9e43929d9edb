"""The stage registry imports a stage's module only when that stage is looked up."""

from __future__ import annotations

import subprocess
import sys

from datapipe.stages import _REGISTRY, STAGES


def test_every_registered_class_carries_its_registry_name() -> None:
    assert sorted(STAGES) == sorted(_REGISTRY)
    for name in STAGES:
        assert STAGES[name].name == name


def test_importing_the_registry_and_one_stage_leaves_the_others_unimported() -> None:
    probe = (
        "import sys\nfrom datapipe.stages import STAGES\nassert 'length' in STAGES\nSTAGES['length']\n"
        "print(sorted(m for m in ('numba', 'datapipe.stages.minhash', 'datapipe.stages.decontaminate', "
        "'datapipe.stages.length') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['datapipe.stages.length']"]


def test_registering_and_removing_a_stage_like_a_dict() -> None:
    cls = STAGES["length"]
    STAGES["length_copy"] = cls
    try:
        assert STAGES["length_copy"] is cls and "length_copy" in list(STAGES)
    finally:
        del STAGES["length_copy"]
    assert "length_copy" not in STAGES
