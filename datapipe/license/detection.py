"""The result type every detector returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from datapipe.license.expression import expression_classes
from datapipe.license.spdx import UNKNOWN, primary_class

MAX_EVIDENCE = 200  # evidence is a pointer (URL, phrase, file name), never a page


@dataclass(frozen=True)
class Detection:
    license: str = UNKNOWN  # SPDX id, SPDX expression, or "unknown"
    evidence: str = ""
    where: str = ""  # html:link[rel=license], file:LICENSE, package.json:license, header, ...
    classes: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", self.evidence[:MAX_EVIDENCE])
        if not self.classes:
            object.__setattr__(self, "classes", expression_classes(self.license))

    @property
    def license_class(self) -> str:
        return primary_class(self.classes)

    @property
    def known(self) -> bool:
        return self.license != UNKNOWN

    def as_fields(self) -> dict[str, str]:
        """The three fields a document gets."""
        return {
            "license": self.license,
            "license_class": self.license_class,
            "license_evidence": f"{self.where}: {self.evidence}" if self.where else self.evidence,
        }


NOT_FOUND = Detection()
