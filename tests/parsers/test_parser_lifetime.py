"""Per-tokenizer caches (`TokenizerInfo.of`, the parsers `get_parser` builds) live exactly as long as
their tokenizer: a process that loads many tokenizers (the test suite, a library user reloading a
model) does not keep every one it ever saw (a process-wide table by id once did, ~100 MB each)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models

from render_service import parsers
from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers import harmony


def test_parsers_are_shared_per_tokenizer_and_freed_with_it(qwen3_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_model_dir))
    parser = parsers.get_parser(tok, "qwen3", "hermes", enable_auto_tools=True)
    assert parser is not None
    # The same configuration on the same tokenizer: the same objects.
    assert parsers.get_parser(tok, "qwen3", "hermes", enable_auto_tools=True) is parser
    assert TokenizerInfo.of(tok) is TokenizerInfo.of(tok)
    other = parsers.get_parser(tok, "qwen3", "hermes", enable_auto_tools=True, thinking_enabled=False)
    assert other is not None and other is not parser
    # What the derender asks for the prompt uses the same cache.
    assert parsers.prompt_ends_reasoning(tok, "qwen3", [1, 2, 3], None) in (True, False, None)
    # A second tokenizer gets its own.
    tok2 = AutoTokenizer.from_pretrained(str(qwen3_model_dir))
    assert parsers.get_parser(tok2, "qwen3", "hermes", enable_auto_tools=True) is not parser

    refs = [weakref.ref(tok), weakref.ref(tok2), weakref.ref(parser), weakref.ref(TokenizerInfo.of(tok))]
    del tok, tok2, parser, other
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)


def test_harmony_parsers_are_kept_on_the_tokenizer() -> None:
    tok = _raw_tokenizer()
    info = TokenizerInfo.of(tok)
    key = ("harmony", "openai_gptoss", None, False)
    sentinel = object()
    info.parsers[key] = sentinel  # no o200k needed: the cache lookup is what is checked here
    assert harmony._cached(info, "openai_gptoss", None, False) is sentinel
    ref = weakref.ref(tok)
    del tok, info
    gc.collect()
    assert ref() is None


class _Slotted:
    """A tokenizer object that takes no attributes: `TokenizerInfo.of` keeps only a few of those."""

    __slots__ = ("__weakref__", "_tok")

    def __init__(self) -> None:
        self._tok = _raw_tokenizer()

    def __getattr__(self, name: str) -> Any:
        if name in ("id_to_token", "decoder", "get_added_tokens_decoder", "get_vocab_size"):
            return getattr(self._tok, name)
        raise AttributeError(name)


def test_tokenizers_without_attributes_are_cached_within_a_bound() -> None:
    made = [_Slotted() for _ in range(3 * TokenizerInfo._FALLBACK_MAX)]
    infos = [TokenizerInfo.of(tok) for tok in made]
    assert TokenizerInfo.of(made[-1]) is infos[-1]  # the most recent are hits
    assert len(TokenizerInfo._fallback) <= TokenizerInfo._FALLBACK_MAX
    refs = [weakref.ref(tok) for tok in made[: -TokenizerInfo._FALLBACK_MAX]]
    del made, infos
    gc.collect()
    assert all(ref() is None for ref in refs)


def _raw_tokenizer() -> Tokenizer:
    return Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
