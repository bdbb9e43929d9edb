"""Binary classification metrics for a held-out share: precision, recall, F1 at a threshold, ROC AUC."""

from __future__ import annotations

import numpy as np


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC as the Mann-Whitney statistic: the chance a random positive outscores a random negative
    (ties count one half). None when one class is missing."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # average rank (1-based) over each run of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for lo, hi in zip(starts, ends):
        ranks[order[lo:hi]] = (lo + 1 + hi) / 2.0
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def binary_metrics(scores: np.ndarray, positive: np.ndarray, threshold: float = 0.5) -> dict[str, float | int | None]:
    """Counts and metrics of predicting positive where ``score >= threshold``."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    predicted = scores >= threshold
    tp = int((predicted & positive).sum())
    fp = int((predicted & ~positive).sum())
    fn = int((~predicted & positive).sum())
    tn = int((~predicted & ~positive).sum())
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall
        else None
    )
    return {
        "n_pos": int(positive.sum()),
        "n_neg": int((~positive).sum()),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": (tp + tn) / len(scores) if len(scores) else None,
        "auc": auc(scores, positive),
    }
