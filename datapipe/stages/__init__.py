"""Stage registry: the stage types a pipeline file may name under ``stages:``.

Stage modules are imported when a stage type is first looked up, not with this package: a Ray
worker then imports only the stages its pipeline uses (decontaminate's and minhash's numba
kernels, for example, cost seconds and tens of MB to import), and so does the CLI.

Stage types of other packages come through entry points in group ``datapipe.stages``
(``name = "module:StageClass"``, ``datapipe/plugins``): found on the first lookup of a name that is
not built in (or when every name is listed), imported when first looked up, like the built-in ones.
"""

from __future__ import annotations

from datapipe.plugins import STAGE_GROUP, Registry
from datapipe.stages.base import Decision, Resources, Stage, StageContext, StageOptions
from datapipe.stages.global_stage import (
    CombineStep,
    GlobalStage,
    PartitionResult,
    PartitionStep,
    ReduceInputs,
    drop_rows,
    no_drops,
    state_rows,
)


def _check_stage(name: str, cls: object) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        return f"is {cls!r}, not a datapipe.stages.Stage subclass"
    if getattr(cls, "name", None) != name:
        return f"is a stage named {getattr(cls, 'name', None)!r}; its name must be the registered one"
    return None


# The built-in stages: name in a pipeline file -> "module:class", in the order the docs list them.
# A new stage is one line here.
STAGES: Registry[type[Stage]] = Registry(
    "stage",
    STAGE_GROUP,
    {
        "langid": "datapipe.stages.langid:LangId",
        "length": "datapipe.stages.length:LengthFilter",
        "quality": "datapipe.stages.quality:Quality",
        "pii": "datapipe.stages.pii:Pii",
        "dedup": "datapipe.stages.dedup:ExactDedup",
        "minhash": "datapipe.stages.minhash:MinHashDedup",
        "semantic": "datapipe.stages.semantic:SemanticDedup",
        "boilerplate": "datapipe.stages.boilerplate:Boilerplate",
        "substrings": "datapipe.stages.substrings:Substrings",
        "license": "datapipe.stages.license:LicenseTagger",
        "decontaminate": "datapipe.stages.decontaminate:Decontaminate",
        "classify": "datapipe.stages.classify:Classify",
        "annotate": "datapipe.stages.annotate:Annotate",
    },
    check=_check_stage,
    name_of=lambda cls: cls.name,
)

__all__ = [
    "STAGES",
    "CombineStep",
    "Decision",
    "GlobalStage",
    "PartitionResult",
    "PartitionStep",
    "ReduceInputs",
    "Resources",
    "Stage",
    "StageContext",
    "StageOptions",
    "drop_rows",
    "no_drops",
    "state_rows",
]
