"""Stage registry: the stage types a pipeline file may name under ``stages:``.

Stage modules are imported when a stage type is first looked up, not with this package: a Ray
worker then imports only the stages its pipeline uses (decontaminate's and minhash's numba
kernels, for example, cost seconds and tens of MB to import), and so does the CLI.

Stage types of other packages come through entry points in group ``datapipe.stages``
(``name = "module:StageClass"``, ``datapipe/plugins``): found on the first lookup of a name that is
not built in (or when every name is listed), imported when first looked up, like the built-in ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

from datapipe.plugins import STAGE_GROUP, Plugin, PluginError, discover
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

# name in a pipeline file -> (module, class); each class's ``name`` must equal its key (tested).
_REGISTRY: dict[str, tuple[str, str]] = {
    "langid": ("datapipe.stages.langid", "LangId"),
    "length": ("datapipe.stages.length", "LengthFilter"),
    "quality": ("datapipe.stages.quality", "Quality"),
    "pii": ("datapipe.stages.pii", "Pii"),
    "dedup": ("datapipe.stages.dedup", "ExactDedup"),
    "minhash": ("datapipe.stages.minhash", "MinHashDedup"),
    "semantic": ("datapipe.stages.semantic", "SemanticDedup"),
    "license": ("datapipe.stages.license", "LicenseTagger"),
    "decontaminate": ("datapipe.stages.decontaminate", "Decontaminate"),
    "classify": ("datapipe.stages.classify", "Classify"),
    "boilerplate": ("datapipe.stages.boilerplate", "Boilerplate"),
    "substrings": ("datapipe.stages.substrings", "Substrings"),
    "annotate": ("datapipe.stages.annotate", "Annotate"),
}


class _LazyStages(MutableMapping[str, type[Stage]]):
    """Stage name -> class, importing a stage's module on first lookup. Assignable like a dict
    (tests register stages of their own). Installed plugins' stages are added on the first lookup
    of a name not registered here."""

    def __init__(self, registry: dict[str, tuple[str, str]]) -> None:
        self._registry = dict(registry)
        self._loaded: dict[str, type[Stage]] = {}
        self._plugins: dict[str, Plugin] | None = None  # None: entry points not read yet

    def __setitem__(self, name: str, cls: type[Stage]) -> None:
        self._registry[name] = (cls.__module__, cls.__qualname__)
        self._loaded[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._registry[name]
        self._loaded.pop(name, None)

    def __getitem__(self, name: str) -> type[Stage]:
        if name not in self._loaded:
            if name in self._registry:
                module, cls = self._registry[name]
                self._loaded[name] = getattr(importlib.import_module(module), cls)
            else:
                self._loaded[name] = _plugin_stage(self._discovered()[name])  # KeyError for an unknown name
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._registry or name in self._discovered()

    def __iter__(self) -> Iterator[str]:
        return iter([*self._registry, *(n for n in self._discovered() if n not in self._registry)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def _discovered(self) -> dict[str, Plugin]:
        if self._plugins is None:
            plugins = discover(STAGE_GROUP)
            clashes = [
                f"{plugin.describe()} clashes with the built-in stage {name!r}; the plugin must register "
                f"its stage under another name"
                for name, plugin in plugins.items()
                if name in _REGISTRY
            ]
            if clashes:  # raised again on the next lookup: which stage a pipeline means cannot be told
                raise PluginError(*clashes)
            self._plugins = plugins
        return self._plugins


def _plugin_stage(plugin: Plugin) -> type[Stage]:
    cls = plugin.load()
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise PluginError(f"{plugin.describe()} is {cls!r}, not a datapipe.stages.Stage subclass")
    if getattr(cls, "name", None) != plugin.name:
        raise PluginError(
            f"{plugin.describe()}: the class's name is {getattr(cls, 'name', None)!r}; it must be the entry point's name"
        )
    return cls


STAGES: MutableMapping[str, type[Stage]] = _LazyStages(_REGISTRY)


def register_stage(cls: type[Stage], replace: bool = False) -> type[Stage]:
    """Make ``cls`` a stage type pipeline files may name (as ``cls.name``). Usable as a class decorator.

    A stage defined outside this package (a plugin, a test) registers itself here; a global stage
    needs nothing else: the engine runs the steps it declares (``GlobalStage.steps()``). Ray workers
    find it if its module is importable there (the stage's options are pickled by reference to it).
    """
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise TypeError(f"{cls!r} is not a Stage subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"stage class {cls.__qualname__} sets no name")
    if name in STAGES and not replace and STAGES[name] is not cls:
        raise ValueError(f"a stage named {name!r} is already registered ({STAGES[name].__qualname__})")
    STAGES[name] = cls
    return cls


def unregister_stage(name: str) -> None:
    """Forget a stage registered with ``register_stage`` (tests clean up with it)."""
    del STAGES[name]


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
    "register_stage",
    "state_rows",
    "unregister_stage",
]
