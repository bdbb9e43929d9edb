"""The import graph of ``datapipe/``: no circles, no import up the layers (LAYERS, below), and a loader
that stands on its own.

Every ``import`` statement in every module counts, at module level and inside functions alike.
Some function-level imports exist only to keep start-up fast (the CLI imports the engine when
``run`` is called, ``engine.audit`` imports DuckDB when it builds the database); they are still
dependencies: the code cannot run without the other module, and a circle through a lazy import
is a circle that merely has not bitten yet (it bites as soon as someone moves the import to the
top, or imports the other side first). So the test does not tell the two apart; imports under
``if TYPE_CHECKING:`` count too (the annotations still name the other module).

Edges: ``import datapipe.a.b`` and ``from datapipe.a import b`` are an edge to ``datapipe.a.b``
when that is a module, else to ``datapipe.a`` (``from datapipe.a import name``). Importing
``datapipe.a.b`` also runs ``datapipe/a/__init__.py``, but that implicit parent import is not an
edge: counting it would make every package that re-exports its submodules a circle. An explicit
``from datapipe.a import name`` inside ``datapipe.a.b`` is an edge, so a submodule that imports
its own package's re-exports is reported. Imports by name string (``importlib.import_module``,
as the stage registry does) are not statements and are not seen.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "datapipe"

# What the loader may import besides itself and the shard format: the standard library and
# the array/tensor libraries a training job has anyway (llvmlite is numba's compiler; the
# kernels ask it for the CPU's features).
LOADER_THIRD_PARTY = {"numpy", "pyarrow", "torch", "numba", "llvmlite"}
# Writing shards (atomically, recorded for object storage) is tokens/shard_writer.py's, not the format's,
# so the shard format is pyarrow and numpy only and a training job gets nothing else of datapipe.
# datapipe.errors is the base of every datapipe error (ShardCorrupt, StateMismatch): it imports nothing.
LOADER_ALLOWED_DATAPIPE = ("datapipe.loader", "datapipe.tokens.shard_format", "datapipe.errors")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported name, line) for every import statement in the module, anywhere in it.
    Names inside datapipe are resolved to the module they load; others are kept as written."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
    return found


@functools.cache  # parsed once for all the tests
def _graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int], dict[str, list[tuple[str, int]]]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], int] = {}
    raw: dict[str, list[tuple[str, int]]] = {}
    for name, path in modules.items():
        raw[name] = _imports(name, path, modules)
        for target, line in raw[name]:
            if target == name:
                continue
            # `import datapipe.a.b.c` where c is a function or class: the longest module prefix
            while target and target not in modules and target.startswith("datapipe."):
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                graph[name].add(target)
                lines.setdefault((name, target), line)
    return graph, lines, raw


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Iterative DFS, white/grey/black."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = todo.pop(0)
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph[nxt])))
    return None


def test_walker_sees_module_and_function_level_imports():
    graph, _, _ = _graph()
    # module level
    assert "datapipe.tokens.shard_format" in graph["datapipe.loader.shards"]
    # function level (the CLI imports the runner inside the `run` command)
    assert "datapipe.engine.runner" in graph["datapipe.cli.run"]
    # the walker finds a cycle when there is one
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles():
    graph, lines, _ = _graph()
    cycle = _find_cycle(graph)
    if cycle:
        paths = _modules()
        steps = "\n".join(
            f"  {a} -> {b}  ({paths[a].relative_to(ROOT.parent)}:{lines[(a, b)]})" for a, b in zip(cycle, cycle[1:])
        )
        raise AssertionError(f"import circle in datapipe/:\n{steps}")


def test_loader_imports_only_loader_shard_format_and_array_libraries():
    _, _, raw = _graph()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for name, imports in raw.items():
        if not name.startswith("datapipe.loader"):
            continue
        for target, line in imports:
            top = target.split(".")[0]
            if top == "datapipe":
                if not any(target == a or target.startswith(a + ".") for a in LOADER_ALLOWED_DATAPIPE):
                    bad.append(f"{name}:{line} imports {target}")
            elif top not in stdlib and top not in LOADER_THIRD_PARTY:
                bad.append(f"{name}:{line} imports {target}")
    assert not bad, (
        "the loader must import only datapipe.loader, datapipe.tokens.shard_format and "
        f"stdlib/{'/'.join(sorted(LOADER_THIRD_PARTY))}:\n" + "\n".join(bad)
    )


def test_loader_needs_nothing_else_of_datapipe_transitively():
    """What a training job imports with the loader: the loader, the shard format, and what they import."""
    graph, _, raw = _graph()
    reached, todo = set(), [m for m in graph if m.startswith("datapipe.loader")]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo.extend(graph[m])
    outside = sorted(m for m in reached if not any(m == a or m.startswith(a + ".") for a in LOADER_ALLOWED_DATAPIPE))
    assert not outside, f"the loader reaches {outside}"
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert {
        t.split(".")[0] for t, _ in raw["datapipe.tokens.shard_format"] if t != "datapipe.errors"
    } <= stdlib | LOADER_THIRD_PARTY
    assert {t for t, _ in raw["datapipe.errors"]} <= {"__future__"}


# The layers of datapipe/, bottom up: a module may import its own layer and the ones below, never one
# above. Every top-level module and folder of datapipe/ must be in exactly one layer (a new one is placed
# here).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"storage", "config", "schema", "errors", "plugins"}),
    frozenset({"runtime", "assets", "text"}),
    frozenset({"tokens", "dedup", "license", "classify"}),
    frozenset({"readers", "loader", "run_folder", "decontaminate"}),
    frozenset({"stages"}),
    frozenset({"pipeline"}),
    frozenset({"audit"}),
    frozenset({"view"}),  # the web viewer: above audit and the loader, never importing the engine
    frozenset({"train", "export", "ablate"}),
    frozenset({"engine"}),  # imported by the CLI only (test_only_the_cli_imports_the_engine)
    frozenset({"cli"}),
)
# datapipe/__init__.py itself: it imports datapipe.runtime.arrow_pandas (in `datapipe run` workers), so
# it sits with runtime; a module below that must not import the bare package.
PACKAGE_LAYER = 2


def _layer(module: str) -> int:
    """1-based layer of datapipe.<top>[.…]; KeyError for a top-level name in no layer."""
    parts = module.split(".")
    if len(parts) == 1:
        return PACKAGE_LAYER
    for n, members in enumerate(LAYERS, start=1):
        if parts[1] in members:
            return n
    raise KeyError(parts[1])


def test_every_top_level_module_and_folder_has_a_layer():
    names = {
        p.stem
        for p in ROOT.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())
    }
    missing = sorted(n for n in names if not any(n in layer for layer in LAYERS))
    assert not missing, f"datapipe/{missing} are in no layer: add them to LAYERS in tests/test_imports.py"
    twice = sorted(n for n in set().union(*LAYERS) if sum(n in layer for layer in LAYERS) > 1)
    assert not twice, f"{twice} are in more than one layer"


def _upward_imports(raw: dict[str, list[tuple[str, int]]] | None = None, modules: dict[str, Path] | None = None) -> list[str]:
    """Every import statement (module or function level) of a lower layer's module that loads a higher one
    (of datapipe/ by default)."""
    modules = _modules() if modules is None else modules
    raw = _graph()[2] if raw is None else raw
    found = []
    for name, imports in raw.items():
        for target, line in imports:
            while target and target not in modules and target.startswith("datapipe."):
                target = target.rsplit(".", 1)[0]  # `from datapipe.a.b import func`: module datapipe.a.b
            if target not in modules or target == name:
                continue
            if _layer(target) > _layer(name):
                where = f"{modules[name].relative_to(ROOT.parent)}:{line}"
                found.append(f"{where}: {name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})")
    return sorted(found)


# Upward imports found when the layers were defined, to be fixed (then removed here): (importer, imported).
KNOWN_UPWARD: set[tuple[str, str]] = set()  # (importer, imported) pairs allowed for now: none


def test_no_import_points_up_the_layers():
    found = _upward_imports()
    bad = [f for f in found if not any(f": {a} (" in f and f" imports {b} (" in f for a, b in KNOWN_UPWARD)]
    assert not bad, f"{len(bad)} imports point up the layers (LAYERS in tests/test_imports.py):\n" + "\n".join(bad)
    fixed = sorted(k for k in KNOWN_UPWARD if not any(f": {k[0]} (" in f and f" imports {k[1]} (" in f for f in found))
    assert not fixed, f"no longer imported upwards, remove from KNOWN_UPWARD: {fixed}"


def test_layer_check_sees_an_upward_import():
    assert _layer("datapipe.storage.uri") == 1 and _layer("datapipe.cli.summary") == 11
    assert _layer("datapipe.stages.quality.text") == 5 and _layer("datapipe") == PACKAGE_LAYER
    modules = {
        m: ROOT / (m.split(".", 1)[1].replace(".", "/") + ".py")
        for m in ("datapipe.text.charclass", "datapipe.stages.pii", "datapipe.engine.runner")
    }
    raw = {
        "datapipe.text.charclass": [("datapipe.stages.pii.redact", 7)],  # up: a function of a module
        "datapipe.stages.pii": [("datapipe.text.charclass", 3), ("re", 1)],  # down, and not datapipe
        "datapipe.engine.runner": [("datapipe.stages.pii", 5)],
    }
    assert _upward_imports(raw, modules) == [
        "datapipe/text/charclass.py:7: datapipe.text.charclass (layer 2) imports datapipe.stages.pii (layer 5)"
    ]


def _top(module: str) -> str:
    """The top-level folder or module of datapipe/ a module is in (``datapipe.engine.tasks.map``: engine)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_only_the_cli_imports_the_engine():
    """What reads a finished run (audit, exports, training, the loader) or anything below must not
    depend on how the run was made: the engine is a client of the rest, and only the CLI runs it."""
    graph, lines, _ = _graph()
    paths = _modules()
    bad = [
        f"{paths[a].relative_to(ROOT.parent)}:{lines[(a, b)]}: {a} imports {b}"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if _top(b) == "engine" and _top(a) not in ("engine", "cli")
    ]
    assert not bad, "only datapipe/cli/ may import datapipe/engine/:\n" + "\n".join(bad)


RAY_FOLDER = "datapipe.engine.executors.ray"


def test_ray_is_imported_only_in_the_ray_executor_folder():
    """Ray is one backend of the executor seam: everything that imports it sits in
    engine/executors/ray/, so another backend is a sibling folder and the rest runs without Ray."""
    _, _, raw = _graph()
    paths = _modules()
    bad = [
        f"{paths[name].relative_to(ROOT.parent)}:{line}: {name} imports {target}"
        for name, imports in sorted(raw.items())
        for target, line in imports
        if target.split(".")[0] == "ray" and not (name == RAY_FOLDER or name.startswith(RAY_FOLDER + "."))
    ]
    assert not bad, f"Ray imported outside {RAY_FOLDER.replace('.', '/')}/:\n" + "\n".join(bad)


def _private_imports() -> list[str]:
    """``from datapipe.a.m import _name`` (or ``import datapipe.a._m``) where the importer is not in
    datapipe/a/: another package's private name."""
    paths = _modules()
    found = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.startswith("datapipe"):
                targets = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [(a.name, "") for a in node.names if a.name.startswith("datapipe")]
            else:
                continue
            for module, imported in targets:
                private = [p for p in [*module.split("."), imported] if p.startswith("_") and not p.startswith("__")]
                if private and _top(module) != _top(name):
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    found.append(f"{where}: {name} imports {module}{'.' + imported if imported else ''}")
    return sorted(found)


def test_no_package_imports_another_packages_private_names():
    """A name with a leading underscore is its package's own: one another package needs is public
    (named without the underscore, and kept stable as such) or belongs in a shared module."""
    found = _private_imports()
    assert not found, "private names imported across packages of datapipe/:\n" + "\n".join(found)


def test_the_marker_store_knows_nothing_of_the_layout():
    """run_folder/markers.py is handed its folder by RunFolder: a change of the public layout never
    reaches the commit point (and the store can serve another layout)."""
    graph, _, _ = _graph()
    assert "datapipe.run_folder.layout" not in graph["datapipe.run_folder.markers"]
