"""The pages: each route reads what it needs (through ``runs``, ``listing``, ``aggregates``, ...) and
renders a Jinja2 template with autoescaping, so nothing read from the run is ever markup.

Every page is a GET whose state is all in its URL (filters, the page's starting point, the run), so
any view can be bookmarked and shared. With two runs, ``run=b`` shows the second one.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from datapipe.audit import limits
from datapipe.audit.sql import AuditError, query_result
from datapipe.config.mixture import mixture_weights
from datapipe.loader.shards import RunIncomplete, ShardPathError
from datapipe.tokens.shard_format import ShardCorrupt
from datapipe.view import listing
from datapipe.view.aggregates import Aggregates, aggregates_for
from datapipe.view.charts import bars, fmt, hist_chart
from datapipe.view.compare import compare
from datapipe.view.document import SHOWN_TEXT_CHARS, document_page, find_row
from datapipe.view.runs import RunView
from datapipe.view.server import Request, Response, static_file
from datapipe.view.shard_rows import ShardReader
from datapipe.view.thresholds import Threshold, thresholds

SQL_ROWS_SHOWN = 500
SQL_DEFAULT_TIMEOUT = 60.0  # seconds; DATAPIPE_SQL_TIMEOUT or --sql-timeout sets another
SQL_WAIT_S = 2.0  # how long a query waits for the one running before it (one at a time)
BUSY = "another query is still running (one at a time, so memory stays within one limit): run this one again when it is done"
SHARDS_SHOWN = 500
# What reading a shard row may raise, shown as the page's message.
SHARD_ERRORS = (ShardCorrupt, ShardPathError, RunIncomplete, FileNotFoundError, ValueError)
# Characters that change how the text around them is laid out (bidirectional overrides and
# isolates, marks): shown as a visible code in the short places a document's text appears (a list's
# preview, a table cell), so a preview cannot reorder the row around it.
_BIDI = {c: f"⟨U+{c:04X}⟩" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C]}
_CONTROLS = {c: f"⟨U+{c:04X}⟩" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]}


def visible(text: Any) -> str:
    """Text for a short place: control and bidirectional characters shown as codes, newlines as spaces."""
    return str("" if text is None else text).replace("\n", " ").translate({**_BIDI, **_CONTROLS})


def doc_href(doc_id: str) -> str:
    return "/documents/" + quote(str(doc_id), safe="/")


def num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return f"{round(v):,}" if abs(v) >= 1000 else fmt(v)
    return str(v)


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("datapipe.view", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, visible=visible, doc=doc_href, fmt=fmt)
    env.globals["params_with_run"] = _with_run
    return env


def _with_run(params: dict[str, str], which: str) -> str:
    """This page's query string showing run ``which`` instead (the run switcher's links)."""
    items = [(k, v) for k, v in params.items() if k not in ("run", "after", "task")]
    return urlencode(items + ([("run", which)] if which != "a" else []))


class App:
    """The routes over one run (or two, to compare)."""

    def __init__(
        self,
        runs: list[RunView],
        memory_limit: str | int | None = None,
        sql_timeout: float | None = None,
        cache_dir: str | None = None,
    ) -> None:
        self.runs = dict(zip("ab", runs))
        self.aggregates: dict[str, Aggregates] = {k: aggregates_for(r) for k, r in self.runs.items()}
        self.shards = {k: ShardReader(r, cache_dir) for k, r in self.runs.items()}
        self.memory_limit = limits.memory_limit(memory_limit)
        self.sql_timeout = sql_timeout if sql_timeout is not None else (limits.timeout(None) or SQL_DEFAULT_TIMEOUT)
        self.sql_lock = threading.Lock()  # one query at a time: memory stays within one limit
        self.env = _env()
        self._thresholds: dict[str, tuple[object, dict[str, list[Threshold]]]] = {}

    def warm(self) -> None:
        """What every first page would otherwise pay, done before the server says it is ready: the
        templates compiled, each run's index and thresholds read; the Overview's numbers (its aggregate
        tables, or the sample of a run folder without them) start reading in the background."""
        for name in self.env.list_templates(filter_func=lambda n: n.endswith(".html")):
            self.env.get_template(name)
        for which, run in self.runs.items():
            self.thresholds(which)
            if run.has_database:
                run.index()
                # the Overview's numbers, computed once (rendering it fills the aggregates' cache)
                overview = Request("/", {"run": which})
                threading.Thread(target=self.handle, args=(overview,), name="datapipe-view-warm", daemon=True).start()

    # --- plumbing ------------------------------------------------------------------------------

    def handle(self, req: Request) -> Response:
        if req.path.startswith("/static/"):
            return static_file(req.path[len("/static/") :])
        if req.path == "/favicon.ico":
            return static_file("favicon.svg")
        which = req.params.get("run", "a") or "a"
        if which not in self.runs:
            return self.message(
                req, 404, "No such run", f"run={which!r}: this server shows run a" + (" and b" if "b" in self.runs else "")
            )
        run = self.runs[which]
        routes: dict[str, Callable[[Request, str, RunView], Response]] = {
            "/": self.overview,
            "/documents": self.documents,
            "/sql": self.sql,
            "/sql.csv": self.sql_csv,
            "/shards": self.shard_list,
            "/compare": self.compare,
        }
        try:
            if req.path in routes:
                return routes[req.path](req, which, run)
            if req.path.startswith("/documents/"):
                return self.document(req, which, run, req.path[len("/documents/") :])
            if req.path.startswith("/text/"):
                return self.text(req, which, run, req.path[len("/text/") :])
            return self.message(req, 404, "Not found", f"no page {req.path}")
        except AuditError as exc:
            return self.message(req, 400, "Cannot show this", str(exc), which=which)

    def url(self, which: str) -> Callable[..., str]:
        """``url(path, **params)`` for links of this page: keeps ``run=b`` when showing the second run."""

        def url(to: str, /, **params: Any) -> str:
            items = [(k, v) for k, v in params.items() if v is not None and v != ""]
            if which != "a" and "run" not in params:
                items.append(("run", which))
            return to + ("?" + urlencode(items) if items else "")

        return url

    def render(self, template: str, req: Request, which: str, status: int = 200, **context: Any) -> Response:
        run = self.runs[which]
        try:
            state = run.state()
        except AuditError:
            state = None
        page = self.env.get_template(template).render(
            run=run,
            which=which,
            runs=self.runs,
            state=state,
            url=self.url(which),
            params=req.params,
            path=req.path,
            **context,
        )
        return Response(status, page.encode("utf-8"))

    def message(self, req: Request, status: int, title: str, text: str, which: str = "a") -> Response:
        return self.render("message.html", req, which, status=status, title=title, text=text)

    def thresholds(self, which: str) -> dict[str, list[Threshold]]:
        run = self.runs[which]
        data = run.run_json()
        cached = self._thresholds.get(which)
        if cached is None or cached[0] is not data:
            cached = (data, thresholds(run.root, data))
            self._thresholds[which] = cached
        return cached[1]

    # --- pages ---------------------------------------------------------------------------------

    def overview(self, req: Request, which: str, run: RunView) -> Response:
        data = run.run_json()
        if not run.has_database:
            return self.render("overview.html", req, which, index=None, data=data)
        index = run.index()
        agg = self.aggregates[which]
        kept = {f.source: 0 for f in index.files}
        rejected_by: dict[tuple[str, str | None], int] = {}
        for f in index.files:
            if f.status == "kept":
                kept[f.source] += f.rows
            else:
                rejected_by[(f.source, f.stage)] = rejected_by.get((f.source, f.stage), 0) + f.rows
        sources = sorted(kept)
        stage_names = [s["stage"] for s in index.stages]
        chars_by_reason = {(int(r["position"]), r["reason"]): r["chars"] for r in agg.reasons() if r["position"] is not None}
        stages = []
        for s in index.stages:
            reasons = [r for r in index.reasons if r["position"] == s["position"]]
            stages.append(
                {
                    **s,
                    "out": s["docs_in"] - s["dropped"],
                    "reasons": [{**r, "chars": chars_by_reason.get((int(r["position"]), r["reason"]))} for r in reasons],
                    "edits": [e for e in index.edits if e["position"] == s["position"]],
                }
            )
        funnel_bars = bars([[s["out"], s["dropped"]] for s in stages], ["kept", "dropped"])
        cells = agg.source_lang()
        langs = sorted({c["lang"] for c in cells if c["status"] == "kept"}, key=lambda x: (x is None, str(x)))
        matrix = {(c["source"], c["lang"]): c for c in cells if c["status"] == "kept"}
        lang_totals = {lang: sum(c["documents"] for c in cells if c["status"] == "kept" and c["lang"] == lang) for lang in langs}
        langs.sort(key=lambda x: -lang_totals[x])
        rejected_langs: dict[str | None, float] = {}
        for c in cells:
            if c["status"] == "rejected":
                rejected_langs[c["lang"]] = rejected_langs.get(c["lang"], 0) + c["documents"]
        tokens_by: dict[tuple[str, str], int] = {}
        for s in index.shards:
            key = (s["source"], s["split"])
            tokens_by[key] = tokens_by.get(key, 0) + int(s["tokens"] or 0)
        weights = mixture_weights((data.get("config") or {}).get("mixture"))
        total_train = sum(t for (src, split), t in tokens_by.items() if split == "train") or 0
        wsum = sum(weights.values())
        mixture = [
            {
                "source": s,
                "kept": kept.get(s, 0),
                "train": tokens_by.get((s, "train"), 0),
                "val": tokens_by.get((s, "val"), 0),
                "share": tokens_by.get((s, "train"), 0) / total_train if total_train else None,
                "target": weights[s] / wsum if wsum and s in weights else None,
            }
            for s in dict.fromkeys([*sources, *weights])
        ]
        dists = self._distributions(which, agg)
        totals = {
            "in": index.stages[0]["docs_in"] if index.stages else sum(f.rows for f in index.files),
            "kept": sum(kept.values()),
            "rejected": sum(rejected_by.values()),
            "tokens": sum(tokens_by.values()),
        }
        return self.render(
            "overview.html",
            req,
            which,
            index=index,
            data=data,
            totals=totals,
            stages=stages,
            funnel_bars=funnel_bars,
            sources=sources,
            langs=langs,
            matrix=matrix,
            lang_totals=lang_totals,
            rejected_langs=sorted(rejected_langs.items(), key=lambda kv: -kv[1]),
            rejected_by=rejected_by,
            stage_names=list(dict.fromkeys(n for n in stage_names)),
            kept=kept,
            mixture=mixture,
            dists=dists,
            agg=agg,
        )

    def _distributions(self, which: str, agg: Aggregates) -> list[dict[str, Any]]:
        """The Overview's histograms: each distribution column's (kept and rejected for n_chars, kept
        for n_tokens), with the configured thresholds marked and each bin linking to its documents."""
        th = self.thresholds(which)
        dists = []
        for column in agg.distribution_columns():
            for status in ("kept", "rejected") if column == "n_chars" else ("kept",) if column == "n_tokens" else (None,):
                hist = agg.histogram(column, status)
                if hist is None:
                    continue
                query = {"status": status} if status else {}

                def href(lo: float, hi: float, c: str = column, q: dict[str, str] = query) -> str:
                    return self.url(which)("/documents", **q, **{f"{c}_min": fmt_q(lo), f"{c}_max": fmt_q(hi)}, hist=c)

                chart = hist_chart(
                    hist,
                    href,
                    th.get(column, []),
                    width=360,
                    height=140,
                    base=self.url(which)("/documents", **query, hist=column),
                )
                dists.append({"column": column, "status": status, "chart": chart, "total": hist.total})
        return dists

    def documents(self, req: Request, which: str, run: RunView) -> Response:
        if req.params.get("id"):  # the "go to a document" box
            target = self.url(which)(doc_href(req.params["id"].strip()))
            return Response(303, b"", headers={"Location": target})
        index = run.index()
        numeric = index.numeric_columns()
        try:
            f = listing.Filters.from_query(req.params, set(numeric))
        except listing.FilterError as exc:
            return self.message(req, 400, "Bad filter", str(exc), which=which)
        after = _cursor(req.params.get("after"))
        files = listing.candidate_files(index, f)
        hist_column = req.params.get("hist") or (f.ranges[0][0] if f.ranges else "n_chars")
        if hist_column not in numeric:
            hist_column = "n_chars"
        started = time.perf_counter()
        page = listing.scan_page(run, files, f, after, extra=(hist_column,))
        list_seconds = time.perf_counter() - started
        hist = listing.histogram(run, files, f, hist_column) if hist_column in numeric else None
        url = self.url(which)
        chart = None
        if hist is not None and hist.counts:
            chart = hist_chart(
                hist,
                lambda lo, hi: url(
                    "/documents",
                    **_params(f.query(), {f"{hist_column}_min": fmt_q(lo), f"{hist_column}_max": fmt_q(hi)}, hist_column),
                ),
                self.thresholds(which).get(hist_column, []),
                selected=f.range_of(hist_column),
                base=url("/documents", **_params(f.without_range(hist_column).query(), {}, hist_column)),
            )
        total = None if f.row_level else sum(x.rows for x in files)
        stages = sorted({x.stage for x in index.files if x.stage})
        sources = sorted({x.source for x in index.files})
        reasons = sorted({str(r["reason"]) for r in index.reasons if r["reason"] is not None})
        next_url = None
        if page.stopped_at is not None:
            next_url = url(
                "/documents", **_params(f.query(), {"after": f"{page.stopped_at[0]}:{page.stopped_at[1]}"}, hist_column)
            )
        return self.render(
            "documents.html",
            req,
            which,
            f=f,
            page=page,
            files=files,
            total=total,
            chart=chart,
            hist=hist,
            hist_column=hist_column,
            numeric=numeric,
            stages=stages,
            sources=sources,
            reasons=reasons,
            next_url=next_url,
            first_url=url("/documents", **_params(f.query(), {}, hist_column)) if after != (0, 0) else None,
            list_seconds=list_seconds,
            clear_url=url("/documents", hist=hist_column),
            clear_range_url=url("/documents", **_params(f.without_range(hist_column).query(), {}, hist_column))
            if f.range_of(hist_column) != (None, None)
            else None,
        )

    def document(self, req: Request, which: str, run: RunView, doc_id: str) -> Response:
        page = document_page(run, doc_id)
        if page is None:
            return self.message(req, 404, "No such document", f"no document {doc_id!r} in {run.location}", which=which)
        th = self.thresholds(which)
        other = None
        if len(self.runs) == 2:
            b = "b" if which == "a" else "a"
            found = find_row(self.runs[b], doc_id)
            other = (b, found[1] if found else None)
        return self.render(
            "document.html",
            req,
            which,
            page=page,
            doc_id=doc_id,
            shown=page.text[:SHOWN_TEXT_CHARS],
            cut=len(page.text) > SHOWN_TEXT_CHARS,
            has_bidi=any(chr(c) in page.text for c in _BIDI),
            thresholds=th,
            other=other,
            text_url=self.url(which)("/text/" + quote(doc_id, safe="/")),
        )

    def text(self, req: Request, which: str, run: RunView, doc_id: str) -> Response:
        found = find_row(run, doc_id)
        if found is None:
            return Response(404, b"no such document\n", "text/plain; charset=utf-8")
        body = str(found[1].get("text") or "").encode("utf-8")
        # text/plain under a sandbox: never a page of this origin, whatever the text holds
        return Response(200, body, "text/plain; charset=utf-8", {"Content-Security-Policy": "sandbox; default-src 'none'"})

    def sql(self, req: Request, which: str, run: RunView) -> Response:
        q = req.params.get("q", "").strip()
        context: dict[str, Any] = {"q": q, "columns": [], "rows": [], "error": None, "more": False, "seconds": None}
        if q:
            started = time.perf_counter()
            try:
                with self._one_query(), query_result(run.root, q, self.memory_limit, self.sql_timeout) as result:
                    context["columns"] = result.schema.names
                    for batch in result:
                        for row in batch.to_pylist():
                            if len(context["rows"]) >= SQL_ROWS_SHOWN:
                                context["more"] = True
                                break
                            context["rows"].append([row[c] for c in context["columns"]])
                        if context["more"]:
                            break
            except AuditError as exc:
                context["error"] = str(exc)
            context["seconds"] = time.perf_counter() - started
        examples = [
            "select stage, reason, docs_in, dropped, drop_share from funnel",
            "select source, lang, count(*) as docs, sum(n_tokens) as tokens from documents where status = 'kept' "
            "group by all order by docs desc",
            "select id, detail, left(text, 80) as text from rejected_docs where stage = 'quality' limit 20",
            "select * from shards",
        ]
        return self.render(
            "sql.html",
            req,
            which,
            examples=examples,
            limit=limits.format_size(self.memory_limit),
            timeout=self.sql_timeout,
            shown=SQL_ROWS_SHOWN,
            **context,
        )

    @contextlib.contextmanager
    def _one_query(self) -> Iterator[None]:
        """The SQL lock, or an AuditError saying another query runs (a page never waits long)."""
        if not self.sql_lock.acquire(timeout=SQL_WAIT_S):
            raise AuditError(BUSY)
        try:
            yield
        finally:
            self.sql_lock.release()

    def sql_csv(self, req: Request, which: str, run: RunView) -> Response:
        q = req.params.get("q", "").strip()
        if not q:
            return Response(400, b"give a query: /sql.csv?q=select ...\n", "text/plain; charset=utf-8")
        # The query is checked and started before the response begins, so a refused or failing query
        # is a plain error, not a broken download.
        if not self.sql_lock.acquire(timeout=SQL_WAIT_S):
            return Response(503, f"error: {BUSY}\n".encode(), "text/plain; charset=utf-8")
        try:
            manager = query_result(run.root, q, self.memory_limit, self.sql_timeout)
            result = manager.__enter__()
        except AuditError as exc:
            self.sql_lock.release()
            return Response(400, f"error: {exc}\n".encode(), "text/plain; charset=utf-8")
        except BaseException:
            self.sql_lock.release()
            raise

        freed = threading.Event()

        def done() -> None:  # once: the body was sent, cut short, or never asked for (HEAD)
            if not freed.is_set():
                freed.set()
                manager.__exit__(None, None, None)
                self.sql_lock.release()

        def rows() -> Iterator[bytes]:
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(result.schema.names)
            for batch in result:
                for row in batch.to_pylist():
                    writer.writerow(row.values())
                yield buf.getvalue().encode("utf-8")
                buf.seek(0)
                buf.truncate()
            yield buf.getvalue().encode("utf-8")

        return Response(
            200,
            rows(),
            "text/csv; charset=utf-8",
            {"Content-Disposition": 'attachment; filename="query.csv"'},
            done,
        )

    def shard_list(self, req: Request, which: str, run: RunView) -> Response:
        path = req.params.get("path")
        if path:
            try:
                row = int(req.params.get("row", "0") or 0)
            except ValueError:
                return self.message(req, 400, "Bad row", f"row={req.params.get('row')!r} is not a number", which=which)
            try:
                decoded = self.shards[which].decode(path, row)
            except (KeyError, IndexError) as exc:
                return self.message(req, 404, "No such row", str(exc.args[0] if exc.args else exc), which=which)
            except SHARD_ERRORS as exc:
                return self.message(req, 400, "Cannot read the shard", str(exc), which=which)
            return self.render("shard_row.html", req, which, d=decoded)
        shards = run.index().shards
        source, split = req.params.get("source") or None, req.params.get("split") or None
        picked = [s for s in shards if (source is None or s["source"] == source) and (split is None or s["split"] == split)]
        return self.render(
            "shards.html",
            req,
            which,
            shards=picked[:SHARDS_SHOWN],
            count=len(picked),
            total=len(shards),
            sources=sorted({s["source"] for s in shards}),
            source=source,
            split=split,
            shown_max=SHARDS_SHOWN,
        )

    def compare(self, req: Request, which: str, run: RunView) -> Response:
        if len(self.runs) < 2:
            return self.message(req, 400, "One run", "compare needs two runs: datapipe view RUN_A RUN_B", which=which)
        try:
            first = max(0, int(req.params.get("task", "0") or 0))
        except ValueError:
            first = 0
        started = time.perf_counter()
        result = compare(self.runs["a"], self.runs["b"], first)
        return self.render("compare.html", req, which, c=result, seconds=time.perf_counter() - started)


def fmt_q(v: float | None) -> str | None:
    """A bound for a query string: exact (repr) for floats, plain for whole numbers."""
    if v is None:
        return None
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


def _params(query: str, changes: dict[str, Any], hist: str) -> dict[str, str]:
    params = dict(parse_qsl(query, keep_blank_values=False))
    params.pop("after", None)
    params.update({k: v for k, v in changes.items() if v is not None})
    params["hist"] = hist
    return params


def _cursor(text: str | None) -> tuple[int, int]:
    if not text:
        return (0, 0)
    try:
        a, b = text.split(":", 1)
        return (max(0, int(a)), max(0, int(b)))
    except ValueError:
        return (0, 0)
