"""Benchmark the ``mixture`` view of stats.duckdb over many synthetic document rows.

    python -m bench.perf.mixture_query --rows 10000000 [--repeats 5] [--json PATH]

Builds a ``documents`` table of ``--rows`` rows (source, lang, script, license_class with
NULLs, status, n_chars, n_tokens) in a DuckDB file, creates the view exactly as
``datapipe.audit.views`` does, and times ``SELECT * FROM mixture`` (median and range of ``--repeats``
runs, the cold first run printed too). There is no baseline to interleave: the figure is
absolute, against a target of under 2 seconds for 10M rows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb

from bench._support.harness import Harness, add_args
from datapipe.audit.views import mixture_view_sql


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--threads", type=int, default=0, help="DuckDB threads (0: DuckDB's default)")
    args = add_args(ap).parse_args()
    h = Harness("mixture_query", args, libs=["duckdb"])
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "stats.duckdb"))
        if args.threads:
            con.execute(f"SET threads = {args.threads}")
        t0 = time.perf_counter()
        # Skewed, realistic cardinalities: 40 sources, 12 languages, 5 scripts (+NULL), 7 license classes (+NULL).
        con.execute(f"""CREATE TABLE documents AS SELECT
                'doc' || i AS id,
                'source_' || (hash(i) % 40) AS source,
                ['zh','en','ja','ko','fr','de','ru','es','ar','vi','code','unknown'][(1 + hash(i * 7) % 12)::BIGINT] AS lang,
                CASE WHEN hash(i * 11) % 10 = 0 THEN NULL
                     ELSE ['Hans','Hant','Latn','Cyrl','Arab'][(1 + hash(i * 13) % 5)::BIGINT] END AS script,
                CASE WHEN hash(i * 17) % 4 = 0 THEN NULL
                     ELSE ['permissive','weak_copyleft','strong_copyleft','restricted','non_commercial',
                           'no_derivatives','unknown'][(1 + hash(i * 19) % 7)::BIGINT] END AS license_class,
                CASE WHEN hash(i * 23) % 5 = 0 THEN 'rejected' ELSE 'kept' END AS status,
                (50 + hash(i * 29) % 20000)::BIGINT AS n_chars,
                (20 + hash(i * 31) % 8000)::BIGINT AS n_tokens
            FROM range({args.rows}) t(i)""")
        build = time.perf_counter() - t0
        columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
        con.execute("CREATE OR REPLACE VIEW mixture AS " + mixture_view_sql(columns))
        con.close()
        con = duckdb.connect(str(Path(tmp) / "stats.duckdb"), read_only=True)  # as `datapipe sql` opens it
        if args.threads:
            con.execute(f"SET threads = {args.threads}")
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            rows = con.execute("SELECT * FROM mixture").fetchall()
            times.append(time.perf_counter() - t0)
        docs = sum(r[4] for r in rows)
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(
        f"{args.rows:,} document rows ({docs:,} kept) built in {build:.1f}s; mixture has {len(rows):,} groups; "
        f"DuckDB threads {threads}"
    )
    h.figure("SELECT * FROM mixture, first (cold) run", times[0], "s")
    h.figure("SELECT * FROM mixture, later runs", times[1:] or times, "s")
    h.noise("query time", times[1:] or times)
    h.finish(rows=args.rows, groups=len(rows), threads=threads, target="< 2 s")


if __name__ == "__main__":
    main()
