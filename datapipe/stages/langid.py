"""Language identification: fastText lid.176 per document, CJK script rules, line fractions, zh script.

Signals:
  ``lang``, ``lang_score``   the language (lid.176 codes: zh, en, ja, yue, ...) and its confidence
  ``lang_by``                ``fasttext`` or ``script`` (a CJK script rule overrode the model)
  ``lang_frac_<l>``          share of the document's lines in language l (in word units), and
                             ``lang_frac_other``; so a mixed zh/en page is visible as such
  ``script``, ``script_trad_frac``  for zh/yue: ``hant`` or ``hans`` from OpenCC conversion deltas
  ``to_simplified``          the text was converted to Simplified (option ``to_simplified``)
fastText reads a long document's prose as a few evenly spaced windows (``sample``,
``langid_sample.py``), and the whole ``max_chars`` prefix again only where their score is low.
The decision keeps configured languages above ``min_score``. Code is not filtered by natural
language by default (``kinds``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datapipe.assets.models import LID_FILENAME, LID_SHA256, ensure_lid_model, lid_model_path
from datapipe.runtime.process_cache import process_cache
from datapipe.stages import cjk
from datapipe.stages.base import (
    CheckContext,
    Decision,
    Problem,
    ResourceFile,
    Resources,
    Stage,
    StageOptions,
    kinds_problems,
)
from datapipe.stages.columns import set_column
from datapipe.stages.explain_section import RecordedRun, Threshold, threshold_if_set
from datapipe.stages.langid_report import lang_score_aggregate
from datapipe.stages.langid_sample import SampleOptions, sample_text
from datapipe.stages.quality import markdown
from datapipe.stages.report_section import Aggregate
from datapipe.text.langcodes import LID176_CODES, language_problems

_MODELS: dict[str, Any] = process_cache({})  # one loaded fastText model (an untyped library) per worker process
_NULL = pa.scalar(None, pa.string())


class KindRule(StageOptions):
    keep: list[str] | None = Field(None, description="Languages to keep for this source kind.")
    min_score: float | None = Field(None, ge=0.0, le=1.0, description="Minimum top-language probability.")


class LangIdOptions(StageOptions):
    keep: list[str] | None = Field(None, description="Languages to keep (lid.176 codes); omit to keep all.")
    min_score: float = Field(0.5, ge=0.0, le=1.0, description="Minimum probability of the top language.")
    kinds: list[str] = Field(["web", "paper", "text"], description="Source kinds the stage applies to.")
    max_chars: int = Field(20_000, ge=100, description="Characters of each document the stage looks at (a prefix).")
    sample: SampleOptions | None = Field(
        default_factory=SampleOptions,
        description=(
            "What fastText reads of a document longer than sample.chars: evenly spaced windows, the whole text "
            "under full_below (defaults: the same decisions on 99.996% of the shared corpus for 29.5% of the "
            "characters, bench/results/langid_prefix.json); null: all max_chars."
        ),
    )
    markdown: bool = Field(True, description="Judge the prose: Markdown code, math, tables and markup removed first.")
    model: str | None = Field(None, description="Path to a fastText model; default lid.176.ftz (fetched).")
    script_rules: bool = Field(True, description="Let kana/hangul/Cantonese characters decide on CJK text.")
    line_fractions: bool = Field(True, description="Record per-line language shares (lang_frac_*).")
    fraction_langs: list[str] = Field(["zh", "en"], description="Languages that get a lang_frac_ column.")
    mixed_min_fraction: float | None = Field(
        None, ge=0.0, le=1.0, description="Also keep a document whose kept languages cover this share of its lines."
    )
    script: bool = Field(True, description="Detect Traditional/Simplified script of zh and yue documents.")
    to_simplified: bool = Field(False, description="Convert Traditional zh/yue text to Simplified (OpenCC t2s).")
    yue: Literal["label", "as_zh", "drop"] = Field(
        "label", description="Cantonese: keep the label yue (keep list decides), relabel it zh, or drop it."
    )
    by_kind: dict[Literal["web", "code", "paper", "text"], KindRule] = Field(
        default_factory=dict, description="Per source kind: keep and min_score that override the ones above."
    )


class LangId(Stage):
    name = "langid"
    summary = "language ID (fastText lid.176 plus CJK script rules), Traditional/Simplified script, per-line language shares"
    signals = (
        "`lang`, `lang_score` (fastText lid.176); with the CJK options `lang_by` (`fasttext` or `script`), "
        "`lang_frac_zh`, `lang_frac_en`, `lang_frac_other`, `script` (`hans`/`hant`), `script_trad_frac`, "
        "`to_simplified`"
    )
    reasons = ("language_not_kept", "low_language_score", "cantonese")
    Options = LangIdOptions
    resources = Resources(num_cpus=1, memory_mb=300)
    edit_counts = {"to_simplified": "converted to Simplified"}  # documents (to_simplified: true)
    decision_options = frozenset({"keep", "min_score", "by_kind", "mixed_min_fraction"})

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        out = threshold_if_set(
            "lang_score", options.get("min_score", LangIdOptions.model_fields["min_score"].default), "min", "langid.min_score"
        )
        for kind, rule in (options.get("by_kind") or {}).items():
            if isinstance(rule, dict):
                out += threshold_if_set("lang_score", rule.get("min_score"), "min", f"langid.by_kind.{kind}.min_score")
        return out

    @classmethod
    def keeps_text(cls, options: LangIdOptions) -> bool:
        return not options.to_simplified  # converting to Simplified rewrites the text

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        o: LangIdOptions = options
        problems = kinds_problems(o.kinds)
        codes, model = set(LID176_CODES), "lid.176"
        if o.model:
            path = Path(o.model).expanduser()
            path = path if path.is_absolute() else context.pipeline_dir / path
            if not path.is_file():
                problems.append(("model", f"file not found: {path}"))
            else:  # a custom model: its own labels decide which codes can ever match
                try:
                    codes, model = _model_labels(path), path.name
                except Exception as exc:  # fastText raises ValueError or RuntimeError on a bad file
                    problems.append(("model", f"cannot load {path} as a fastText model: {exc}"))
        elif os.environ.get("DATAPIPE_LID_MODEL") and not lid_model_path().is_file():
            problems.append(("model", f"DATAPIPE_LID_MODEL points to {lid_model_path()}, which does not exist"))
        if o.script_rules:
            codes |= {"zh", "ja", "ko", "yue"}  # the CJK script rules output these whatever the model says
        lists = [("keep", o.keep or []), ("fraction_langs", o.fraction_langs)]
        lists += [(f"by_kind.{k}.keep", r.keep or []) for k, r in o.by_kind.items()]
        for key, values in lists:
            problems += [(f"{key}[{i}]", msg) for i, msg in language_problems(values, codes, model)]
        for kind in o.by_kind:
            if kind not in o.kinds:
                problems.append(
                    (
                        f"by_kind.{kind}",
                        f"{kind} is not in kinds {list(o.kinds)}: the stage never sees "
                        f"{kind} documents, so this rule would never apply",
                    )
                )
        if o.mixed_min_fraction is not None and (o.keep is None or not o.line_fractions):
            problems.append(
                (
                    "mixed_min_fraction",
                    "needs keep (the languages whose shares count) and "
                    "line_fractions: true; without them it would have no effect",
                )
            )
        if o.script or o.to_simplified:
            try:
                import opencc  # noqa: F401
            except ImportError:
                problems.append(
                    ("script", "needs the opencc package (pip install opencc), or set script: false and to_simplified: false")
                )
        return problems

    @classmethod
    def warnings(cls, options: Any, context: CheckContext) -> list[Problem]:
        """A min_score above sample.full_below: documents scoring between the two on their windows
        are decided on the windows alone, not read whole (the re-read is what keeps decisions as before)."""
        o: LangIdOptions = options
        if o.sample is None:
            return []
        scores = [("min_score", o.min_score)] + [(f"by_kind.{k}.min_score", r.min_score) for k, r in o.by_kind.items()]
        return [
            (
                "sample.full_below",
                f"{o.sample.full_below:g} is below {key} ({value:g}): long documents whose windows score between "
                f"the two are decided on their windows alone; set full_below to at least {value:g} to decide them "
                f"on the whole text as before (or sample: null)",
            )
            for key, value in scores
            if value is not None and value > o.sample.full_below
        ]

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return [lang_score_aggregate(columns)]

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        o: LangIdOptions = options
        cols = {"lang", "lang_score", "lang_by"}
        if o.line_fractions:
            cols |= {f"lang_frac_{c}" for c in o.fraction_langs} | {"lang_frac_other"}
        if o.script or o.to_simplified:
            cols |= {"script", "script_trad_frac"}
        if o.to_simplified:
            cols.add("to_simplified")
        return cols

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        """The fastText model, by hash: a given ``model`` file's own, else lid.176's pinned sha256.

        The default model is named ``lid.176.ftz`` wherever it is (cache or $DATAPIPE_LID_MODEL), so
        moving the cache is no change; a different file behind $DATAPIPE_LID_MODEL is, by its hash.
        """
        if options.model:
            path = Path(options.model).expanduser()
            return [ResourceFile(path if path.is_absolute() else pipeline_dir / path, "model", content=False)]
        pinned = None if os.environ.get("DATAPIPE_LID_MODEL") else LID_SHA256  # the fetch checks that hash
        return [ResourceFile(lid_model_path(), "model", content=False, name=LID_FILENAME, sha256=pinned)]

    def prepare(self) -> None:
        self._model_path()  # fetch once on the driver; a clear error here beats one per task
        if self.options.script or self.options.to_simplified:
            cjk.ScriptDetector.shared()  # fail early when OpenCC is missing

    def setup(self) -> None:
        path = str(self._model_path())
        if path not in _MODELS:
            import fasttext

            fasttext.FastText.eprint = lambda *a, **k: None  # silence its load-time warning
            _MODELS[path] = fasttext.load_model(path)
        self._model = _MODELS[path]
        if self.options.script or self.options.to_simplified:
            self._script = cjk.ScriptDetector.shared()

    @property
    def fasttext_model(self) -> Any:
        """The loaded fastText model (after ``setup``): what a benchmark compares the stage with."""
        return self._model

    def _model_path(self) -> Path:
        if self.options.model:
            p = Path(self.options.model)
            return p if p.is_absolute() else Path(self.context.pipeline_dir) / p
        return ensure_lid_model()

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def _predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # fastText reads one line: newlines become spaces (other whitespace it splits on itself).
        labels, scores = self._model.predict([t.replace("\n", " ") for t in texts], k=1)
        lang = np.array([lab[0][9:] if lab else None for lab in labels], dtype=object)  # strip "__label__"
        score = np.array([s[0] if len(s) else 0.0 for s in scores], dtype=np.float32)
        return lang, np.minimum(score, 1.0)

    def _predict_sampled(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """fastText's answer from the windows of each text longer than ``sample.chars``; the whole text
        again where that answer scores under ``sample.full_below``. Shorter texts are read whole."""
        s = self.options.sample
        if s is None:
            return self._predict(texts)
        long = [i for i, t in enumerate(texts) if len(t) > s.chars]
        inputs = list(texts)
        for i in long:
            inputs[i] = sample_text(texts[i], s.chars, s.windows)
        lang, score = self._predict(inputs)
        doubt = [i for i in long if score[i] < s.full_below]
        if doubt:
            lang[doubt], score[doubt] = self._predict([texts[i] for i in doubt])
        return lang, score

    def compute(self, batch: pa.Table) -> pa.Table:
        o = self.options
        text = pc.fill_null(batch["text"], "").combine_chunks()
        if o.markdown:
            # Code and math are not the document's language: fastText gives TiDB docs (18% Han) en
            # or zh below 0.5 on the whole page, and zh at 0.9+ on their prose.
            text = markdown.prose(text)
        # Long documents are judged by a prefix, and fastText reads windows of that (langid_sample.py).
        text = pc.utf8_slice_codeunits(text, 0, o.max_chars)
        texts = text.to_pylist()
        lang, score = self._predict_sampled(texts)
        by = np.full(len(lang), "fasttext", dtype=object)
        counts, line_counts, line_doc = cjk.line_script_counts(text)  # from the Arrow array: same counts, less CPU
        if o.script_rules:
            lang, score, by = self._apply_script_rules(counts, lang, score, by)
        if o.yue == "as_zh":
            lang[lang == "yue"] = "zh"
        batch = set_column(batch, "lang", pa.array(lang, pa.string()))
        batch = set_column(batch, "lang_score", pa.array(score, pa.float32()))
        batch = set_column(batch, "lang_by", pa.array(by, pa.string()))
        if o.line_fractions:
            for name, values in self._line_fractions(texts, counts, line_counts, line_doc, lang).items():
                batch = set_column(batch, name, pa.array(values, pa.float32()))
        if o.script or o.to_simplified:
            batch = self._zh_script(batch, texts, lang)
        return batch

    def _apply_script_rules(
        self, counts: dict[str, np.ndarray], lang: np.ndarray, score: np.ndarray, by: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        by_script = cjk.script_language(counts)
        override = np.array([s is not None and s != m for s, m in zip(by_script, lang)], dtype=bool)
        if override.any():
            cjk_n = counts["han"] + counts["kana"] + counts["hangul"]
            # Confidence of a script decision: how far CJK script dominates the letters.
            dominance = (cjk_n / np.maximum(cjk_n + counts["latin"] / 5.0, 1)).astype(np.float32)
            lang = np.where(override, by_script, lang)
            score = np.where(override, dominance, score).astype(np.float32)
            by = np.where(override, "script", by)
        return lang, score, by

    def _line_fractions(
        self,
        texts: list[str],
        counts: dict[str, np.ndarray],
        line_counts: dict[str, np.ndarray],
        line_doc: np.ndarray,
        lang: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Share of each language over lines, in word units (a CJK character or five Latin letters).

        A single-script document is all its own language. In a document with both CJK and Latin
        script, or with Han and some kana (a Chinese text quoting Japanese; cut into clauses at
        ``cjk.SEGMENT_BREAKS``), CJK lines take their script's language and the Latin lines together take one
        fastText label (from their first 1,000 characters), which keeps the cost near one
        fastText call per document.
        """
        n = len(lang)
        cjk_n = counts["han"] + counts["kana"] + counts["hangul"]
        units = cjk_n + counts["latin"] / 5.0
        mixed = (cjk_n >= 0.05 * units) & (counts["latin"] / 5.0 >= 0.05 * units) & (units > 0)
        # Kana in a document not labelled ja (or labelled ja with Han-only parts) may be a quote:
        # such documents are measured in clauses, not lines, since a quote rarely has a line.
        quoting = (counts["kana"] > 0) & (counts["han"] > 0)
        mixed |= quoting
        per_lang = {code: (lang == code).astype(np.float32) for code in self.options.fraction_langs}
        idx = np.flatnonzero(mixed)
        if len(idx):
            if quoting.any():
                texts = [re.sub(cjk.SEGMENT_BREAKS, "\n", t) if q else t for t, q in zip(texts, quoting)]
                _, line_counts, line_doc = cjk.line_script_counts(texts)
            line_lang = cjk.script_language(line_counts)
            # A clause without enough kana is Japanese in a Japanese document (kanji compounds
            # such as 衣食住 are Japanese there) and Chinese elsewhere.
            doc_ja = (lang == "ja")[line_doc]
            line_lang = np.where(np.equal(line_lang, "zh") & doc_ja, "ja", line_lang)
            # numpy's stubs reject None as an operand; on an object array it is the elementwise `is None`
            latin_line = np.equal(line_lang, None) & (line_counts["latin"] > 0)  # type: ignore[call-overload]
            first_line = np.searchsorted(line_doc, np.arange(n))
            parts, with_latin = [], []
            for i in idx:
                lines = texts[i].split("\n")
                flags = latin_line[first_line[i] : first_line[i] + len(lines)]
                if flags.any():  # an all-CJK document needs no fastText call
                    parts.append(" ".join(ln for ln, f in zip(lines, flags) if f)[:1000])
                    with_latin.append(i)
            doc_latin = np.full(n, None, dtype=object)
            if parts:
                doc_latin[with_latin] = self._predict(parts)[0]
            line_lang = np.where(latin_line, doc_latin[line_doc], line_lang)
            weight = line_counts["han"] + line_counts["kana"] + line_counts["hangul"] + line_counts["latin"] / 5.0
            total = np.bincount(line_doc, weight, minlength=n)
            for code in per_lang:
                share = np.bincount(line_doc, weight * (line_lang == code), minlength=n)
                with np.errstate(invalid="ignore", divide="ignore"):
                    per_lang[code][idx] = (share / total)[idx]
        out = {f"lang_frac_{code}": v for code, v in per_lang.items()}
        other = 1.0 - np.sum(list(per_lang.values()), axis=0) if per_lang else np.ones(n, np.float32)
        out["lang_frac_other"] = np.clip(other, 0.0, 1.0).astype(np.float32)
        return out

    def _zh_script(self, batch: pa.Table, texts: list[str], lang: np.ndarray) -> pa.Table:
        zh = np.flatnonzero((lang == "zh") | (lang == "yue"))
        script = np.full(len(lang), None, dtype=object)
        trad = np.full(len(lang), np.nan, dtype=np.float32)
        if len(zh):
            s, t = self._script.detect([texts[i] for i in zh])
            script[zh], trad[zh] = s, t
        batch = set_column(batch, "script", pa.array(script, pa.string()))
        batch = set_column(batch, "script_trad_frac", pa.array(trad, pa.float32(), from_pandas=True))
        if self.options.to_simplified:
            convert = script == "hant"
            full = batch["text"].to_pylist()
            for i in np.flatnonzero(convert):
                full[i] = self._script.to_simplified(full[i])
            batch = set_column(batch, "text", pa.array(full, pa.string()))
            batch = set_column(batch, "to_simplified", pa.array(convert, pa.bool_()))
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        o = self.options
        # A batch is one source, so one kind: its rule (if any) overrides keep and min_score.
        rule = o.by_kind.get(batch["kind"][0].as_py()) if batch.num_rows and "kind" in batch.column_names else None
        keep = rule.keep if rule is not None and rule.keep is not None else o.keep
        min_score = rule.min_score if rule is not None and rule.min_score is not None else o.min_score
        lang, score = batch["lang"], batch["lang_score"]
        low = pc.less(score, min_score)
        detail = pc.binary_join_element_wise("lang=", lang, " score=", pc.cast(pc.round(score, 3), pa.string()), "")
        if keep is not None:
            other = pc.fill_null(pc.invert(pc.is_in(lang, pa.array(keep, pa.string()))), True)
        else:
            other = pc.equal(score, -1.0)  # all false
        if o.mixed_min_fraction is not None and keep is not None and o.line_fractions:
            # A mixed document is kept when its kept languages together cover enough of it.
            cols = [batch[f"lang_frac_{c}"] for c in keep if f"lang_frac_{c}" in batch.column_names]
            if cols:
                covered = pc.greater_equal(_sum(cols), o.mixed_min_fraction)
                other = pc.and_(other, pc.invert(covered))
                low = pc.and_(low, pc.invert(covered))
        reason = pc.if_else(other, "language_not_kept", pc.if_else(low, "low_language_score", _NULL))
        if o.yue == "drop":
            reason = pc.if_else(pc.fill_null(pc.equal(lang, "yue"), False), "cantonese", reason)
        return Decision(reason, pc.if_else(pc.is_null(reason), _NULL, detail))


def _model_labels(path: Path) -> set[str]:
    import fasttext

    fasttext.FastText.eprint = lambda *a, **k: None
    return {label.removeprefix("__label__") for label in fasttext.load_model(str(path)).get_labels()}


def _sum(cols: list[pa.ChunkedArray]) -> pa.Array:
    total = pc.fill_null(cols[0], 0.0)
    for c in cols[1:]:
        total = pc.add(total, pc.fill_null(c, 0.0))
    return total
