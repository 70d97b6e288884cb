"""The tokenizer backend behind one interface: HF `tokenizers`, or `fastokens` where proven identical.

`fastokens` encodes fresh text many times faster than HF `tokenizers` and keeps a segment
cache for chat traffic, but it is a re-implementation: at start-up it must give the same
ids as HF on a self-test corpus for this very tokenizer, or the service falls back to HF.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

logger = logging.getLogger("render_service.tokenization")

# Exercises the pre-tokenizer regex, byte fallback, NFC, added tokens and long inputs.
SELF_TEST_CORPUS: tuple[str, ...] = (
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nand  double  spaces",
    "Numbers 1234567890 and 3.14159 and -42e10",
    "it's they're we've I'm you'll he'd",
    "emoji 😀🎉👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "中文字符和日本語のテキストと한국어",
    "Ünïcödé çömbïnïng e\u0301 a\u0308 NFC vs NFD",
    "Arabic مرحبا بالعالم and Hebrew שלום עולם",
    "code: def f(x):\n    return {'a': [1, 2, 3]}  # comment",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<think>\nreasoning\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "<|endoftext|><|im_end|><tool_response>x</tool_response>",
    "mixed <|im_start|> inline <think> tags</think> here",
    "\u00a0non-breaking\u2009thin\u200bzero-width\ufeffbom",
    "control \x00 \x01 \x7f chars",
    "very" * 200,
    " ".join(str(i) for i in range(300)),
    "The quick brown fox jumps over the lazy dog. " * 40,
    "Ｆｕｌｌｗｉｄｔｈ ｃｈａｒａｃｔｅｒｓ and ﬁ ligatures",
    "surrogate-free but rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥",
    "\n\n\n\n    \n\t\t\n",
    "a\u0300\u0301\u0302\u0303\u0304 stacked marks",
)


class TokenizerBackend(Protocol):
    name: str

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


class HFBackend:
    name = "hf-tokenizers"

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer  # tokenizers.Tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


class FastokensBackend:
    name = "fastokens"

    def __init__(self, tokenizer_json: str, segment_cache_bytes: int = 64 << 20) -> None:
        import fastokens

        self._tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)
        if segment_cache_bytes:
            self._tokenizer.enable_segment_cache(segment_cache_bytes)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def self_test(candidate: TokenizerBackend, reference: TokenizerBackend,
              corpus: Sequence[str] = SELF_TEST_CORPUS) -> str | None:
    """None if `candidate` encodes every text exactly as `reference`, else the first mismatch."""
    for text in corpus:
        for add_special in (False, True):
            expected = reference.encode(text, add_special)
            got = candidate.encode(text, add_special)
            if got != expected:
                return f"{text[:40]!r} (add_special_tokens={add_special})"
    return None


def choose_backend(hf_tokenizer: object, tokenizer_json: str | None, preferred: str = "auto",
                   extra_corpus: Sequence[str] = ()) -> TokenizerBackend:
    """The fastest backend that passes the self-test; HF `tokenizers` otherwise."""
    reference = HFBackend(hf_tokenizer)
    if preferred == "hf" or tokenizer_json is None:
        return reference
    try:
        candidate = FastokensBackend(tokenizer_json)
    except Exception as exc:  # unsupported normalizer, pre-tokenizer, ...
        logger.warning("fastokens cannot load this tokenizer (%s); using HF tokenizers", exc)
        return reference
    mismatch = self_test(candidate, reference, (*SELF_TEST_CORPUS, *extra_corpus))
    if mismatch is not None:
        logger.warning("fastokens differs from HF tokenizers on %s; using HF tokenizers", mismatch)
        return reference
    return candidate
