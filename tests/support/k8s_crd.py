"""KubeRay's CustomResourceDefinitions (../shared/data/k8s/) as JSON Schemas, to validate a rendered
manifest offline as the API server would.

A CRD's ``openAPIV3Schema`` is JSON Schema but for Kubernetes' extensions: ``x-kubernetes-*`` keys
(jsonschema ignores them), and unknown fields, which the API server *prunes* (drops without a
word) rather than refuses. Pruning would hide a misspelt field (``rayStartParam``) that KubeRay then
never sees, so the conversion closes every object that lists its properties and neither allows
other ones (``additionalProperties``) nor keeps unknown fields (``x-kubernetes-preserve-unknown-fields``).
The CEL rules (``x-kubernetes-validations``) are not evaluated: none concerns a field datapipe writes.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml


def _closed(node: Any) -> Any:
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=4)
def crd_schema(path: Path, version: str = "v1") -> dict[str, Any]:
    """The JSON Schema of ``version`` of the CRD in ``path``, objects closed (see the module doc)."""
    with open(path, encoding="utf-8") as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _closed(served["schema"]["openAPIV3Schema"])
    # metadata is the API server's ObjectMeta (not in the CRD): the fields a manifest may carry.
    schema["properties"]["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    return schema
