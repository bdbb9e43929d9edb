"""The fast encoders (fastokens, datapipe's tiktoken path) give exactly tokenizers' ids; a tokenizer neither
reproduces stays on tokenizers, and a run's log and run.json say which encoder ran and why.

Tokenizers are trained here, small, on real text (the shared zh/en corpus) in several configurations
(vocabulary sizes, prefix space, a Llama-3 style split regex, special tokens in the text), and every
document of a real sample is encoded both ways. ``bench/perf/fast_encoder.py`` does the same over the
whole corpus with larger vocabularies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens import encode as tokenize
from datapipe.tokens.fast_bpe import FastEncoder, plan_fast_encoder, probe_text
from tests.support.bpe_variants import SPECIAL, train_bpe, with_special_tokens
from tests.support.shared_data import shared_path

ROOT = Path(__file__).resolve().parents[2]


def _corpus_sample(per_file: int, chars: int) -> list[str]:
    """The first documents of each corpus file (zh wiki, zh tech docs with code, zh math, en wiki), up to ``chars`` each."""
    texts: list[str] = []
    for name in ("zh_wikipedia", "zh_pingcap_docs", "zh_oiwiki", "en_wikipedia"):
        size = 0
        with open(shared_path(f"corpus/{name}.jsonl"), encoding="utf-8") as f:
            for line, _ in zip(f, range(per_file)):
                texts.append(json.loads(line)["text"])
                size += len(texts[-1])
                if size > chars:
                    break
    return texts


@pytest.fixture(autouse=True)
def _tiktoken_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests here check datapipe's own fast path (tiktoken), which fastokens would otherwise take over."""
    monkeypatch.setenv(tokenize.ENGINE_ENV, "tiktoken")


def _info(path: Path) -> tokenize.TokenizerInfo:
    return tokenize.with_engine(tokenize.load_tokenizer_info(path, TokenizeConfig(tokenizer=str(path), seq_len=512)))


def _assert_same_ids(info: tokenize.TokenizerInfo, texts: list[str]) -> None:
    slow = dataclasses.replace(info, engine="tokenizers")
    assert tokenize.encode_documents(texts, info).equals(tokenize.encode_documents(texts, slow))


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return _corpus_sample(per_file=400, chars=250_000)


CONFIGS = {
    # name: (vocabulary, pre-tokenizer, special tokens, ignore_merges)
    "bytelevel-4k": (4000, "bytelevel", SPECIAL[:2], False),
    "prefix-space-2k": (2000, "prefix", SPECIAL, False),
    "llama3-split-8k": (8000, "llama3", SPECIAL, False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fast_path_gives_tokenizers_ids_on_real_text(tmp_path: Path, sample: list[str], name: str) -> None:
    vocab, pre, special, ignore = CONFIGS[name]
    info = _info(train_bpe(tmp_path / "tok.json", sample[::2], vocab, pre, special, ignore))
    assert (info.engine, info.engine_note) == ("tiktoken", f"{tokenize.ENGINE_ENV}=tiktoken; using tiktoken")
    tokenize._FAST.clear()
    texts = with_special_tokens(sample) + [probe_text()]
    _assert_same_ids(info, texts)
    assert tokenize.encoder_used(info) == "tiktoken"  # the run's own sample agreed: the fast path did the encoding


def _with_unmade_token(data: dict) -> tuple[dict, str]:
    """The demo tokenizer plus a vocabulary token no merge makes (as a hand-extended vocabulary has): a word piece."""
    vocab = data["model"]["vocab"]
    u = next(t for t in vocab if t.startswith("Ġ") and len(t) > 3 and t[1:].isalpha() and t[1:].isascii())
    v = next(t for t in vocab if len(t) > 2 and t.isalpha() and t.isascii() and u + t not in vocab)
    vocab[u + v] = max(vocab.values()) + 1
    for t in data["added_tokens"]:
        t["id"] = vocab[t["content"]]
    return data, u + v


def test_tokens_bpe_never_makes_are_left_out_of_the_ranks() -> None:
    data, word = _with_unmade_token(_demo())
    plan = plan_fast_encoder(data)
    assert not isinstance(plan, str)
    assert plan.left_out == 3  # the two special tokens (matched before BPE) and the unmade one
    tok = Tokenizer.from_str(json.dumps(data))
    text = "x " + word[1:] + " y"
    want = tok.encode(text, add_special_tokens=False).ids
    assert data["model"]["vocab"][word] not in want
    assert FastEncoder(plan).encode(text).tolist() == want
    # Left in, tiktoken would return the piece as that token: not tokenizers' ids.
    full = dataclasses.replace(plan, ranks={**plan.ranks, _bytes(word): data["model"]["vocab"][word]})
    assert FastEncoder(full).encode(text).tolist() != want


def _bytes(token: str) -> bytes:
    from datapipe.tokens.fast_bpe import unicode_to_byte

    return bytes(unicode_to_byte()[c] for c in token)


def _demo() -> dict:
    return json.loads((ROOT / "tokenizer" / "demo.json").read_text(encoding="utf-8"))


def _swap_merge_results(data: dict) -> dict:
    vocab = data["model"]["vocab"]
    a, b = ("".join(m.split(" ")) if isinstance(m, str) else "".join(m) for m in data["model"]["merges"][10:12])
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return data


def _with(data: dict, **changes) -> dict:
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: _with(d, normalizer={"type": "NFC"}), "normalizer NFC"),
        (
            lambda d: _with(
                d, pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
            ),
            "Metaspace",
        ),
        (
            lambda d: _with(
                d,
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Digits", "individual_digits": True}, d["pre_tokenizer"]],
                },
            ),
            "pre-tokenizer Sequence",
        ),
        (_swap_merge_results, "merge order"),
        (lambda d: _with(_with_unmade_token(d)[0], model={**d["model"], "ignore_merges": True}), "ignore_merges"),
        (lambda d: _with(d, model={**d["model"], "dropout": 0.1}), "dropout"),
        (
            lambda d: _with(
                d, added_tokens=[*d["added_tokens"], {**d["added_tokens"][0], "id": 5000, "content": "<|end", "special": False}]
            ),
            "overlap",
        ),
        (lambda d: _with(d, added_tokens=[{**d["added_tokens"][0], "lstrip": True}, *d["added_tokens"][1:]]), "strips spaces"),
    ],
)
def test_tokenizers_it_cannot_reproduce_stay_on_tokenizers(tmp_path: Path, change, reason: str) -> None:
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(change(_demo())), encoding="utf-8")
    info = _info(path)
    assert info.engine == "tokenizers"
    assert reason in info.engine_note
    if reason == "dropout":
        return  # random merges: no two encodings agree
    texts = with_special_tokens(_corpus_sample(per_file=20, chars=20_000))
    lists = tokenize.encode_documents(texts, info)
    tok = Tokenizer.from_file(str(path))
    assert [x[:-1] for x in lists.to_pylist()] == [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_split_regex_that_skips_text_falls_back_per_document(tmp_path: Path) -> None:
    """tiktoken drops what a split regex does not match; tokenizers keeps it as pieces. Such documents go to tokenizers."""
    data = _demo()
    data["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    plan = plan_fast_encoder(data)
    assert not isinstance(plan, str)
    assert FastEncoder(plan).encode("abc def") is None and FastEncoder(plan).encode("abcdef") is not None
    _assert_same_ids(_info(path), _corpus_sample(per_file=20, chars=20_000) + ["abc", "abc def", ""])


def test_threads_give_the_same_ids_as_one_thread_and_tokenizers(sample: list[str]) -> None:
    """Encoding on several threads (an in-process run) changes nothing: the same ids, the same documents
    left to tokenizers (a lone surrogate), in order; the ids are tokenizers' ids."""
    path = ROOT / "tokenizer" / "demo.json"
    plan = plan_fast_encoder(json.loads(path.read_text(encoding="utf-8")))
    assert not isinstance(plan, str)
    enc = FastEncoder(plan)
    texts = sample + ["", "a\ud800b", "x"]
    one, many = enc.encode_batch(texts, threads=1), enc.encode_batch(texts, threads=3)
    as_lists = [[None if x is None else x.tolist() for x in ids] for ids in (one, many)]
    assert as_lists[0] == as_lists[1]
    assert [i for i, x in enumerate(one) if x is None] == [len(texts) - 2]
    want = [e.ids for e in Tokenizer.from_file(str(path)).encode_batch(texts[:-2] + texts[-1:], add_special_tokens=False)]
    assert as_lists[1][:-2] + as_lists[1][-1:] == want


def test_a_mismatch_on_the_runs_own_text_falls_back_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    info = _info(ROOT / "tokenizer" / "demo.json")
    assert info.engine == "tiktoken"
    texts = _corpus_sample(per_file=10, chars=10_000)
    want = tokenize.encode_documents(texts, dataclasses.replace(info, engine="tokenizers"))
    real = FastEncoder._encode_run
    monkeypatch.setattr(
        FastEncoder,
        "_encode_run",
        lambda self, ts, marked=None: [None if ids is None else ids[::-1].copy() for ids in real(self, ts, marked)],
    )
    tokenize._FAST.clear()
    with caplog.at_level(logging.WARNING, logger="datapipe.tokens.encode"):
        assert tokenize.encode_documents(texts, info).equals(want)
    assert "encoding with tokenizers" in caplog.text
    assert tokenize.encoder_used(info) == "tokenizers"
    tokenize._FAST.clear()


def test_the_engine_can_be_forced_to_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokenize.ENGINE_ENV, "tokenizers")
    info = _info(ROOT / "tokenizer" / "demo.json")
    assert info.engine == "tokenizers" and tokenize.ENGINE_ENV in info.engine_note


def _special_tokens_run(tmp_path: Path, per_file: int = 60) -> Path:
    """A pipeline (no stages) over real text with special tokens in it, tokenized with the demo tokenizer."""
    from tests.conftest import write_pipeline

    texts = with_special_tokens(_corpus_sample(per_file=per_file, chars=per_file * 1000))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts if t), encoding="utf-8")
    return write_pipeline(
        tmp_path,
        {
            "name": "t",
            "sources": [{"name": "web", "kind": "web", "paths": ["docs.jsonl"]}],
            "stages": [],
            "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 256, "val_fraction": 0.1},
        },
    )


def _run(pipeline: Path, out: Path) -> tuple[dict, list[str]]:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    tokenize._FAST.clear()
    logs: list[str] = []
    run_pipeline(load_pipeline(pipeline), output=out, in_process=True, show_progress=False, log=logs.append)
    return json.loads((out / "run.json").read_text()), logs


def test_shards_and_run_identity_are_the_same_with_every_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole run (in this process) on real text with special tokens in it: byte-identical shards, same run.json
    identity; the log and run.json name the engine (fastokens when nothing is forced) and why."""
    pipeline = _special_tokens_run(tmp_path)
    outs, runs = {}, {}
    for engine in ("fastokens", "tiktoken", "tokenizers"):
        if engine == "fastokens":
            monkeypatch.delenv(tokenize.ENGINE_ENV)
        else:
            monkeypatch.setenv(tokenize.ENGINE_ENV, engine)
        outs[engine] = tmp_path / engine
        runs[engine], logs = _run(pipeline, outs[engine])
        [line] = [m for m in logs if "tokens encoded with" in m]
        assert line.startswith(f"datapipe: tokens encoded with {engine}")
        assert runs[engine]["encoder"]["engine"] == engine
        assert runs[engine]["encoder"]["tasks"] == ({engine: 1} if engine != "tokenizers" else {"tokenizers": 1})
    assert runs["fastokens"]["encoder"]["why"] == ""
    shards = {
        e: {p.relative_to(o): p.read_bytes() for p in sorted((o / "shards").rglob("*")) if p.is_file()} for e, o in outs.items()
    }
    assert len(shards["fastokens"]) >= 3 and shards["fastokens"] == shards["tiktoken"] == shards["tokenizers"]
    for key in ("fingerprint", "config", "resources"):
        assert runs["fastokens"][key] == runs["tiktoken"][key] == runs["tokenizers"][key]


def test_a_fastokens_mismatch_on_the_runs_text_falls_back_to_the_fast_path_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """fastokens made to give other ids (reversed) on the run's first batch: the run encodes with tiktoken,
    warns, and run.json counts its map task under tiktoken."""
    monkeypatch.delenv(tokenize.ENGINE_ENV)
    pipeline = _special_tokens_run(tmp_path, per_file=20)
    real = tokenize.FastokensEncoder.encode_flat

    def reversed_ids(self: tokenize.FastokensEncoder, texts: list[str]):  # noqa: ANN202
        ids, offsets = real(self, texts)
        return ids[::-1].copy(), offsets

    monkeypatch.setattr(tokenize.FastokensEncoder, "encode_flat", reversed_ids)
    with caplog.at_level(logging.WARNING, logger="datapipe.tokens.encode"):
        run, logs = _run(pipeline, tmp_path / "out")
    assert "fastokens' ids differ from tokenizers' on this run's text" in caplog.text and "encoding with tiktoken" in caplog.text
    assert run["encoder"]["engine"] == "fastokens" and run["encoder"]["tasks"] == {"tiktoken": 1}
    assert any("sample check fell back" in m for m in logs)
    assert any((tmp_path / "out" / "shards").rglob("*.arrow"))  # tiktoken's ids are tokenizers' (the tests above)
    tokenize._FAST.clear()


def test_a_tokenizer_fastokens_cannot_load_keeps_todays_path_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import models, pre_tokenizers

    monkeypatch.delenv(tokenize.ENGINE_ENV)
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2, "<|endoftext|>": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "wordlevel.json"
    tok.save(str(path))
    info = _info(path)
    assert info.engine == "tokenizers"
    assert info.describe() == (
        "tokenizers: fastokens could not load this tokenizer: pre-tokenizer error: unsupported pre-tokenizer type: "
        "Whitespace; using tokenizers (model WordLevel)"
    )
    _assert_same_ids(info, ["a b", "b a c", ""])


def test_an_unknown_engine_is_an_error_naming_the_allowed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokenize.ENGINE_ENV, "fast")
    with pytest.raises(tokenize.TokenizerError, match="one of fastokens, tiktoken, tokenizers"):
        _info(ROOT / "tokenizer" / "demo.json")


def test_fastokens_encodes_on_the_threads_it_is_given(tmp_path: Path) -> None:
    """fastokens sizes its pool from FASTOKENS_BPE_THREADS, which datapipe sets from the task's CPUs
    (RAYON_NUM_THREADS in a Ray worker): a 1-CPU worker's process starts no thread to encode."""
    import subprocess
    import sys

    code = (
        "import os\n"
        "from datapipe.tokens.encode import FastokensEncoder\n"
        "n = len(os.listdir('/proc/self/task'))\n"
        f"enc = FastokensEncoder({str(ROOT / 'tokenizer' / 'demo.json')!r})\n"
        "enc.encode_flat(['some text ' * 2000] * 64)\n"
        "print(os.environ['FASTOKENS_BPE_THREADS'], len(os.listdir('/proc/self/task')) - n)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"} | {"RAYON_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "0"]


def test_a_plan_is_stored_by_the_files_hash_and_loaded_as_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning takes 0.3-0.4 CPU s for a 32k vocabulary in the driver and in every worker that tokenizes:
    the plan is kept in the cache folder, and what is loaded is what planning gives (a damaged file is planned again)."""
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    path = ROOT / "tokenizer" / "demo.json"
    info = tokenize.load_tokenizer_info(path, TokenizeConfig(tokenizer=str(path), seq_len=512))
    want = plan_fast_encoder(json.loads(path.read_bytes()))
    assert tokenize._stored_plan(info) == want
    [stored] = (tmp_path / "tokens").glob(f"plan-*{info.fingerprint[:32]}*.json")
    with monkeypatch.context() as m:  # loaded, not planned
        m.setattr(tokenize, "plan_fast_encoder", lambda data: pytest.fail("planned again"))
        assert tokenize._stored_plan(info) == want
    stored.write_text('{"pattern": ')
    assert tokenize._stored_plan(info) == want
    data, _ = _with_unmade_token(_demo())  # a reason to stay on tokenizers is stored as well
    data["model"]["ignore_merges"] = True
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    reason = tokenize._stored_plan(tokenize.load_tokenizer_info(other, TokenizeConfig(tokenizer=str(other), seq_len=512)))
    assert isinstance(reason, str) and reason == plan_fast_encoder(data)
    assert tokenize._stored_plan(tokenize.load_tokenizer_info(other, TokenizeConfig(tokenizer=str(other), seq_len=512))) == reason


def test_planning_parses_the_tokenizer_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver loads the tokenizer's info for the pipeline's checks and again for the plan, then checks the
    fast path against tokenizers' ids: one parse of the file, not three (~0.15 CPU s each for a 32k vocabulary)."""
    import tokenizers

    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path))
    path = tmp_path / "tokenizer.json"  # a path no other test parsed in this process
    path.write_bytes((ROOT / "tokenizer" / "demo.json").read_bytes())
    parses: list[str] = []

    class Counting:
        @staticmethod
        def from_str(text: str) -> Tokenizer:
            parses.append("from_str")
            return Tokenizer.from_str(text)

        @staticmethod
        def from_file(file: str) -> Tokenizer:
            parses.append("from_file")
            return Tokenizer.from_file(file)

    monkeypatch.setattr(tokenizers, "Tokenizer", Counting)
    config = TokenizeConfig(tokenizer=str(path), seq_len=512)
    first = tokenize.load_tokenizer_info(path, config)
    info = tokenize.with_engine(tokenize.load_tokenizer_info(path, config))
    assert info.engine == "tiktoken" and info.fingerprint == first.fingerprint  # the probe compared both engines' ids
    assert parses == ["from_str"]


def test_a_drivers_verdict_and_the_files_facts_are_kept_in_the_cache_for_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second driver of the same file (same sha256, same library versions) neither parses it nor probes
    the encoders: it reads what the first stored in the cache folder, and gets the same answer."""
    monkeypatch.setenv("DATAPIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tokenize.ENGINE_ENV)
    path = tmp_path / "demo.json"
    path.write_bytes((ROOT / "tokenizer" / "demo.json").read_bytes())  # a path no other test stored
    first = _info(path)
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "tokens").glob("*-v1-*.json")) == ["engine", "info"]

    def again(*args: object) -> None:
        raise AssertionError("parsed or probed again")

    tokenize._ENGINES.clear()
    monkeypatch.setattr(tokenize, "_parsed_info", again)
    monkeypatch.setattr(tokenize, "_engine_verdict", again)
    assert _info(path) == first
