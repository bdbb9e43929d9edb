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
regression in numpy on one of three feature sets: the weights; the weights and their pairwise products
(a quadratic surface can have its best point inside the simplex, a linear one only at a corner); or
the weights and their logarithms, log(w + eps). The last is the shape of the data: a source's held-out
loss falls roughly like a power of the tokens of it the model saw (the data mixing laws of Ye et al.
2024, arXiv:2403.16952, are exponential in the weights for the same reason), so the loss climbs
steeply as a weight nears 0 and flattens above, which neither a plane nor a parabola follows. The
feature set, eps and the penalty are chosen by leave-one-out error, reported with the rank correlation
of the leave-one-out predictions: the honest measure of how much the fit knows. On the 16 proxies of
docs/ablate.md's first search the log features cut the leave-one-out RMSE from 0.048 to 0.028.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.ablate.ablation import Log, Settings, _eval_set, metrics_of, spread, train_and_score
from datapipe.ablate.candidates import Candidate, CandidateError, materialize
from datapipe.ablate.evaluate import EvalSet
from datapipe.storage.atomic import write_text_atomic

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
LOG_EPS = (0.01, 0.03, 0.1)  # log(w + eps): how close to 0 the loss keeps climbing
# RegMix's sampling around the natural token shares: the Dirichlet's concentration per mixture, log-uniform
# in this range (small: mixtures far from the natural shares, large: close to them).
NATURAL_CONCENTRATION = (0.1, 5.0)


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

    def sample(self, n: int, rng: np.random.Generator, center: np.ndarray | None = None, max_tries: int = 200) -> np.ndarray:
        """n mixtures within the bounds, by rejection: uniform on the simplex (Dirichlet(1)), or with
        ``center`` (the natural token shares) RegMix's Dirichlet around it, each mixture with its own
        concentration so that both near and far mixtures are drawn."""
        out: list[np.ndarray] = []
        for _ in range(max_tries):
            m = max(4 * n, 1024)
            if center is None:
                w = rng.dirichlet(np.ones(len(self.sources)), size=m)
            else:
                lo, hi = np.log(NATURAL_CONCENTRATION)
                scale = np.exp(rng.uniform(lo, hi, size=(m, 1)))
                g = rng.gamma(np.maximum(scale * len(self.sources) * center, 1e-3))
                w = g / np.clip(g.sum(1, keepdims=True), 1e-12, None)
            ok = np.all((w >= self.low) & (w <= self.high), axis=1)
            out += list(w[ok])
            if len(out) >= n:
                return np.array(out[:n])
        raise CandidateError(f"the constraints leave too small a share of the simplex: {len(out)} of {n} mixtures found")


FEATURES = {
    "linear": "weights",
    "quadratic": "weights and pairwise products",
    "log": "weights and log(weight + eps)",
}


def features(w: np.ndarray, kind: str, eps: float = 0.0) -> np.ndarray:
    if kind == "linear":
        return w
    if kind == "quadratic":
        i, j = np.triu_indices(w.shape[1])
        return np.hstack([w, w[:, i] * w[:, j]])
    return np.hstack([w, np.log(w + eps)])


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
    kind: str  # a key of FEATURES
    eps: float  # of the log features
    alpha: float
    coef: np.ndarray
    intercept: float
    loo_rmse: float
    loo_spearman: float

    def predict(self, w: np.ndarray) -> np.ndarray:
        return features(w, self.kind, self.eps) @ self.coef + self.intercept

    def describe(self) -> dict[str, Any]:
        return {
            "features": FEATURES[self.kind].replace("eps", f"{self.eps:g}"),
            "alpha": self.alpha,
            "loo_rmse": self.loo_rmse,
            "loo_spearman": self.loo_spearman,
        }


def fit(w: np.ndarray, y: np.ndarray, kinds: tuple[str, ...] = tuple(FEATURES)) -> tuple[Fit, list[dict[str, Any]]]:
    """The fit of least leave-one-out error, and every tried one's (features, eps, alpha, LOO RMSE)."""
    best: Fit | None = None
    tried: list[dict[str, Any]] = []
    for kind in kinds:
        for eps in LOG_EPS if kind == "log" else (0.0,):
            for alpha in ALPHAS:
                coef, icpt, loo = ridge_fit(features(w, kind, eps), y, alpha)
                rmse = float(np.sqrt(np.mean((loo - y) ** 2)))
                tried.append({"features": kind, "eps": eps, "alpha": alpha, "loo_rmse": rmse})
                if best is None or rmse < best.loo_rmse:
                    best = Fit(kind, eps, alpha, coef, float(icpt), rmse, spearman(loo, y))
    assert best is not None
    return best, tried


def held_out_predictions(w: np.ndarray, y: np.ndarray, kinds: tuple[str, ...] = tuple(FEATURES)) -> np.ndarray:
    """Each proxy's target as predicted by the whole procedure run without it: features, eps and penalty
    chosen, and the fit made, on the others alone. The chosen fit's own leave-one-out error is optimistic:
    it won a contest of some 30 fits on that very error (on pure noise, one of them often looks good)."""
    out = np.empty(len(y))
    for i in range(len(y)):
        others = np.arange(len(y)) != i
        f, _ = fit(w[others], y[others], kinds)
        out[i] = f.predict(w[i : i + 1])[0]
    return out


def what_the_fit_knows(w: np.ndarray, y: np.ndarray, kinds: tuple[str, ...] = tuple(FEATURES)) -> dict[str, Any]:
    """How much the search's fit knows, from held-out predictions of the whole procedure
    (``held_out_predictions``): their error against the targets' own spread (predicting each proxy by the
    mean of the others errs by about that spread), their R^2, and their rank correlation with the
    targets. It knows less than the spread when its error is not below it or it does not even order the
    proxies (Spearman <= 0): then its best mixture is a guess."""
    std = float(np.std(y, ddof=1)) if len(y) > 1 else 0.0
    if len(y) < 4:  # too few to hold one out and still fit
        rmse, rank = float("inf"), float("nan")
    else:
        pred = held_out_predictions(w, y, kinds)
        rmse, rank = float(np.sqrt(np.mean((pred - y) ** 2))), spearman(pred, y)
    r2 = 1 - (rmse / std) ** 2 if std > 0 else float("-inf")
    knows = std > 0 and rmse < std and bool(rank > 0)
    summary = f"held-out RMSE {rmse:.4f} vs the targets' spread (std) {std:.4f}: R^2 {r2:.2f}, rank correlation {rank:.2f}; " + (
        "the fit orders and predicts held-out proxies better than their mean does"
        if knows
        else "the fit knows less than the spread: its best mixture is a guess"
    )
    return {
        "targets_std": std,
        "heldout_rmse": rmse,
        "heldout_r2": r2,
        "heldout_spearman": rank,
        "knows": knows,
        "summary": summary,
    }


def choose_proposal(
    f: Fit, cons: Constraints, rng: np.random.Generator, lower: bool, sampled: np.ndarray
) -> tuple[np.ndarray, str]:
    """The mixture to propose and where it comes from: the average of the mixtures the fit predicts best
    (RegMix), unless the fit predicts one of the sampled (trained) mixtures better than that average;
    then that sampled mixture: a proposal is never predicted worse than a mixture already tried."""
    top = predict_best(f, cons, rng, lower)
    average = np.round(top / top.sum(), 4)  # as it is written (as_mixture): compared as it will be used
    average /= average.sum()
    pred_avg = float(f.predict(average[None])[0])
    pred_sampled = f.predict(sampled)
    i = int(np.argmin(pred_sampled) if lower else np.argmax(pred_sampled))
    if (pred_sampled[i] < pred_avg) if lower else (pred_sampled[i] > pred_avg):
        return sampled[i], (
            f"sampled mixture {i + 1} (the fit predicts it {float(pred_sampled[i]):.4f}, better than the "
            f"{pred_avg:.4f} of the average of its top predictions)"
        )
    return average, "the average of the 100 mixtures the fit predicts best"


def target_value(metrics: dict[str, float], target: str) -> float:
    """``target`` is a metric or a comma-separated set of them, scored by their mean (each weighs the
    same, whatever its held-out tokens): e.g. ``loss/zh/zh_wiki,loss/en/en_wiki``."""
    names = [t.strip() for t in target.split(",") if t.strip()]
    missing = [n for n in names if n not in metrics]
    if not names or missing:
        raise CandidateError(f"--target {target!r}: {missing or 'empty'} not a metric; the metrics are {', '.join(metrics)}")
    return float(np.mean([metrics[n] for n in names]))


def lower_is_better(target: str) -> bool:
    kinds = {t.strip().split("/")[0] for t in target.split(",") if t.strip()}
    if len(kinds) != 1:
        raise CandidateError(f"--target {target!r}: a set of metrics must be all loss/... or all acc/..., not {sorted(kinds)}")
    return kinds == {"loss"}


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


def _log_to_stderr(message: str) -> None:  # a worker's log: a module function pickles, the CLI's lambda does not
    print(message, file=sys.stderr, flush=True)


def train_all(
    data: Path, tasks: list[tuple[dict[str, float], int, Path]], settings: Settings, ev: EvalSet, jobs: int, log: Log
) -> list[dict[str, Any]]:
    """The results of (mixture, seed, run folder) tasks, in order. The runs are independent, so with
    ``jobs`` > 1 that many train at once, each in its own process with ``settings.threads`` torch
    threads: a many-core CPU trains K tiny proxies in about the time of K / jobs, where more threads
    for one tiny model hardly help. A run's numbers do not depend on it (each seeds itself; the thread
    count is what matters, and is recorded)."""
    # Finished runs are read back here (train_and_score checks their identity); only the rest are trained.
    todo = [i for i, (_, _, run_dir) in enumerate(tasks) if not (run_dir / "result.json").is_file()]
    if jobs <= 1 or len(todo) <= 1:
        return [train_and_score(data, mix, settings, seed, run_dir, ev, log) for mix, seed, run_dir in tasks]
    log(f"mix-search: training {len(todo)} runs, {min(jobs, len(todo))} at once")
    # spawn, not fork: a forked child of a process that has started OpenMP or tokenizer threads can hang
    with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {}
        for i in todo:
            mix, seed, run_dir = tasks[i]
            futures[i] = pool.submit(train_and_score, data, mix, settings, seed, run_dir, ev, _log_to_stderr)
        trained = {i: f.result() for i, f in futures.items()}
    return [
        trained[i] if i in trained else train_and_score(data, mix, settings, seed, run_dir, ev, log)
        for i, (mix, seed, run_dir) in enumerate(tasks)
    ]


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
    sampling: str = "uniform",
    jobs: int = 1,
    force: bool = False,
) -> dict[str, Any]:
    """The search; its record (mixsearch.json). The proposed mixture is written (mixture.json, and the
    ``mixture:`` block of ``pipeline``) only when the fit knows more than the targets' spread
    (``what_the_fit_knows``) or ``force``; else ``record["refused"]`` says why and no mixture is written."""
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
    lower = lower_is_better(target)
    natural = np.array([available[s] for s in sources], dtype=float)
    natural /= natural.sum()
    rng = np.random.default_rng(search_seed)
    mixtures = cons.sample(k, rng, center=natural if sampling == "natural" else None)
    proxy_seed = settings.seeds[0]
    mixes = [as_mixture(sources, w) for w in mixtures]
    for i, mix in enumerate(mixes):
        log(f"mix-search: proxy {i + 1}/{k} " + ", ".join(f"{s} {v:.3f}" for s, v in mix.items()))
    runs = settings.out / "runs"
    results = train_all(data, [(mix, proxy_seed, runs / f"proxy{i:03d}") for i, mix in enumerate(mixes)], settings, ev, jobs, log)
    samples: list[dict[str, Any]] = []
    for i, (mix, result) in enumerate(zip(mixes, results)):
        metrics = metrics_of(result)
        samples.append({"mixture": mix, "target": target_value(metrics, target), "metrics": metrics})
        log(f"mix-search: proxy {i + 1}/{k}: {target} {samples[-1]['target']:.4f}")
    w = np.array([[s["mixture"].get(src, 0.0) for src in sources] for s in samples])
    y = np.array([s["target"] for s in samples])
    f, tried = fit(w, y)
    knows = what_the_fit_knows(w, y)
    log(f"mix-search: regression on {f.describe()['features']}, ridge alpha {f.alpha:g}: {knows['summary']}")
    proposal, origin = choose_proposal(f, cons, rng, lower, w)
    predicted = as_mixture(sources, proposal)
    best_i = int(np.argmin(y) if lower else np.argmax(y))
    refused = None
    if not knows["knows"]:
        refused = (
            f"the fit knows less than the spread of the {k} proxies' {target}: held-out RMSE "
            f"{knows['heldout_rmse']:.4f} vs std {knows['targets_std']:.4f}, rank correlation {knows['heldout_spearman']:.2f}"
        )
    record: dict[str, Any] = {
        "candidate": cand.describe(),
        "size": settings.size,
        "model": settings.cfg.__dict__,
        "tokens_per_proxy": settings.cfg.tokens,
        "proxy_seed": proxy_seed,
        "threads": settings.threads,
        "sampling": sampling,
        "natural_shares": dict(zip(sources, natural.tolist())),
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
        "regression": f.describe() | knows | {"tried": tried},
        "predicted": {
            "mixture": predicted,
            "from": origin,
            "predicted_target": float(f.predict(np.array([[predicted.get(s, 0.0) for s in sources]]))[0]),
            "uniform_predicted_target": float(f.predict(np.full((1, len(sources)), 1 / len(sources)))[0]),
            "sampled_predicted_targets": [float(v) for v in f.predict(w)],
        },
        "refused": None if force else refused,
        "forced": bool(force and refused),
        "best_sampled": {"mixture": samples[best_i]["mixture"], "target": samples[best_i]["target"]},
    }
    if validate_seeds:
        named = {
            "predicted": predicted,
            "best_sampled": samples[best_i]["mixture"],
            "uniform": {s: round(1 / len(sources), 4) for s in sources},
        }
        record["validation"] = _validation(data, named, validate_seeds, settings, ev, target, lower, jobs, log)
    _write_search(settings.out, record, predicted, pipeline)
    return record


def _validation(
    data: Path,
    named: dict[str, dict[str, float]],
    seeds: list[int],
    settings: Settings,
    ev: EvalSet,
    target: str,
    lower: bool,
    jobs: int,
    log: Log,
) -> dict[str, Any]:
    """The named mixtures trained again with each of ``seeds``: their targets, spreads and the verdict."""
    runs = settings.out / "runs"
    tasks = [(mix, seed, runs / f"validate-{name}" / f"seed{seed}") for name, mix in named.items() for seed in seeds]
    log(f"mix-search: validating the predicted, best sampled and uniform mixtures with seeds {seeds}")
    scores = iter([target_value(metrics_of(r), target) for r in train_all(data, tasks, settings, ev, jobs, log)])
    validation: dict[str, Any] = {"seeds": seeds}
    for name, mix in named.items():
        values = [next(scores) for _ in seeds]
        validation[name] = {"mixture": mix, "values": values, **spread(values)}
    validation["verdict"] = verdict(validation, lower)
    return validation


def _write_search(out: Path, record: dict[str, Any], predicted: dict[str, float], pipeline: Path | None) -> None:
    """mixsearch.json, and unless the search refused, mixture.json and the pipeline's ``mixture:`` block."""
    if record["refused"]:
        # no mixture.json of an earlier search in this --out stands for this one either
        (out / "mixture.json").unlink(missing_ok=True)
    else:
        write_text_atomic(out / "mixture.json", json.dumps(predicted, indent=1))
    write_text_atomic(out / "mixsearch.json", json.dumps(record, indent=1, sort_keys=True, default=float))
    if pipeline is not None and not record["refused"]:
        write_pipeline_mixture(pipeline, predicted)


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
