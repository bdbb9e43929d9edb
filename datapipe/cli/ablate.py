"""``datapipe ablate`` and ``datapipe mix-search``: small proxy models trained on runs (docs/ablate.md).
torch and the training code are imported only when one of them runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from datapipe.errors import DatapipeError


class MixtureNotWritten(DatapipeError):
    """mix-search ran, but its fit cannot support the mixture it would propose (exit 1: the work failed)."""


if TYPE_CHECKING:
    from datapipe.ablate.ablation import Settings

SIZE_HELP = "Model size: micro, tiny (CPU, minutes), small, or a JSON object of fields over tiny's (e.g. '{\"steps\": 600}')."
SHARED_AGIEVAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks" / "agieval"


def _common(f):  # the options both commands share
    for opt in reversed(
        [
            click.option("--size", default="tiny", show_default=True, help=SIZE_HELP),
            click.option(
                "--steps",
                type=click.IntRange(min=1),
                help="Training steps (overrides the size's; tokens = steps x batch x seq_len).",
            ),
            click.option(
                "--device", default="auto", show_default=True, help="auto (a GPU when torch sees one), cpu, cuda, cuda:N."
            ),
            click.option(
                "--threads",
                type=click.IntRange(min=0),
                default=1,
                show_default=True,
                help="torch CPU threads per run (0: torch's default, all cores). A tiny model gains little from more "
                "threads, and on a busy machine they spin waiting for each other (docs/ablate.md).",
            ),
            click.option(
                "--heldout-fraction",
                type=click.FloatRange(0.001, 0.5),
                default=0.02,
                show_default=True,
                help="Share of documents, by id hash, held out of every candidate as evaluation text.",
            ),
            click.option(
                "--eval-rows",
                type=click.IntRange(min=1),
                default=24,
                show_default=True,
                help="Held-out rows of seq_len tokens per (language, source).",
            ),
            click.option(
                "--benchmarks",
                type=click.Path(file_okay=False, path_type=Path),
                help="AGIEval data/v1 folder: multiple-choice accuracy, and decontamination of the candidates "
                "against it (default: ../shared/data/benchmarks/agieval when present).",
            ),
            click.option("--no-benchmarks", is_flag=True, help="No multiple-choice evaluation and no decontamination."),
            click.option(
                "--mc-items",
                type=click.IntRange(min=1),
                default=100,
                show_default=True,
                help="Multiple-choice items per language.",
            ),
            click.option(
                "--tokenizer",
                type=click.Path(dir_okay=False, exists=True, path_type=Path),
                help="The runs' tokenizer.json, where the path in run.json does not resolve from here.",
            ),
            click.option(
                "--save-every", type=click.IntRange(min=1), default=50, show_default=True, help="Checkpoint every N steps."
            ),
            click.option(
                "--out",
                "-o",
                type=click.Path(file_okay=False, path_type=Path),
                required=True,
                help="Output folder (a second call with the same arguments resumes in it).",
            ),
        ]
    ):
        f = opt(f)
    return f


def _settings(
    size: str,
    steps: int | None,
    seeds: list[int],
    out: Path,
    device: str,
    threads: int,
    heldout_fraction: float,
    eval_rows: int,
    benchmarks: Path | None,
    no_benchmarks: bool,
    mc_items: int,
    save_every: int,
    tokenizer: Path | None,
) -> Settings:
    from datapipe.ablate.ablation import Settings
    from datapipe.ablate.sizes import model_config

    cfg = model_config(size).with_overrides(steps=steps)
    agieval = None if no_benchmarks else (benchmarks or (SHARED_AGIEVAL if SHARED_AGIEVAL.is_dir() else None))
    if agieval is not None and not agieval.is_dir():
        raise click.BadParameter(f"{agieval} is not a folder", param_hint="--benchmarks")
    name = size if size in ("micro", "tiny", "small") else "custom"
    return Settings(
        cfg,
        name,
        seeds,
        out,
        device,
        threads,
        heldout_fraction,
        eval_rows,
        mc_items,
        agieval,
        None,
        save_every,
        tokenizer=tokenizer,
    )


@click.command()
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    required=True,
    metavar="NAME=RUN",
    help="A candidate: a finished run folder (repeatable; the first is the baseline and gives the held-out text).",
)
@click.option(
    "--where",
    "wheres",
    multiple=True,
    metavar="NAME=SQL",
    help="Documents of NAME's run to train on: a WHERE clause over its documents table (default: status = 'kept').",
)
@click.option(
    "--mixture", "mixtures", multiple=True, metavar="NAME=SRC=W,...", help="Source weights for NAME (default: as packed)."
)
@click.option("--seeds", default="0,1,2", show_default=True, help="Seeds per candidate, comma-separated.")
@_common
def ablate(candidates: tuple[str, ...], wheres: tuple[str, ...], mixtures: tuple[str, ...], seeds: str, **common: object) -> None:
    """Train the same small model on equal tokens of each candidate, with several seeds; write a
    table (mean ± std over seeds), ablation.json and report.html into --out.

    \b
      datapipe ablate --candidate filtered=out/shared_corpus \\
          --candidate unfiltered=out/shared_corpus --where "unfiltered=status = 'kept' OR stage = 'quality'" \\
          --out out/ablate-quality
    """
    from datapipe.ablate.ablation import run_ablation
    from datapipe.ablate.candidates import parse_candidates

    cands = parse_candidates(list(candidates), list(wheres), list(mixtures))
    settings = _settings(seeds=_seeds(seeds), **common)  # type: ignore[arg-type]
    run_ablation(cands, settings, log=lambda m: click.echo(m, err=True))
    click.echo((settings.out / "table.txt").read_text(), nl=False)
    click.echo(f"wrote {settings.out / 'ablation.json'} and {settings.out / 'report.html'}")


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated integers", param_hint="--seeds") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{text!r}: at least one seed, none twice", param_hint="--seeds")
    return seeds


@click.command("mix-search")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--where", default="status = 'kept'", show_default=True, help="Documents of the run to mix (a WHERE clause over documents)."
)
@click.option(
    "-k", "--proxies", "k", type=click.IntRange(min=4), default=16, show_default=True, help="Mixtures sampled, one proxy each."
)
@click.option(
    "--target",
    default="loss/all",
    show_default=True,
    help="Metric to optimise: loss/<lang>, loss/<lang>/<source>, loss/all or acc/<lang>; or a comma-separated "
    "set of them, scored by their mean (e.g. loss/zh/zh_wiki,loss/en/en_wiki).",
)
@click.option(
    "--sampling",
    type=click.Choice(["uniform", "natural"]),
    default="uniform",
    show_default=True,
    help="How the K mixtures are drawn: uniform on the simplex, or RegMix's Dirichlet around the sources' token shares.",
)
@click.option("--min-weight", default="", metavar="SRC=W,...", help="Minimum weight per source.")
@click.option("--max-weight", default="", metavar="SRC=W,...", help="Maximum weight per source.")
@click.option(
    "--target-tokens",
    type=click.IntRange(min=1),
    help="Tokens of the run the mixture is for (caps weights by available tokens; default: a proxy's).",
)
@click.option(
    "--max-epochs",
    type=click.FloatRange(min=0.01),
    default=4.0,
    show_default=True,
    help="Passes over a source a weight may ask for at --target-tokens.",
)
@click.option(
    "--seed", "proxy_seed", type=int, default=0, show_default=True, help="The seed of every proxy (and of the sampling)."
)
@click.option(
    "--validate-seeds",
    default="",
    metavar="S,S",
    help="Fresh seeds to train the predicted, best sampled and uniform mixtures with.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Proxies trained at once, each in its own process with --threads threads (on a many-core CPU: cores / threads).",
)
@click.option(
    "--pipeline",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Write the predicted mixture into this pipeline file's mixture: block.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write the mixture (mixture.json, --pipeline) even when the fit knows less than the targets' spread.",
)
@_common
def mix_search(
    run_dir: Path,
    where: str,
    k: int,
    target: str,
    sampling: str,
    min_weight: str,
    max_weight: str,
    target_tokens: int | None,
    max_epochs: float,
    proxy_seed: int,
    validate_seeds: str,
    jobs: int,
    pipeline: Path | None,
    force: bool,
    **common: object,
) -> None:
    """RegMix-style search over RUN_DIR's source weights: K proxies on sampled mixtures, a regression
    from weights to --target, the predicted best mixture (mixture.json, mixsearch.json in --out)."""
    from datapipe.ablate.candidates import Candidate, parse_weights
    from datapipe.ablate.mixsearch import run_mix_search

    settings = _settings(seeds=[proxy_seed], **common)  # type: ignore[arg-type]
    minimum = parse_weights(min_weight, "--min-weight") if min_weight else {}
    maximum = parse_weights(max_weight, "--max-weight") if max_weight else {}
    record = run_mix_search(
        Candidate("mix", run_dir, where),
        settings,
        k,
        target,
        minimum,
        maximum,
        target_tokens,
        max_epochs,
        _seeds(validate_seeds) if validate_seeds else [],
        proxy_seed,
        pipeline,
        log=lambda m: click.echo(m, err=True),
        sampling=sampling,
        jobs=jobs,
        force=force,
    )
    reg = record["regression"]
    click.echo(
        f"{k} proxies of size {record['size']}, {record['tokens_per_proxy']:,} tokens each, seed {record['proxy_seed']}; "
        f"regression on {reg['features']} (ridge alpha {reg['alpha']}): {reg['summary']}"
    )
    click.echo(f"best sampled: {record['best_sampled']['mixture']} {target} {record['best_sampled']['target']:.4f}")
    pred = record["predicted"]
    click.echo(
        f"predicted:    {pred['mixture']} {target} {pred['predicted_target']:.4f} "
        f"(by the regression, which puts uniform at {pred['uniform_predicted_target']:.4f}; {pred['from']})"
    )
    if "validation" in record:
        v = record["validation"]
        for name in ("predicted", "best_sampled", "uniform"):
            click.echo(f"validated {name}: {target} {v[name]['mean']:.4f} ± {v[name]['std']:.4f} over seeds {v['seeds']}")
        for other in ("best_sampled", "uniform"):
            o = v["verdict"][f"vs_{other}"]
            click.echo(
                f"predicted vs {other}: {o['outcome']} (gain {o['gain']:+.4f}, largest seed std {o['largest_seed_std']:.4f})"
            )
    if record["refused"]:
        raise MixtureNotWritten(
            f"mixture not written: {record['refused']} (see {settings.out / 'mixsearch.json'})",
            hint="train more proxies (-k), longer (--steps), or on a target that differs more between mixtures; "
            "--force writes it anyway",
        )
    if record["forced"]:
        click.echo("the fit knows less than the targets' spread; written anyway (--force)", err=True)
    click.echo(f"wrote {settings.out / 'mixture.json'}" + (f" and the mixture: block of {pipeline}" if pipeline else ""))
