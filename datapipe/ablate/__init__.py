"""Small-model ablations over runs (``datapipe ablate``) and RegMix-style mixture search
(``datapipe mix-search``): see docs/ablate.md.

Training and scoring the proxy models needs torch, an optional dependency (``datapipe[ablate]``):
it is imported where a model is built or scored, so the rest (candidates, held-out sets, the
mixture regression of ``mixsearch.py``) imports without it.
"""

from __future__ import annotations

from types import ModuleType

from datapipe.errors import UsageError


def import_torch() -> ModuleType:
    """``import torch``, or an error that says how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise UsageError(
            f"training and scoring proxy models needs torch, which is not installed ({exc})",
            hint="pip install 'datapipe[ablate]' (or the torch build for your machine: pip install torch)",
        ) from None
    return torch
