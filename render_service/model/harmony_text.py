"""fastokens for the text of Harmony (gpt-oss) messages, checked against the Harmony library.

Harmony's `o200k_harmony` encoding is `o200k_base` plus Harmony's special tokens. A message's
text content is encoded as plain text (special-token strings included, as ordinary text), which
is exactly `o200k_base`'s BPE over its ranks with o200k's split pattern: fastokens loads the same
ranks file and pattern and is several times faster than the library on text it has not seen.
The special tokens never come from this encoder: the renderer takes the framing from the library.

`harmony_fastokens` returns None (the caller keeps the library) when fastokens is missing, the
ranks file is not in $TIKTOKEN_ENCODINGS_BASE, fastokens does not take the pattern, or it encodes
any text of the self-test corpus differently from the library.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# o200k_base's split pattern, copied from tiktoken (`tiktoken_ext/openai_public.py`, `o200k_base`),
# the pattern Harmony's o200k_harmony encoding inherits; the self-test checks it against the library.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

RANKS_FILE = "o200k_base.tiktoken"

# What gpt-oss message text holds besides prose: Harmony's framing written as text (plain text
# inside content), tool-call JSON, channel names, contractions in both cases, long runs of one
# character, digits and whitespace (where split and merge bugs show), mixed scripts.
HARMONY_SELF_TEST_CORPUS: tuple[str, ...] = (
    "<|start|>assistant<|channel|>analysis<|message|>x<|end|><|call|><|return|><|constrain|>json",
    '{"path": "src/ingest/worker.py", "limit": 10, "nested": {"a": [1, 2.5, -3e10, null, true]}}',
    "commentary to=functions.read_file json",
    "IT'S THEY'RE WE'VE I'M YOU'LL HE'D it's It'S don't DON'T o'clock",
    "x" * 5000,
    "0123456789" * 300,
    " \n" * 700 + "\t" * 300 + "   \r\n\r\n  end  ",
    "```python\ndef f(x: int) -> int:\n    return x  # comment\n```\n\n\n",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces and \u200bzero width",
    "Ελληνικά, кириллица, देवनागरी, ไทย, 日本語のテキスト, 한국어, עברית, العربية",
    "emoji 🙂👍🏽🧑‍💻🏳️‍🌈 ZWJ sequences and 1️⃣ keycaps",
    "MiXeD CaSe WORDSwithCamelCase snake_case kebab-case ALLCAPS123abc",
)


@cache
def _load(ranks_file: str) -> Any:
    """The fastokens tokenizer of a ranks file, once per process (loading 200k ranks takes
    seconds; every renderer of the process shares it: it is read-only)."""
    import fastokens

    return fastokens.Tokenizer.from_tiktoken(ranks_file, pattern=O200K_PATTERN, special_tokens={})


def harmony_fastokens(library_encode: Callable[[str], list[int]]) -> Callable[[str], list[int]] | None:
    """fastokens over o200k_base's ranks, or None when it cannot load them or differs from
    `library_encode` (the library's plain-text encode) on the self-test corpora."""
    from render_service.model.backends import SELF_TEST_CORPUS

    if importlib.util.find_spec("fastokens") is None:
        return None
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    ranks_file = Path(base) / RANKS_FILE if base else None
    if ranks_file is None or not ranks_file.is_file():
        return None
    try:
        tokenizer = _load(str(ranks_file))
    except Exception as exc:  # a pattern or vocabulary fastokens does not take
        logger.warning("fastokens cannot load %s (%s); Harmony text encoded by the library", ranks_file, exc)
        return None

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode_ordinary(text).ids
        return ids

    for text in (*SELF_TEST_CORPUS, *HARMONY_SELF_TEST_CORPUS):
        try:
            same = encode(text) == library_encode(text)
        except Exception:  # any failure means: do not use it
            same = False
        if not same:
            logger.warning("fastokens differs from Harmony on %r; Harmony text encoded by the library", text[:40])
            return None
    return encode
