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

from datapipe.plugins import READER_GROUP, PluginError, Registry
from datapipe.readers.archives import ARCHIVE_SUFFIXES
from datapipe.readers.spec import ReaderSpec


def _check_spec(name: str, spec: object) -> str | None:
    if not isinstance(spec, ReaderSpec):
        return f"is a {type(spec).__name__}, not a datapipe.readers.spec.ReaderSpec"
    if spec.format != name:
        return f"declares format {spec.format!r}; the entry point's name must be the format's"
    return None


class ReaderRegistry(Registry[ReaderSpec]):
    """Format name -> its ``ReaderSpec``; the built-ins by module path (``"module:SPEC"``).

    Unlike stages, a lookup of a plugin's format loads every plugin format: suffixes and folder
    kinds are checked across all of them, so a clash is found before any file is read.
    """

    def __init__(self, builtins: Mapping[str, str]) -> None:
        super().__init__("format", READER_GROUP, builtins, check=_check_spec, name_of=lambda spec: spec.format)
        self._checked = False
        self._suffixes: dict[str, list[tuple[str, str]]] = {}  # kind -> (suffix, format), longest first

    def __getitem__(self, fmt: str) -> ReaderSpec:
        if not self.is_builtin(fmt):
            self._check_all()
        return self._get(fmt)

    def __iter__(self) -> Iterator[str]:
        self._check_all()
        return super().__iter__()

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
            self._check_all()
            specs = self.load_all()
            # (length, kind-specific first): ".warc.wet.gz" wins over ".gz", paper's ".gz" over a general one
            entries = [(len(s), 0, s, f) for f, spec in specs.items() for s in spec.kind_suffixes.get(kind, ())]
            entries += [(len(s), 1, s, f) for f, spec in specs.items() for s in spec.suffixes]
            entries.sort(key=lambda e: (-e[0], e[1]))
            self._suffixes[kind] = [(s, f) for _, _, s, f in entries]
        return self._suffixes[kind]

    def _check_all(self) -> None:
        """Every format loaded and checked against the others once; raised again until it passes."""
        if not self._checked:
            problems = _clashes(self.load_all(), self._who)
            if problems:
                raise PluginError(*problems)
            self._checked = True

    def _changed(self) -> None:
        self._checked = False
        self._suffixes.clear()

    def _who(self, fmt: str) -> str:
        plugin = self.plugin_of(fmt)
        return f"reader {fmt!r} ({plugin.describe()})" if plugin else f"built-in reader {fmt!r}"


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
