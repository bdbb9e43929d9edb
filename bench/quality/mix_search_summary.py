"""Summarise a finished ``datapipe mix-search --validate-seeds`` folder for docs/ablate.md and
bench/results/mix_search.json.

    python -m bench.quality.mix_search_summary OUT_FOLDER [--json bench/results/mix_search.json]

Reads OUT_FOLDER/mixsearch.json and the run folders beside it, and prints the validation table: the
predicted, best sampled and uniform mixtures, each as mean ± sample std of the target over the fresh
seeds, with the value per seed; the predicted mixture's gain over each of the others, against the
largest seed std (the command's own verdict) and paired by seed (the seeds are shared, so a seed's
luck that lifts or lowers every mixture alike cancels); the fit's leave-one-out numbers; and the CPU
and wall time of the runs. Nothing is trained here.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

NAMES = ("predicted", "best_sampled", "uniform")


def summarise(out: Path) -> dict[str, Any]:
    rec = json.loads((out / "mixsearch.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("**/result.json"))]
    fitted = {
        "target": rec["target"],
        "size": rec["size"],
        "model": rec["model"],
        "params": runs[0]["params"],
        "tokens_per_run": rec["tokens_per_proxy"],
        "proxies": len(rec["samples"]),
        "proxy_seed": rec["proxy_seed"],
        "sampling": rec["sampling"],
        "constraints": rec["constraints"],
        "regression": {
            k: rec["regression"].get(k)
            for k in ("features", "alpha", "loo_rmse", "loo_spearman", "targets_std", "heldout_rmse", "heldout_spearman", "knows")
        },
        "predicted_by_fit": rec["predicted"],
        "best_sampled_proxy": rec["best_sampled"],
        "runs": len(runs),
        "cpu_s_per_run": statistics.fmean(r["cpu_s"] for r in runs if "cpu_s" in r),
        "wall_s_per_run": statistics.fmean(r["wall_s"] for r in runs),
    }
    if "validation" not in rec:
        return fitted
    v = rec["validation"]
    sign = 1 if rec["target"].startswith("loss/") else -1
    paired = {
        other: [sign * (b - a) for a, b in zip(v["predicted"]["values"], v[other]["values"])]  # > 0: predicted better
        for other in ("best_sampled", "uniform")
    }
    return fitted | {
        "validation_seeds": v["seeds"],
        "validation": {n: {k: v[n][k] for k in ("mixture", "values", "mean", "std", "min", "max")} for n in NAMES},
        "verdict": v["verdict"],
        "paired_gain_per_seed": paired,
        "paired_gain_better_on_every_seed": {o: all(d > 0 for d in ds) for o, ds in paired.items()},
    }


def table(s: dict[str, Any]) -> str:
    lines = ["| mixture | weights | mean ± std | per seed | gain of predicted (paired per seed) |", "|---|---|---|---|---|"]
    for n in NAMES:
        m = s["validation"][n]
        weights = ", ".join(f"{k} {w:.3f}" for k, w in m["mixture"].items())
        gain = (
            ""
            if n == "predicted"
            else f"{s['verdict'][f'vs_{n}']['gain']:+.3f} ({', '.join(f'{d:+.3f}' for d in s['paired_gain_per_seed'][n])})"
        )
        per_seed = ", ".join(f"{x:.3f}" for x in m["values"])
        lines.append(f"| {n} | {weights} | {m['mean']:.3f} ± {m['std']:.3f} | {per_seed} | {gain} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s = summarise(args.out)
    print(f"target {s['target']}; {s['proxies']} proxies of {s['params']:,} parameters, {s['tokens_per_run']:,} tokens each")
    print(f"fit: {s['regression']}")
    print(f"predicted by the fit: {s['predicted_by_fit']}; best proxy: {s['best_sampled_proxy']}")
    if "validation" in s:
        print(table(s))
        for other in ("best_sampled", "uniform"):
            print(f"predicted vs {other}: {s['verdict'][f'vs_{other}']}")
    print(f"runs {s['runs']}: CPU {s['cpu_s_per_run']:.1f} s, wall {s['wall_s_per_run']:.0f} s per run (means)")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
