"""Finding and loading the entry points of one group, with errors that name the plugin.

Entry points are read from the installed distributions' metadata (``*.dist-info/entry_points.txt``
on ``sys.path``), so a Ray worker finds the same plugins as the driver wherever the plugin's
package is importable. A plugin that cannot be loaded is a ``PluginError`` naming the entry point
and its distribution: a user sees which package to fix, not a traceback from inside datapipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from datapipe.errors import EXIT_USAGE, DatapipeError

STAGE_GROUP = "datapipe.stages"
READER_GROUP = "datapipe.readers"


class PluginError(DatapipeError):
    """Plugins that cannot be used; each problem names the entry point and its distribution."""

    exit_code = EXIT_USAGE  # the installed packages must change before the command can run

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Plugin:
    group: str
    entry: EntryPoint

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def distribution(self) -> str:
        dist = self.entry.dist
        return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"

    def describe(self) -> str:
        return (
            f"entry point {self.entry.name!r} = {self.entry.value!r} in group {self.group!r} of distribution {self.distribution}"
        )

    def load(self) -> object:
        try:
            return self.entry.load()
        except Exception as exc:  # ImportError, a SyntaxError or any error raised while the module runs
            raise PluginError(f"{self.describe()} failed to load: {type(exc).__name__}: {exc}") from None


def discover(group: str) -> dict[str, Plugin]:
    """The group's entry points by name, nothing imported. Two distributions giving one name is an error:
    which of them a pipeline file means cannot be told."""
    found: dict[str, Plugin] = {}
    for entry in entry_points(group=group):
        plugin = Plugin(group, entry)
        if plugin.name in found:
            raise PluginError(
                f"{plugin.describe()} and {found[plugin.name].describe()} share the name {plugin.name!r}; uninstall one of them"
            )
        found[plugin.name] = plugin
    return found
