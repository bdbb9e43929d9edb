"""``datapipe mix-search``: a RegMix-style search for source weights (Liu et al. 2024, arXiv:2407.01492).

1. Sample K mixtures on the simplex of the candidate's sources, within the constraints: a minimum and
   a maximum weight per source, and the tokens each source has: at the target run's token budget a
   weight may ask for at most ``max_epochs`` passes over a source (Muennighoff et al. 2023 found up
   to ~4 epochs of repeated data nearly as good as fresh data).
2. Train one proxy per mixture (the same size, seed and token budget for all, so the mixture is the
   only thing that differs) and score each on the target metric (``ablation.metrics_of``).
3. Fit a regression from weights to the target and pick, among many sampled feasible mixtures, the
   ones it predicts best; their average is the answer (RegMix averages its top predictions too; the
   feasible set is convex, so the average is feasible).
4. Optionally train the predicted mixture, the best sampled one and the uniform one with fresh seeds.

The regression: RegMix fits LightGBM on 512 proxies. With the K of 16-64 proxies a CPU affords, a
tree ensemble has too few points to split on (LightGBM's default leaf needs 20), so this fits ridge
regression in numpy, on the weights alone or on the weights and their pairwise products (a
quadratic surface can have its best point inside the simplex, a linear one only at a corner), with
the penalty and the feature set chosen by leave-one-out error, which is reported with the rank
correlation of the leave-one-out predictions: the honest measure of how much the fit knows.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.ablate.ablation import Log, Settings, _eval_set, metrics_of, spread, train_and_score
from datapipe.ablate.candidates import Candidate, CandidateError, materialize
from datapipe.storage.atomic import write_text_atomic

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


@dataclass(frozen=True)
class Constraints:
    sources: list[str]
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def build(
        cls,
        sources: list[str],
        minimum: dict[str, float],
        maximum: dict[str, float],
        available: dict[str, int],
        target_tokens: int,
        max_epochs: float,
    ) -> Constraints:
        for option, given in (("--min-weight", minimum), ("--max-weight", maximum)):
            unknown = sorted(set(given) - set(sources))
            if unknown:
                raise CandidateError(f"{option} names {unknown}; the candidate's sources are {', '.join(sources)}")
        low = np.array([minimum.get(s, 0.0) for s in sources])
        cap = np.array([max_epochs * available[s] / max(1, target_tokens) for s in sources])
        high = np.minimum(np.array([maximum.get(s, 1.0) for s in sources]), cap)
        if low.sum() > 1 or high.sum() < 1 or np.any(low > high):
            raise CandidateError(
                "no mixture satisfies the constraints: minimum weights "
                + ", ".join(f"{s} {lo:.3g}" for s, lo in zip(sources, low))
                + "; maximum weights (the smaller of --max-weight and max_epochs x available / target tokens) "
                + ", ".join(f"{s} {h:.3g}" for s, h in zip(sources, high))
            )
        return cls(sources, low, high)

    def sample(self, n: int, rng: np.random.Generator, max_tries: int = 200) -> np.ndarray:
        """n mixtures uniform on the simplex (Dirichlet(1)) within the bounds, by rejection."""
        out: list[np.ndarray] = []
        for _ in range(max_tries):
            w = rng.dirichlet(np.ones(len(self.sources)), size=max(4 * n, 1024))
            ok = np.all((w >= self.low) & (w <= self.high), axis=1)
            out += list(w[ok])
            if len(out) >= n:
                return np.array(out[:n])
        raise CandidateError(f"the constraints leave too small a share of the simplex: {len(out)} of {n} mixtures found")


def features(w: np.ndarray, quadratic: bool) -> np.ndarray:
    if not quadratic:
        return w
    i, j = np.triu_indices(w.shape[1])
    return np.hstack([w, w[:, i] * w[:, j]])


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float, np.ndarray]:
    """Coefficients, intercept and leave-one-out predictions (closed form: e_i / (1 - h_ii))."""
    mx, my = x.mean(0), y.mean()
    xc, yc = x - mx, y - my
    a = xc.T @ xc + alpha * np.eye(x.shape[1])
    coef = np.linalg.solve(a, xc.T @ yc)
    hat = np.einsum("ij,ij->i", xc @ np.linalg.inv(a), xc) + 1 / len(y)  # + the intercept's leverage
    resid = yc - xc @ coef
    loo = y - resid / np.clip(1 - hat, 1e-6, None)
    return coef, my - mx @ coef, loo


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


@dataclass(frozen=True)
class Fit:
    quadratic: bool
    alpha: float
    coef: np.ndarray
    intercept: float
    loo_rmse: float
    loo_spearman: float

    def predict(self, w: np.ndarray) -> np.ndarray:
        return features(w, self.quadratic) @ self.coef + self.intercept

    def describe(self) -> dict[str, Any]:
        return {
            "features": "weights and pairwise products" if self.quadratic else "weights",
            "alpha": self.alpha,
            "loo_rmse": self.loo_rmse,
            "loo_spearman": self.loo_spearman,
        }


def fit(w: np.ndarray, y: np.ndarray) -> Fit:
    best: Fit | None = None
    for quadratic in (False, True):
        for alpha in ALPHAS:
            coef, icpt, loo = ridge_fit(features(w, quadratic), y, alpha)
            rmse = float(np.sqrt(np.mean((loo - y) ** 2)))
            if best is None or rmse < best.loo_rmse:
                best = Fit(quadratic, alpha, coef, float(icpt), rmse, spearman(loo, y))
    assert best is not None
    return best


def predict_best(
    f: Fit, cons: Constraints, rng: np.random.Generator, lower_is_better: bool, n: int = 20000, top: int = 100
) -> np.ndarray:
    pool = cons.sample(n, rng)
    pred = f.predict(pool)
    order = np.argsort(pred if lower_is_better else -pred)
    return pool[order[:top]].mean(0)


def as_mixture(sources: list[str], w: np.ndarray) -> dict[str, float]:
    """Rounded to 4 decimals (the loader makes exact integer shares of them), summing to 1."""
    r = np.round(w / w.sum(), 4)
    r[int(np.argmax(r))] += round(1 - float(r.sum()), 4)
    return {s: float(v) for s, v in zip(sources, r) if v > 0}


def write_pipeline_mixture(pipeline: Path, mixture: dict[str, float]) -> None:
    """Replace (or append) the pipeline file's top-level ``mixture:`` block, leaving every other line as it is."""
    lines = pipeline.read_text(encoding="utf-8").splitlines()
    block = ["mixture:"] + [f"  {s}: {w}" for s, w in mixture.items()]
    start = next((i for i, line in enumerate(lines) if line.startswith("mixture:")), None)
    if start is None:
        lines += ["", "# written by datapipe mix-search", *block]
    else:
        end = start + 1
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
            end += 1
        lines[start:end] = block
    write_text_atomic(pipeline, "\n".join(lines) + "\n")


def run_mix_search(
    cand: Candidate,
    settings: Settings,
    k: int,
    target: str,
    minimum: dict[str, float],
    maximum: dict[str, float],
    target_tokens: int | None,
    max_epochs: float,
    validate_seeds: list[int],
    search_seed: int = 0,
    pipeline: Path | None = None,
    log: Log = print,
) -> dict[str, Any]:
    settings.out.mkdir(parents=True, exist_ok=True)
    ev, index, index_key = _eval_set(settings, cand, log)
    data, stats = materialize(
        cand, settings.out / "data", settings.cfg.seq_len, settings.heldout_fraction, index, index_key, log, settings.tokenizer
    )
    sources = sorted(stats["sources"])
    if len(sources) < 2:
        raise CandidateError(f"{cand.name}: a mixture needs at least 2 sources, the candidate has {sources}")
    available = {s: stats["sources"][s]["tokens"] for s in sources}
    cons = Constraints.build(sources, minimum, maximum, available, target_tokens or settings.cfg.tokens, max_epochs)
    rng = np.random.default_rng(search_seed)
    mixtures = cons.sample(k, rng)
    lower = target.startswith("loss/")
    proxy_seed = settings.seeds[0]
    samples: list[dict[str, Any]] = []
    for i, w in enumerate(mixtures):
        mix = as_mixture(sources, w)
        log(f"mix-search: proxy {i + 1}/{k} " + ", ".join(f"{s} {v:.3f}" for s, v in mix.items()))
        result = train_and_score(data, mix, settings, proxy_seed, settings.out / "runs" / f"proxy{i:03d}", ev, log)
        metrics = metrics_of(result)
        if target not in metrics:
            raise CandidateError(f"--target {target!r}: not a metric; the metrics are {', '.join(metrics)}")
        samples.append({"mixture": mix, "target": metrics[target], "metrics": metrics})
        log(f"mix-search: proxy {i + 1}/{k}: {target} {metrics[target]:.4f}")
    w = np.array([[s["mixture"].get(src, 0.0) for src in sources] for s in samples])
    y = np.array([s["target"] for s in samples])
    f = fit(w, y)
    predicted = as_mixture(sources, predict_best(f, cons, rng, lower))
    best_i = int(np.argmin(y) if lower else np.argmax(y))
    record: dict[str, Any] = {
        "candidate": cand.describe(),
        "size": settings.size,
        "model": settings.cfg.__dict__,
        "tokens_per_proxy": settings.cfg.tokens,
        "proxy_seed": proxy_seed,
        "target": target,
        "constraints": {
            "sources": sources,
            "min": dict(zip(sources, cons.low.tolist())),
            "max": dict(zip(sources, cons.high.tolist())),
            "available_tokens": available,
            "target_tokens": target_tokens or settings.cfg.tokens,
            "max_epochs": max_epochs,
        },
        "samples": samples,
        "regression": f.describe(),
        "predicted": {
            "mixture": predicted,
            "predicted_target": float(f.predict(np.array([[predicted.get(s, 0.0) for s in sources]]))[0]),
        },
        "best_sampled": {"mixture": samples[best_i]["mixture"], "target": samples[best_i]["target"]},
    }
    if validate_seeds:
        uniform = {s: round(1 / len(sources), 4) for s in sources}
        record["validation"] = {"seeds": validate_seeds}
        for name, mix in (("predicted", predicted), ("best_sampled", samples[best_i]["mixture"]), ("uniform", uniform)):
            values = []
            for seed in validate_seeds:
                log(f"mix-search: validating {name} with seed {seed}")
                result = train_and_score(
                    data, mix, settings, seed, settings.out / "runs" / f"validate-{name}" / f"seed{seed}", ev, log
                )
                values.append(metrics_of(result)[target])
            record["validation"][name] = {"mixture": mix, "values": values, **spread(values)}
        v = record["validation"]
        record["validation"]["verdict"] = verdict(v, lower)
    write_text_atomic(settings.out / "mixture.json", json.dumps(predicted, indent=1))
    write_text_atomic(settings.out / "mixsearch.json", json.dumps(record, indent=1, sort_keys=True, default=float))
    if pipeline is not None:
        write_pipeline_mixture(pipeline, predicted)
    return record


def verdict(v: dict[str, Any], lower: bool) -> dict[str, Any]:
    """Predicted against best sampled and uniform: better (or no worse) beyond the seeds' spread?"""
    sign = 1 if lower else -1
    noise = max(v[n]["std"] for n in ("predicted", "best_sampled", "uniform"))
    out: dict[str, Any] = {}
    for other in ("best_sampled", "uniform"):
        gain = sign * (v[other]["mean"] - v["predicted"]["mean"])  # > 0: predicted is better
        out[f"vs_{other}"] = {
            "gain": gain,
            "largest_seed_std": noise,
            "outcome": "better" if gain > noise else ("worse" if gain < -noise else "within seed spread"),
        }
    out["mean_std_of_seeds"] = statistics.fmean(v[n]["std"] for n in ("predicted", "best_sampled", "uniform"))
    return out
