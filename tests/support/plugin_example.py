"""The example stage of docs/plugins.md, as the page shows it: the tests run that very code.

``tests/e2e/test_plugins.py`` installs it as a plugin (an entry point); ``tests/e2e/test_new_stage.py``
adds it to a copy of the repository as an in-tree stage. A page whose example stopped working fails both.
"""

from __future__ import annotations

from tests.support.shared_data import PROJECT_ROOT

PAGE = PROJECT_ROOT / "docs" / "plugins.md"
START, END = "<!-- plugin-example:start", "<!-- plugin-example:end -->"
NAME, MODULE, CLASS = "shouting", "shouting", "Shouting"
# Documents for the example: one shouted (dropped), two calm (kept).
DOCS = [
    {"id": "calm", "text": "A calm sentence about rivers and the sea, written in plain case."},
    {"id": "loud", "text": "THIS IS A VERY LOUD DOCUMENT THAT NEVER STOPS SHOUTING AT ITS READER."},
    {"id": "mixed", "text": "NASA and the ESA wrote a report; most of it is in lower case."},
]


def example_code() -> str:
    """The Python block between the page's example markers."""
    block = PAGE.read_text(encoding="utf-8").split(START, 1)[1].split(END, 1)[0]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class Shouting(Stage):" in code, "docs/plugins.md's example no longer defines the stage the tests run"
    return code
