"""The input formats a pipeline may read: built-in reader specs, then those of installed plugins.

Plugins (entry point group ``datapipe.readers``, ``datapipe/plugins``) are loaded on the first
lookup of a name that is not built in, or when every format is needed (inferring a format from a
file name, listing the allowed ones); a run that names only built-in formats imports no plugin.
A plugin whose name, suffix, folder kind or archive kind clashes with another format's is an
error: which reader a file would get could not be told.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from datapipe.plugins import READER_GROUP, PluginError, discover
from datapipe.readers.archives import ARCHIVE_SUFFIXES
from datapipe.readers.spec import ReaderSpec


class ReaderRegistry(Mapping[str, ReaderSpec]):
    """Format name -> its ``ReaderSpec``."""

    def __init__(self, *builtins: ReaderSpec) -> None:
        self._builtin = {s.format: s for s in builtins}
        if len(self._builtin) != len(builtins):
            raise ValueError("two built-in reader specs share a format name")
        self._specs = dict(self._builtin)
        self._origin: dict[str, str] = {}  # plugin format -> its entry point, for error messages
        self._plugins_loaded = False
        self._suffixes: dict[str, list[tuple[str, str]]] = {}  # kind -> (suffix, format), longest first
        problems = _clashes(self._specs, self._who)
        if problems:
            raise ValueError("; ".join(problems))

    def __getitem__(self, fmt: str) -> ReaderSpec:
        if fmt not in self._specs:
            self._load_plugins()
        return self._specs[fmt]  # KeyError for an unknown format, as a dict would

    def __contains__(self, fmt: object) -> bool:
        if fmt not in self._specs:
            self._load_plugins()
        return fmt in self._specs

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(list(self._specs))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._specs)

    def replace(self, spec: ReaderSpec) -> None:
        """Put ``spec`` in place of the registered spec of its format (tests swap a reader this way)."""
        if spec.format not in self:
            raise KeyError(f"no reader for format {spec.format!r} to replace")
        self._specs[spec.format] = spec
        self._suffixes.clear()

    def infer(self, path: Path, kind: str = "text") -> str | None:
        """The format of an input from its name, and for folders and archives from the source kind
        (a .tar.gz is a code repository for kind code and an arXiv source for kind paper)."""
        if path.is_dir():
            return next((f for f, s in self.items() if kind in s.folder_kinds), None)
        name = path.name.lower()
        if name.endswith(ARCHIVE_SUFFIXES):
            return next((f for f, s in self.items() if kind in s.archive_kinds), None)
        for suffix, fmt in self._suffix_table(kind):
            if name.endswith(suffix):
                return fmt
        return None

    def _suffix_table(self, kind: str) -> list[tuple[str, str]]:
        if kind not in self._suffixes:
            self._load_plugins()
            # (length, kind-specific first): ".warc.wet.gz" wins over ".gz", paper's ".gz" over a general one
            entries = [(len(s), 0, s, f) for f, spec in self._specs.items() for s in spec.kind_suffixes.get(kind, ())]
            entries += [(len(s), 1, s, f) for f, spec in self._specs.items() for s in spec.suffixes]
            entries.sort(key=lambda e: (-e[0], e[1]))
            self._suffixes[kind] = [(s, f) for _, _, s, f in entries]
        return self._suffixes[kind]

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        found: dict[str, ReaderSpec] = {}
        problems: list[str] = []
        for name, plugin in discover(READER_GROUP).items():
            if name in self._builtin:
                problems.append(
                    f"{plugin.describe()} clashes with the built-in format {name!r}; the plugin "
                    f"must register its reader under another name"
                )
                continue
            try:
                spec = plugin.load()
            except PluginError as exc:
                problems += exc.problems
                continue
            if not isinstance(spec, ReaderSpec):
                problems.append(f"{plugin.describe()} is a {type(spec).__name__}, not a datapipe.readers.spec.ReaderSpec")
            elif spec.format != name:
                problems.append(
                    f"{plugin.describe()} declares format {spec.format!r}; the entry point's name must be the format's"
                )
            else:
                found[name] = spec
                self._origin[name] = plugin.describe()
        specs = {**self._specs, **found}
        problems += _clashes(specs, self._who)
        if problems:  # every plugin problem at once; raised again on the next lookup
            raise PluginError(*problems)
        self._specs = specs
        self._suffixes.clear()
        self._plugins_loaded = True

    def _who(self, fmt: str) -> str:
        return f"reader {fmt!r} ({self._origin[fmt]})" if fmt in self._origin else f"built-in reader {fmt!r}"


def _clashes(specs: dict[str, ReaderSpec], who: Callable[[str], str]) -> list[str]:
    """Two formats claiming one suffix (for one kind), one kind's folders or one kind's archives."""
    claims: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    for fmt, spec in specs.items():
        wanted = [("suffix", s) for s in spec.suffixes]
        wanted += [(f"suffix for kind {kind}", s) for kind, group in spec.kind_suffixes.items() for s in group]
        wanted += [("folders of kind", k) for k in spec.folder_kinds]
        wanted += [("archives of kind", k) for k in spec.archive_kinds]
        for claim in wanted:
            if claim in claims and claims[claim] != fmt:
                problems.append(f"{who(fmt)} and {who(claims[claim])} both claim the {claim[0]} {claim[1]!r}")
            claims.setdefault(claim, fmt)
    return problems
