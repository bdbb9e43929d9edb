""" "Global" is said one way: ``Stage.global_for(options)``, the planner's only question. A per-document
stage never is, a ``GlobalStage`` always is, and one with ``MayBeGlobal`` says for which options."""

from __future__ import annotations

import pytest

from datapipe.stages import STAGES
from datapipe.stages.base import Stage
from datapipe.stages.global_stage import GlobalStage, MayBeGlobal


def test_every_stage_answers_by_its_kind() -> None:
    for name in STAGES:
        cls = STAGES[name]
        assert not hasattr(cls, "is_global"), f"{name}: say it with global_for, not a class flag"
        if issubclass(cls, MayBeGlobal):
            assert "global_for" in vars(cls), f"{name} may be global: it says when, in its own global_for"
        elif issubclass(cls, GlobalStage):
            assert cls.global_for(None) is True, name
        else:
            assert cls.global_for(None) is False, name
    assert {n for n in STAGES if issubclass(STAGES[n], MayBeGlobal)} >= {"classify", "annotate"}


def test_a_stage_that_may_be_global_must_say_when() -> None:
    class Forgetful(MayBeGlobal, GlobalStage):
        name = "forgetful"

    with pytest.raises(NotImplementedError, match="Forgetful"):
        Forgetful.global_for(object())
    assert Stage.global_for(object()) is False
