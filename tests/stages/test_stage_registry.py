"""The stage registry imports a stage's module only when that stage is looked up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from datapipe.stages import STAGES


def test_every_registered_class_carries_its_registry_name() -> None:
    assert STAGES.builtin_names() and list(STAGES) == STAGES.builtin_names()  # no plugin installed here
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


def test_a_stage_is_put_in_place_for_a_block_only() -> None:
    length = STAGES["length"]
    copy = type("LengthCopy", (length,), {"name": "length_copy"})
    with STAGES.override(copy):
        assert STAGES["length_copy"] is copy and "length_copy" in list(STAGES) and STAGES["length"] is length
    assert "length_copy" not in STAGES and "length_copy" not in list(STAGES)
    with pytest.raises(TypeError):
        STAGES["length_copy"] = copy  # type: ignore[index]  # the registry is read-only
