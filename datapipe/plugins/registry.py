"""One registry for everything a pipeline file names by a word: stage types, input formats.

A ``Registry`` maps a name to a value (a ``Stage`` class, a ``ReaderSpec``). The built-in values
are listed by module path (``"datapipe.stages.length:LengthFilter"``) and imported on first lookup,
so a process imports only what its pipeline names. Other packages' values come through the entry
points of one group (``plugins/entry_points.py``): read on the first lookup of a name that is not
built in, or when every name is listed, and imported when looked up.

Clash rules, each a ``PluginError`` naming the entry point and its distribution:

- a plugin may not take a built-in's name, and two distributions may not share one (``discover``);
- a loaded value must be what the registry holds, under its entry point's name (``check``);
- a registry may add rules over all its values (``ReaderRegistry``: suffixes and folder kinds).

The registry is read-only in production. Tests put values in place for a block with
``registry.override(value, ...)``, a context manager that restores what was there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from datapipe.plugins.entry_points import Plugin, PluginError, discover

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> value: built-ins by module path, installed plugins by entry point, both loaded lazily.

    ``what`` names a value in messages ("stage", "format"); ``check(name, value)`` says what is
    wrong with a loaded value (None: nothing); ``name_of(value)`` is the name a value registers
    under (``override`` takes values, not names).
    """

    def __init__(
        self,
        what: str,
        group: str,
        builtins: Mapping[str, str],
        check: Callable[[str, object], str | None],
        name_of: Callable[[T], str],
    ) -> None:
        self.what = what
        self.group = group
        self._builtins = dict(builtins)  # name -> "module:attribute"
        self._check = check
        self._name_of = name_of
        self._loaded: dict[str, T] = {}
        self._plugins: dict[str, Plugin] | None = None  # None: entry points not read yet
        self._overrides: dict[str, T] = {}

    # -- lookups

    def __getitem__(self, name: str) -> T:
        return self._get(name)

    def _get(self, name: str) -> T:
        if name in self._overrides:
            return self._overrides[name]
        if name not in self._loaded:
            if name in self._builtins:
                self._loaded[name] = self._load_builtin(name)
            else:
                self._loaded[name] = self._load_plugin(self.plugins()[name])  # KeyError for an unknown name
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._overrides or name in self._builtins or name in self.plugins()

    def __iter__(self) -> Iterator[str]:
        names = [*self._builtins, *self._overrides, *self.plugins()]
        return iter(dict.fromkeys(names))

    def __len__(self) -> int:
        return len(list(iter(self)))

    def builtin_names(self) -> list[str]:
        """The built-in names, in registration order: what datapipe's own documentation lists."""
        return list(self._builtins)

    def is_builtin(self, name: str) -> bool:
        return name in self._builtins

    def plugins(self) -> dict[str, Plugin]:
        """The installed plugins by name, read once; one that takes a built-in's name is an error,
        raised again on every lookup (which value a pipeline file means cannot be told)."""
        if self._plugins is None:
            plugins = discover(self.group)
            clashes = [
                f"{plugin.describe()} clashes with the built-in {self.what} {name!r}; the plugin must "
                f"register its {self.what} under another name"
                for name, plugin in plugins.items()
                if name in self._builtins
            ]
            if clashes:
                raise PluginError(*clashes)
            self._plugins = plugins
        return self._plugins

    def load_all(self) -> dict[str, T]:
        """Every value, plugins imported; every plugin's problem at once in one ``PluginError``."""
        problems: list[str] = []
        try:
            plugins = self.plugins()
        except PluginError as exc:  # go on with the others: every problem at once
            problems += exc.problems
            plugins = {n: p for n, p in discover(self.group).items() if n not in self._builtins}
        values = {name: self._get(name) for name in [*self._builtins, *self._overrides]}
        for name, plugin in plugins.items():
            if name in values:
                continue
            try:
                values[name] = self._loaded[name] if name in self._loaded else self._load_plugin(plugin)
            except PluginError as exc:
                problems += exc.problems
        if problems:
            raise PluginError(*problems)
        self._loaded.update((n, v) for n, v in values.items() if n not in self._overrides)
        return values

    def plugin_of(self, name: str) -> Plugin | None:
        """The entry point a name's value came from; None for a built-in or an override."""
        if name in self._builtins or name in self._overrides or self._plugins is None:
            return None
        return self._plugins.get(name)

    # -- tests

    @contextmanager
    def override(self, *values: T) -> Iterator[None]:
        """For tests: the values in place of (or beside) the registered ones of their names, for the
        block; what was there before comes back after it, also when the block raises."""
        saved = dict(self._overrides)
        try:
            for value in values:
                self._overrides[self._name_of(value)] = value
            self._changed()
            yield
        finally:
            self._overrides = saved
            self._changed()

    # -- subclasses

    def _changed(self) -> None:
        """Called when the values change (an override comes or goes): drop what was derived from them."""

    # -- loading

    def _load_builtin(self, name: str) -> T:
        module, _, attribute = self._builtins[name].partition(":")
        value = getattr(importlib.import_module(module), attribute)
        problem = self._check(name, value)
        if problem:
            raise TypeError(f"built-in {self.what} {name!r} ({self._builtins[name]}) {problem}")
        return value

    def _load_plugin(self, plugin: Plugin) -> T:
        value = plugin.load()
        problem = self._check(plugin.name, value)
        if problem:
            raise PluginError(f"{plugin.describe()} {problem}")
        return value  # type: ignore[return-value]  # check() accepted it: a T
