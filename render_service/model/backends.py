"""The tokenizer backend behind one interface: HF `tokenizers`, or `fastokens` where proven identical.

`fastokens` encodes fresh text many times faster than HF `tokenizers` and keeps a segment
cache for chat traffic, but it is a re-implementation: at start-up it must give the same
ids as HF on a self-test corpus for this very tokenizer, or the service falls back to HF.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from typing import Any, Protocol

logger = logging.getLogger("render_service.model.backends")

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

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer  # tokenizers.Tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


class FastokensBackend:
    name = "fastokens"

    def __init__(self, tokenizer_json: str, segment_cache_bytes: int = 16 << 20) -> None:
        import fastokens

        self._tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)
        if segment_cache_bytes:
            self._tokenizer.enable_segment_cache(segment_cache_bytes)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


class TiktokenBackend:
    """fastokens over tiktoken-style ranks built from a byte-level BPE `tokenizer.json`.

    The same encoder, loaded from ranks instead of `tokenizer.json`, takes ~3x less memory.
    It does not apply the JSON's normalizer itself, so NFC is applied here; the start-up
    self-test decides whether the result is exactly HF's.
    """

    name = "fastokens-tiktoken"

    def __init__(
        self,
        ranks_file: str,
        pattern: str,
        special_tokens: dict[str, int],
        nfc: bool,
        segment_cache_bytes: int = 16 << 20,
    ) -> None:
        import fastokens

        self._tokenizer = fastokens.Tokenizer.from_tiktoken(ranks_file, pattern=pattern, special_tokens=special_tokens)
        if segment_cache_bytes:
            self._tokenizer.enable_segment_cache(segment_cache_bytes)
        self._nfc = nfc

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def tiktoken_equivalent(tokenizer_json: str, directory: str) -> TiktokenBackend | None:
    """A `TiktokenBackend` when the tokenizer is a plain byte-level BPE with a split regex."""
    import base64
    import json
    from pathlib import Path

    spec = json.loads(tokenizer_json)
    model = spec.get("model") or {}
    pre = spec.get("pre_tokenizer") or {}
    normalizer = spec.get("normalizer")
    if model.get("type") != "BPE" or (spec.get("post_processor") or {}).get("type") not in (None, "ByteLevel"):
        return None
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if (
        not steps
        or len(steps) != 2
        or steps[0].get("type") != "Split"
        or steps[1].get("type") != "ByteLevel"
        or "Regex" not in (steps[0].get("pattern") or {})
        or steps[1].get("use_regex")
    ):
        return None
    byte_of = {ch: byte for byte, ch in _bytes_to_unicode().items()}
    lines = []
    try:
        for token, rank in model["vocab"].items():
            raw = bytes(byte_of[ch] for ch in token)
            lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    except KeyError:
        return None
    ranks_file = Path(directory) / "ranks.tiktoken"
    ranks_file.write_text("\n".join(lines) + "\n", encoding="ascii")
    specials = {tok["content"]: tok["id"] for tok in spec.get("added_tokens") or []}
    return TiktokenBackend(str(ranks_file), steps[0]["pattern"]["Regex"], specials, normalizer is not None)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-unicode table used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def self_test(
    candidate: TokenizerBackend, reference: TokenizerBackend, corpus: Sequence[str] = SELF_TEST_CORPUS
) -> str | None:
    """None if `candidate` encodes every text exactly as `reference`, else the first mismatch."""
    for text in corpus:
        for add_special in (False, True):
            expected = reference.encode(text, add_special)
            got = candidate.encode(text, add_special)
            if got != expected:
                return f"{text[:40]!r} (add_special_tokens={add_special})"
    return None


def choose_backend(
    hf_tokenizer: object, tokenizer_json: str | None, preferred: str = "auto", extra_corpus: Sequence[str] = ()
) -> TokenizerBackend:
    """The fastest backend that passes the self-test; HF `tokenizers` otherwise."""
    reference = HFBackend(hf_tokenizer)
    if preferred == "hf" or tokenizer_json is None:
        return reference
    import tempfile

    corpus = (*SELF_TEST_CORPUS, *extra_corpus)
    with tempfile.TemporaryDirectory() as directory:
        builders = (lambda: tiktoken_equivalent(tokenizer_json, directory), lambda: FastokensBackend(tokenizer_json))
        for build in builders:
            try:
                candidate = build()
            except Exception as exc:  # unsupported normalizer, pre-tokenizer, ...
                logger.warning("fastokens cannot load this tokenizer (%s)", exc)
                continue
            if candidate is None:
                continue
            mismatch = self_test(candidate, reference, corpus)
            if mismatch is None:
                return candidate
            logger.warning("%s differs from HF tokenizers on %s; not used", candidate.name, mismatch)
    logger.warning("using HF tokenizers (slower): no faster backend matched it exactly")
    return reference
