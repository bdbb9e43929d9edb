"""Allow/deny by licence class per source kind, with a recorded reason for every drop.

Config shape (a pipeline stage's `license:` block):
    policy:
      code: {deny: [strong_copyleft, non_commercial, unknown]}
      web:  {deny: [non_commercial, no_derivatives]}
      paper: {allow: [permissive, weak_copyleft]}
      default: {deny: [non_commercial]}      # kinds not listed; omit to keep everything
A detection is denied when *any* of its classes is denied (CC-BY-NC-ND is both NC and ND),
or, with `allow`, when any class is outside the allow list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datapipe.license.detection import Detection
from datapipe.license.spdx import CLASSES


@dataclass(frozen=True)
class Rule:
    allow: frozenset[str] | None = None  # None: every class not denied is allowed
    deny: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], kind: str) -> Rule:
        extra = set(cfg) - {"allow", "deny"}
        if extra:
            raise ValueError(f"license policy for {kind!r}: unknown keys {sorted(extra)}")
        allow = cfg.get("allow")
        rule = cls(frozenset(allow) if allow is not None else None, frozenset(cfg.get("deny") or ()))
        bad = ((rule.allow or frozenset()) | rule.deny) - set(CLASSES)
        if bad:  # a typo must not silently allow everything
            raise ValueError(f"license policy for {kind!r}: unknown classes {sorted(bad)}; known {list(CLASSES)}")
        return rule

    def refusal(self, classes: frozenset[str]) -> str | None:
        denied = sorted(classes & self.deny)
        if denied:
            return f"denied class {','.join(denied)}"
        if self.allow is not None and (outside := sorted(classes - self.allow)):
            return f"class {','.join(outside)} not in allow list"
        return None


@dataclass(frozen=True)
class Policy:
    rules: Mapping[str, Rule] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> Policy:
        cfg = (cfg or {}).get("policy", cfg or {})
        return cls({kind: Rule.from_config(rule or {}, kind) for kind, rule in cfg.items()})

    def decide(self, kind: str, detection: Detection) -> tuple[bool, str]:
        """(keep, reason); the reason names the kind, licence and evidence on a drop."""
        rule = self.rules.get(kind) or self.rules.get("default")
        if rule is None:
            return True, ""
        why = rule.refusal(detection.classes)
        if why is None:
            return True, ""
        return False, f"{kind}: license {detection.license} ({why}) [{detection.where}: {detection.evidence}]"

    def apply(
        self, kind: str, docs: Iterable[dict[str, Any]], detections: Iterable[Detection]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Tag each document with license, license_class, license_evidence; split into
        (kept, dropped), dropped documents carrying `drop_reason`.  Inputs are not mutated."""
        kept, dropped = [], []
        for doc, det in zip(docs, detections, strict=True):
            out = {**doc, **det.as_fields()}
            keep, reason = self.decide(kind, det)
            if keep:
                kept.append(out)
            else:
                dropped.append({**out, "drop_reason": reason})
        return kept, dropped
