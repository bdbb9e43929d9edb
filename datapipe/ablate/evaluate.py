"""What a proxy is scored on: loss on held-out clean text per language and source, and accuracy by
log-likelihood on multiple-choice benchmarks in Chinese and English.

Held-out text: the documents of the evaluation run (``status = 'kept'``: the clean text) whose id
hash puts them in the held-out share (``candidates.heldout``); no candidate trains on them. They
are packed per (language, source) into rows of seq_len + 1 tokens and at most ``rows`` rows of each
are kept, the same rows for every candidate and seed. The loss is the mean next-token
cross-entropy (nats per token) over the real tokens; a language's loss pools its sources' tokens.

Multiple choice: AGIEval's Gaokao files (zh) and SAT/LSAT/AQuA files (en), the questions with one
lettered answer. Each option is scored by the log-likelihood of its tokens after the passage and
question (truncated from the left to fit), divided by the option's characters (lm-eval's
``acc_norm``); the highest wins. A model of a few million parameters scores near chance here
(``chance`` is reported beside it): these numbers are honest, and mostly say so.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datapipe.ablate import import_torch
from datapipe.ablate.candidates import heldout, select_documents
from datapipe.decontaminate.benchmarks import Item, records
from datapipe.tokens.encode import TokenizerInfo, encode_documents, get_tokenizer
from datapipe.tokens.packing import ConcatPacker

if TYPE_CHECKING:
    import torch

# The multiple-choice benchmarks of the shared data, by language (files under benchmarks/agieval/).
MC_FILES = {
    "zh": [
        "gaokao-chinese",
        "gaokao-geography",
        "gaokao-history",
        "gaokao-biology",
        "gaokao-chemistry",
        "gaokao-physics",
        "gaokao-mathqa",
    ],
    "en": ["sat-en", "sat-math", "lsat-ar", "lsat-lr", "lsat-rc", "aqua-rat"],
}
ANSWER_CUE = {"zh": "\n答案：", "en": "\nAnswer:"}
_LETTER = re.compile(r"^\s*\(?([A-J])\)\s*")


@dataclass(frozen=True)
class MCItem:
    lang: str
    benchmark: str
    item_id: str
    context: str
    options: tuple[str, ...]
    label: int


def mc_items(agieval_dir: Path, per_lang: int) -> list[MCItem]:
    """Up to ``per_lang`` items per language, a fixed seeded sample of all single-answer items."""
    out: list[MCItem] = []
    for lang, names in MC_FILES.items():
        pool: list[MCItem] = []
        for name in names:
            path = agieval_dir / f"{name}.jsonl"
            if not path.is_file():
                continue
            for row, rec in enumerate(records(path), start=1):
                options, label = rec.get("options"), rec.get("label")
                if not options or not isinstance(label, str) or len(label) != 1:
                    continue
                texts = tuple(_LETTER.sub("", o) for o in options)
                idx = ord(label) - ord("A")
                if not 0 <= idx < len(texts):
                    continue
                context = "\n".join(s for s in (rec.get("passage"), rec.get("question")) if s) + ANSWER_CUE[lang]
                pool.append(MCItem(lang, name, f"{name}#{row}", context, texts, idx))
        order = np.random.default_rng(0).permutation(len(pool))[:per_lang]
        out += [pool[i] for i in sorted(order)]
    return out


def mc_benchmark_items(items: list[MCItem]) -> list[Item]:
    """The items as the decontamination index reads them (passage, question and options)."""
    return [Item(f"agieval_{i.lang}", i.item_id, (i.context, *i.options)) for i in items]


@dataclass
class EvalSet:
    groups: dict[str, np.ndarray]  # "lang/source" -> (rows, seq_len + 1) tokens
    n_tokens: dict[str, np.ndarray]  # real tokens per row (padding at the end)
    mc: list[MCItem]
    pad_id: int
    tokenizer: str

    def digest(self) -> str:
        """A hash of everything a run is scored on: two runs with the same digest were scored alike."""
        h = hashlib.sha256(str(self.pad_id).encode())  # the tokenizer is the run's (its sha256 is checked)
        for g in sorted(self.groups):
            h.update(g.encode() + b"\0")
            h.update(np.ascontiguousarray(self.groups[g]).tobytes())
            h.update(np.ascontiguousarray(self.n_tokens[g]).tobytes())
        for item in self.mc:
            h.update(json.dumps([item.item_id, item.context, item.options, item.label], ensure_ascii=False).encode())
        return h.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {
            "heldout": {g: {"rows": int(len(a)), "tokens": int(self.n_tokens[g].sum())} for g, a in self.groups.items()},
            "mc_items": {lang: sum(1 for i in self.mc if i.lang == lang) for lang in MC_FILES},
        }


def build_heldout(
    run: Path, info: TokenizerInfo, seq_len: int, fraction: float, rows: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    table = select_documents(run, "status = 'kept'")
    ids = table["id"].to_pylist()
    held = heldout(ids, fraction)
    langs, sources, texts = table["lang"].to_pylist(), table["source"].to_pylist(), table["text"].to_pylist()
    groups: dict[str, list[str]] = {}
    for h, lang, source, text in zip(held, langs, sources, texts):
        if h:
            groups.setdefault(f"{lang or 'und'}/{source}", []).append(text)
    toks, ntok = {}, {}
    for g, docs in sorted(groups.items()):
        enc = encode_documents(docs, info)
        packer = ConcatPacker(seq_len + 1, info.pad_id, np.dtype(info.dtype))
        parts = [p for p in (packer.add(enc.values.to_numpy(), enc.offsets.to_numpy()), packer.finish()) if len(p.n_tokens)]
        toks[g] = np.concatenate([p.tokens for p in parts])[:rows]
        ntok[g] = np.concatenate([p.n_tokens for p in parts])[:rows]
    return toks, ntok


def heldout_loss(model: torch.nn.Module, ev: EvalSet, device: torch.device, batch: int = 16) -> dict[str, float]:
    """Mean nats per token per group, per language and over all (pooled over the groups' tokens)."""
    torch = import_torch()
    model.eval()
    sums: dict[str, tuple[float, int]] = {}
    with torch.no_grad():
        for g, rows in ev.groups.items():
            total, count = 0.0, 0
            for lo in range(0, len(rows), batch):
                chunk = torch.from_numpy(rows[lo : lo + batch].astype(np.int64)).to(device)
                n = torch.from_numpy(ev.n_tokens[g][lo : lo + batch].astype(np.int64)).to(device)
                logits = model(chunk[:, :-1])
                nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
                mask = torch.arange(chunk.shape[1] - 1, device=device)[None, :] < (n[:, None] - 1)
                total += float(nll[mask].sum())
                count += int(mask.sum())
            sums[g] = (total, count)
    out = {g: t / max(c, 1) for g, (t, c) in sums.items()}
    for lang in sorted({g.split("/")[0] for g in sums}):
        t = sum(v[0] for g, v in sums.items() if g.split("/")[0] == lang)
        c = sum(v[1] for g, v in sums.items() if g.split("/")[0] == lang)
        out[lang] = t / max(c, 1)
    out["all"] = sum(v[0] for v in sums.values()) / max(1, sum(v[1] for v in sums.values()))
    return out


def mc_accuracy(
    model: torch.nn.Module, ev: EvalSet, seq_len: int, device: torch.device, batch: int = 32
) -> dict[str, dict[str, float]]:
    """Per language: accuracy, chance (mean 1/options) and items, by length-normalised log-likelihood."""
    torch = import_torch()
    model.eval()
    tok = get_tokenizer(ev.tokenizer)
    rows: list[tuple[int, int, list[int], int, int]] = []  # (item, option, ids, option start, option chars)
    for i, item in enumerate(ev.mc):
        ctx = tok.encode(item.context, add_special_tokens=False).ids
        for o, text in enumerate(item.options):
            opt = tok.encode((" " if item.lang == "en" else "") + text, add_special_tokens=False).ids[: seq_len // 2] or [
                ev.pad_id
            ]
            seq = (ctx + opt)[-(seq_len + 1) :]
            rows.append((i, o, seq, len(seq) - len(opt), max(1, len(text))))
    scores = np.full((len(ev.mc), max((len(i.options) for i in ev.mc), default=1)), -np.inf)
    with torch.no_grad():
        for lo in range(0, len(rows), batch):
            chunk = rows[lo : lo + batch]
            ids = torch.full((len(chunk), seq_len + 1), ev.pad_id, dtype=torch.long)
            for r, (_, _, seq, _, _) in enumerate(chunk):
                ids[r, : len(seq)] = torch.tensor(seq)
            ids = ids.to(device)
            logp = torch.log_softmax(model(ids[:, :-1]).float(), dim=-1).gather(2, ids[:, 1:, None])[..., 0].cpu()
            for r, (i, o, seq, start, chars) in enumerate(chunk):
                scores[i, o] = float(logp[r, start - 1 : len(seq) - 1].sum()) / chars
    out: dict[str, dict[str, float]] = {}
    for lang in MC_FILES:
        idx = [i for i, item in enumerate(ev.mc) if item.lang == lang]
        if not idx:
            continue
        correct = [int(np.argmax(scores[i]) == ev.mc[i].label) for i in idx]
        out[lang] = {
            "acc": float(np.mean(correct)),
            "chance": float(np.mean([1 / len(ev.mc[i].options) for i in idx])),
            "items": len(idx),
        }
    return out


def evaluate(model: torch.nn.Module, ev: EvalSet, seq_len: int, device: torch.device) -> dict[str, Any]:
    return {"heldout_loss": heldout_loss(model, ev, device), "mc": mc_accuracy(model, ev, seq_len, device)}


def dumps(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True)
