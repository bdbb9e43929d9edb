"""The GPT-2 split without its lookahead: the same pieces, found by a faster regex.

GPT-2's split (``GPT2_PATTERN``) ends in ``\\s+(?!\\S)|\\s+``: a run of whitespace followed by a
word is cut before its last character, which then starts the word's piece (``"a\\n\\n b"`` ->
``"a"``, ``"\\n\\n"``, ``" b"``). The lookahead sends tiktoken's whole split through fancy-regex's
backtracking VM, about 40% of its encoding time on the shared corpus. Without ``\\s+(?!\\S)|`` the
pattern runs on the plain ``regex`` crate, and gives the same pieces wherever no run of two or more
whitespace characters is followed by a non-space. So each such run gets a sentinel before its last
character: a special token to tiktoken, which splits the text at it before the regex runs, so the
run's head ends its slice (where ``\\s+`` takes it whole, as ``\\s+(?!\\S)`` did) and its last
character starts the next one (where every alternative matches as before: none looks back). The
sentinel's id is then removed. Only the whitespace alternatives could match across that cut, so
this holds for exactly this pattern; tests compare it with the lookahead pattern on the shared
corpus and every whitespace character.

``WHITESPACE`` is the Rust regex crate's ``\\s`` (Unicode White_Space), which tiktoken's regex uses.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# tokenizers' byte_level.rs: the split of ``pre_tokenizers.ByteLevel(use_regex=True)``.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_WITHOUT_LOOKAHEAD = GPT2_PATTERN.replace(r"\s+(?!\S)|", "")

# Unicode White_Space, as RE2 class items (RE2's own \s is ASCII only).
WHITESPACE = r"\t\n\x0b\x0c\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
WHITESPACE_CHARS = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
# A noncharacter: never in real text. A text that holds one anyway is caught by the count of sentinel
# ids (FastEncoder compares it with the number inserted) and encoded with the lookahead pattern.
SENTINEL = "\ufdd0"
# A run of 2+ whitespace characters and the non-space after it (consumed, and put back).
_RUN_BEFORE_WORD = f"([{WHITESPACE}]+)([{WHITESPACE}][^{WHITESPACE}])"


def mark_runs(text: pa.Array) -> pa.Array:
    """``text`` with ``SENTINEL`` before the last character of every whitespace run of two or more
    characters that a non-space follows: one RE2 pass over the batch (the run and the character
    after it are matched, and put back with the sentinel between)."""
    return pc.replace_substring_regex(text, _RUN_BEFORE_WORD, r"\1" + SENTINEL + r"\2")
