"""Stage registry: the stage types a pipeline file may name under ``stages:``."""

from __future__ import annotations

from datapipe.stages.base import Decision, GlobalStage, ReduceInputs, Resources, Stage, StageContext, StageOptions
from datapipe.stages.boilerplate import Boilerplate
from datapipe.stages.classify import Classify
from datapipe.stages.decontaminate import Decontaminate
from datapipe.stages.dedup import ExactDedup
from datapipe.stages.langid import LangId
from datapipe.stages.length import LengthFilter
from datapipe.stages.license import LicenseTagger
from datapipe.stages.minhash import MinHashDedup
from datapipe.stages.pii import Pii
from datapipe.stages.quality import Quality

STAGES: dict[str, type[Stage]] = {
    cls.name: cls for cls in (LangId, LengthFilter, Quality, Pii, ExactDedup, MinHashDedup, LicenseTagger,
                              Decontaminate, Classify, Boilerplate)
}

__all__ = ["STAGES", "Decision", "GlobalStage", "ReduceInputs", "Resources", "Stage", "StageContext", "StageOptions"]
