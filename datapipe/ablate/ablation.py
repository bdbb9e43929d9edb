"""``datapipe ablate``: candidates x seeds at one size, equal tokens, then a table, a JSON record and
an HTML page with a plot. Every finished (candidate, seed) leaves ``result.json``; a second call
with the same arguments reuses those and resumes a killed one from its checkpoint.

    <out>/data/<candidate>-<hash>/      the candidate's packed documents (candidates.materialize)
    <out>/eval/                         the held-out rows and the multiple-choice items
    <out>/runs/<candidate>/seed<k>/     ckpt.pt while training, result.json when done
    <out>/ablation.json, table.txt, report.html
"""

from __future__ import annotations

import hashlib
import html
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.ablate import import_torch
from datapipe.ablate.candidates import Candidate, CandidateError, materialize, run_tokenizer
from datapipe.ablate.evaluate import EvalSet, build_heldout, evaluate, mc_benchmark_items, mc_items
from datapipe.ablate.sizes import ModelConfig
from datapipe.audit.report import COLORS, PAGE, table
from datapipe.decontaminate.index import BenchmarkIndex
from datapipe.storage.atomic import write_text_atomic

Log = Callable[[str], None]


@dataclass
class Settings:
    cfg: ModelConfig
    size: str
    seeds: list[int]
    out: Path
    device: str = "auto"
    threads: int = 0
    heldout_fraction: float = 0.02
    eval_rows: int = 24  # rows of seq_len + 1 per (language, source)
    mc_per_lang: int = 100
    agieval_dir: Path | None = None  # None: no multiple choice, no decontamination
    eval_run: Path | None = None  # None: the first candidate's run
    save_every: int = 50
    tokenizer: Path | None = None  # None: the runs' own (candidates.run_tokenizer)
    extra: dict[str, Any] = field(default_factory=dict)


def _eval_set(settings: Settings, first: Candidate, log: Log) -> tuple[EvalSet, BenchmarkIndex | None, str]:
    run = settings.eval_run or first.run
    info = run_tokenizer(run, settings.tokenizer)
    items = mc_items(settings.agieval_dir, settings.mc_per_lang) if settings.agieval_dir else []
    index, key = None, "none"
    if settings.agieval_dir is not None:
        # Decontaminate against every item of the benchmark files, not only the sampled ones.
        all_items = mc_items(settings.agieval_dir, 10**9)
        index = BenchmarkIndex.build(mc_benchmark_items(all_items), n_word=13, n_char=13)
        key = hashlib.sha256("\n".join(i.item_id for i in all_items).encode()).hexdigest()[:16]
    toks, ntok = build_heldout(run, info, settings.cfg.seq_len, settings.heldout_fraction, settings.eval_rows)
    ev = EvalSet(toks, ntok, items, info.pad_id, info.path)
    log(f"ablate: held-out text from {run}: " + ", ".join(f"{g} {int(n.sum()):,} tokens" for g, n in ntok.items()))
    return ev, index, key


def eval_identity(settings: Settings, ev: EvalSet) -> dict[str, Any]:
    """What a run's scores depend on besides its weights: the options (--eval-rows, --mc-items,
    --benchmarks) and a digest of the evaluation itself (held-out rows, items, tokenizer), which also
    covers the held-out share and the run the text came from."""
    return {
        "eval_rows": settings.eval_rows,
        "mc_items": settings.mc_per_lang,
        "benchmarks": str(settings.agieval_dir) if settings.agieval_dir is not None else None,
        "digest": ev.digest(),
    }


def train_and_score(
    data: Path, mixture: dict[str, float] | None, settings: Settings, seed: int, run_dir: Path, ev: EvalSet, log: Log
) -> dict[str, Any]:
    """One proxy, or its result.json when it is already done. A run folder remembers what it was
    trained and scored with (identity.json): a checkpoint or result of other training settings is
    refused, never mixed in; a finished run scored with other evaluation settings is scored again
    from its last checkpoint, never reported with its old scores."""
    trained_as = {"model": asdict(settings.cfg), "mixture": mixture, "data": data.name, "seed": seed}
    marker = run_dir / "identity.json"
    old = json.loads(marker.read_text()) if marker.is_file() else None
    if old is not None and {k: old.get(k) for k in trained_as} != trained_as:
        raise CandidateError(
            f"{run_dir} holds a run of other settings ({marker}); use another --out, or delete that folder to train it anew"
        )
    identity = {**trained_as, "eval": eval_identity(settings, ev)}
    done = run_dir / "result.json"
    import_torch()  # a clear error without it, before anything is written
    from datapipe.ablate.train import load_trained, make_deterministic, pick_device, train

    device = pick_device(settings.device)
    if done.is_file():
        if old == identity:
            return json.loads(done.read_text())
        make_deterministic(seed, device, settings.threads)
        model = load_trained(data, settings.cfg, run_dir, device)
        if model is not None:  # the same weights, other evaluation: score again, keep the training record
            log(f"ablate: {run_dir} was scored with other evaluation settings; scoring it again")
            kept = {k: v for k, v in json.loads(done.read_text()).items() if k not in ("heldout_loss", "mc")}
            result = {**kept, **evaluate(model, ev, settings.cfg.seq_len, device)}
            write_text_atomic(done, json.dumps(result, indent=1, sort_keys=True))
            write_text_atomic(marker, json.dumps(identity, sort_keys=True))  # after the result: a kill between scores again
            return result
        done.unlink()  # no final checkpoint to score: train again (a seed gives the same weights)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, json.dumps(identity, sort_keys=True))
    label = f"training {run_dir.parent.name}/{run_dir.name}"  # kept/seed0, runs/proxy003, validate-predicted/seed1
    model, info = train(data, mixture, settings.cfg, seed, run_dir, device, settings.threads, settings.save_every, log, label)
    result = {"seed": seed, **info, **evaluate(model, ev, settings.cfg.seq_len, device)}
    write_text_atomic(done, json.dumps(result, indent=1, sort_keys=True))
    return result


def spread(values: list[float]) -> dict[str, float]:
    """mean, sample standard deviation (0 for one seed), min and max over seeds."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def metrics_of(result: dict[str, Any]) -> dict[str, float]:
    """The flat metrics of one run: loss/<group> and acc/<lang>."""
    out = {f"loss/{g}": v for g, v in result["heldout_loss"].items()}
    out |= {f"acc/{lang}": v["acc"] for lang, v in result.get("mc", {}).items()}
    return out


def run_ablation(candidates: list[Candidate], settings: Settings, log: Log = print) -> dict[str, Any]:
    settings.out.mkdir(parents=True, exist_ok=True)
    ev, index, index_key = _eval_set(settings, candidates[0], log)
    record: dict[str, Any] = {
        "size": settings.size,
        "model": asdict(settings.cfg),
        "tokens_per_run": settings.cfg.tokens,
        "seeds": settings.seeds,
        "eval": ev.describe() | {"heldout_fraction": settings.heldout_fraction},
        "candidates": {},
    }
    for cand in candidates:
        data, stats = materialize(
            cand,
            settings.out / "data",
            settings.cfg.seq_len,
            settings.heldout_fraction,
            index,
            index_key,
            log,
            settings.tokenizer,
        )
        runs = []
        for seed in settings.seeds:
            log(f"ablate: {cand.name} seed {seed}: training {settings.size} on {settings.cfg.tokens:,} tokens")
            result = train_and_score(
                data, cand.mixture, settings, seed, settings.out / "runs" / cand.name / f"seed{seed}", ev, log
            )
            log(f"ablate: {cand.name} seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics_of(result).items()))
            runs.append(result)
        per_metric = {k: spread([metrics_of(r)[k] for r in runs]) for k in metrics_of(runs[0])}
        record["candidates"][cand.name] = {**cand.describe(), "data": stats, "runs": runs, "metrics": per_metric}
    record["params"] = runs[0]["params"]
    record["non_embedding_params"] = runs[0]["non_embedding_params"]
    record["comparison"] = compare(record)
    write_outputs(record, settings.out)
    return record


def compare(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each candidate against the first, per metric: the difference of means and whether it exceeds
    the seeds' spread (|diff| > the larger of the two candidates' max - min ranges); and, over the
    seeds both share, the paired differences (a seed fixes the initial weights, so pairing removes
    the share of the spread that a lucky or unlucky initialisation gives both candidates alike)."""
    names = list(record["candidates"])
    base = record["candidates"][names[0]]["metrics"]
    base_runs = {r["seed"]: metrics_of(r) for r in record["candidates"][names[0]]["runs"]}
    out = []
    for name in names[1:]:
        other = record["candidates"][name]["metrics"]
        other_runs = {r["seed"]: metrics_of(r) for r in record["candidates"][name]["runs"]}
        shared = sorted(set(base_runs) & set(other_runs))
        for metric in base:
            if metric not in other:
                continue
            diff = other[metric]["mean"] - base[metric]["mean"]
            noise = max(base[metric]["max"] - base[metric]["min"], other[metric]["max"] - other[metric]["min"])
            one_seed = min(base[metric]["n"], other[metric]["n"]) < 2  # no spread to compare with
            paired = [other_runs[s][metric] - base_runs[s][metric] for s in shared]
            out.append(
                {
                    "candidate": name,
                    "baseline": names[0],
                    "metric": metric,
                    "diff": diff,
                    "seed_range": noise,
                    "exceeds_seed_spread": None if one_seed else abs(diff) > noise,
                    "paired_diffs": paired,
                    "paired_same_sign": len(paired) > 1 and (all(d > 0 for d in paired) or all(d < 0 for d in paired)),
                }
            )
    return out


def table_rows(record: dict[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
    metrics = list(next(iter(record["candidates"].values()))["metrics"])
    header = ["candidate", *metrics]
    rows = []
    for name, c in record["candidates"].items():
        rows.append(
            (name, *(f"{c['metrics'][m]['mean']:.4f} ± {c['metrics'][m]['std']:.4f}" for m in metrics if m in c["metrics"]))
        )
    return header, rows


def header_line(record: dict[str, Any]) -> str:
    m = record["model"]
    return (
        f"size {record['size']} ({record['params'] / 1e6:.2f}M parameters, "
        f"{record['non_embedding_params'] / 1e6:.2f}M non-embedding; d_model {m['d_model']}, {m['layers']} layers, "
        f"seq_len {m['seq_len']}), {record['tokens_per_run']:,} training tokens per run, seeds {record['seeds']}; "
        "cells: mean ± sample std over seeds; loss in nats/token on held-out text, acc by log-likelihood"
    )


def text_table(record: dict[str, Any]) -> str:
    header, rows = table_rows(record)
    cells = [header, *[list(map(str, r)) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    runs = [r for c in record["candidates"].values() for r in c["runs"]]
    timing = f"training per run: wall {statistics.fmean(r['wall_s'] for r in runs):.0f} s"
    if all("cpu_s" in r for r in runs):
        timing += (
            f", CPU {statistics.fmean(r['cpu_s'] for r in runs):.0f} s (mean of {len(runs)} runs; device {runs[0]['device']})"
        )
    lines = [header_line(record), timing, ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    if record.get("comparison"):
        lines += ["", "difference to the first candidate (mean), and whether it exceeds the seeds' range (max - min of either):"]
        for c in record["comparison"]:
            lines.append(
                f"  {c['candidate']} - {c['baseline']}  {c['metric']}: {c['diff']:+.4f} "
                f"(seed range {c['seed_range']:.4f}) {_spread_word(c['exceeds_seed_spread'])}; per seed "
                + " ".join(f"{d:+.4f}" for d in c["paired_diffs"])
                + (" (same sign on every seed)" if c["paired_same_sign"] else "")
            )
    return "\n".join(lines) + "\n"


def _spread_word(exceeds: bool | None) -> str:
    return (
        "one seed: no spread to judge by"
        if exceeds is None
        else ("EXCEEDS the seed spread" if exceeds else "within the seed spread")
    )


def dot_plot(record: dict[str, Any], prefix: str = "loss/") -> str:
    """Per metric a row; per candidate a dot at the mean and a bar from min to max over seeds."""
    names = list(record["candidates"])
    metrics = [m for m in next(iter(record["candidates"].values()))["metrics"] if m.startswith(prefix)]
    values = [record["candidates"][n]["metrics"][m][k] for n in names for m in metrics for k in ("min", "max")]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    lo, hi = lo - 0.05 * (hi - lo or 1), hi + 0.05 * (hi - lo or 1)
    label_w, w, row_h = 200, 520, 18 * len(names) + 10
    out = [
        f'<svg width="{label_w + w + 40}" height="{row_h * len(metrics) + 60}" role="img" '
        'font-family="sans-serif" font-size="12">'
    ]
    x = lambda v: label_w + w * (v - lo) / (hi - lo)  # noqa: E731
    for i, m in enumerate(metrics):
        y0 = i * row_h + 10
        out.append(f'<text x="{label_w - 8}" y="{y0 + row_h / 2}" text-anchor="end">{html.escape(m)}</text>')
        for j, n in enumerate(names):
            s = record["candidates"][n]["metrics"][m]
            y = y0 + 9 + 18 * j
            color = COLORS[j % len(COLORS)]
            out.append(
                f'<line x1="{x(s["min"]):.1f}" x2="{x(s["max"]):.1f}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"/>'
            )
            out.append(
                f'<circle cx="{x(s["mean"]):.1f}" cy="{y}" r="4" fill="{color}"><title>{html.escape(n)} '
                f"{html.escape(m)}: mean {s['mean']:.4f}, range {s['min']:.4f}-{s['max']:.4f}</title></circle>"
            )
    base = row_h * len(metrics) + 20
    for t in np.linspace(lo, hi, 5):
        out.append(f'<text x="{x(t):.1f}" y="{base}" text-anchor="middle">{t:.3f}</text>')
    lx = label_w
    for j, n in enumerate(names):
        out.append(
            f'<circle cx="{lx}" cy="{base + 20}" r="4" fill="{COLORS[j % len(COLORS)]}"/>'
            f'<text x="{lx + 8}" y="{base + 24}">{html.escape(n)}</text>'
        )
        lx += 30 + 8 * len(n)
    return "".join(out) + "</svg>"


def write_outputs(record: dict[str, Any], out: Path) -> None:
    write_text_atomic(out / "ablation.json", json.dumps(record, indent=1, sort_keys=True))
    write_text_atomic(out / "table.txt", text_table(record))
    header, rows = table_rows(record)
    body = [
        "<h1>datapipe ablate</h1>",
        f'<p class="meta">{html.escape(header_line(record))}</p>',
        table(header, rows),
        "<h2>Held-out loss per language and source (dot: mean; bar: min to max over seeds; lower is better)</h2>",
        dot_plot(record),
    ]
    if record.get("comparison"):
        body += [
            "<h2>Against the first candidate</h2>",
            table(
                ["candidate", "metric", "difference of means", "seed range", "exceeds seed spread", "difference per seed"],
                [
                    (
                        c["candidate"],
                        c["metric"],
                        c["diff"],
                        c["seed_range"],
                        _spread_word(c["exceeds_seed_spread"]),
                        " ".join(f"{d:+.4f}" for d in c["paired_diffs"]),
                    )
                    for c in record["comparison"]
                ],
            ),
        ]
    write_text_atomic(out / "report.html", PAGE.format(title="datapipe ablate", body="\n".join(body)))
