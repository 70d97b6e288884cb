"""The segment cache: segment-wise ids equal whole-prompt ids (property test over the fixtures'
tokenizers), it fails closed where they may not, and it stays within its bounds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from render_service.model.example import build_example_model
from render_service.render import segments


@pytest.fixture(scope="module")
def glm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinyglm"), "glm")


@pytest.fixture(scope="module", params=["qwen3", "deepseek", "glm"])
def model(request: pytest.FixtureRequest, loaded_models: Callable[[Path], Any]) -> Any:
    return loaded_models(request.getfixturevalue(f"{request.param}_model_dir"))


def _added(model: Any) -> list[str]:
    return [token.content for token in model.hf_tokenizer._tokenizer.get_added_tokens_decoder().values()]


# Text that stresses the cut points: whitespace runs, partial markers, marks that NFC composes, bytes.
_FRAGMENTS = st.sampled_from(
    ["", " ", "  ", "\n", "\n\n", "\t", "<", ">", "<|", "|>", "</", "<think", "im_", "e\u0301", "\u0301", "ﬁ", "😀"]
)
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@pytest.fixture(scope="module")
def built(model: Any) -> segments.SegmentEncoder:
    """`segments.build` once per tokenizer: its self-test is a pure function of the tokenizer and
    takes seconds for DeepSeek's 1,283 added tokens (it ran in each of the 150 examples)."""
    encoder, segmenter, why_not = segments.build(model.hf_tokenizer, model.encode, 1 << 20)
    assert encoder is not None and segmenter is not None, why_not
    return encoder


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_segment_ids_equal_whole_prompt_ids(model: Any, built: segments.SegmentEncoder, data: st.DataObject) -> None:
    # A fresh cache per example, configured as `build` configured it.
    encoder = segments.SegmentEncoder(built.segmenter, model.encode, built.max_bytes, built.max_entries)
    tokens = st.sampled_from(_added(model))
    pieces = data.draw(st.lists(st.one_of(tokens, _FRAGMENTS, _TEXT), max_size=14))
    text = "".join(pieces)
    whole = model.hf_tokenizer._tokenizer.encode(text, add_special_tokens=False).ids  # HF itself
    assert encoder.encode(text) == whole
    assert encoder.encode(text) == whole  # again, from the cache
    assert model.encode(text) == whole
    # A later prompt that starts with this one reuses its ids up to its last added token.
    first = encoder.encode_prompt(text)
    suffix = data.draw(st.lists(st.one_of(tokens, _FRAGMENTS, _TEXT), max_size=6))
    later = text + "".join(suffix)
    previous = _Previous(text[: first.head_chars], first.ids, first.head_ids)
    reused = encoder.encode_prompt(later, previous)
    assert reused.ids == model.hf_tokenizer._tokenizer.encode(later, add_special_tokens=False).ids


class _Previous:
    def __init__(self, head: str, ids: list[int], head_ids: int) -> None:
        self.head, self.ids, self.head_ids = head, ids, head_ids


def test_add_special_tokens_is_encoded_whole(qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]) -> None:
    model = loaded_models(qwen3_model_dir)
    encoder, _, _ = segments.build(model.hf_tokenizer, model.encode, 1 << 20)
    assert encoder is not None
    text = "<|im_start|>user\nhi<|im_end|>"
    assert encoder.encode(text, True) == model.encode(text, True)
    assert encoder.stats().hits + encoder.stats().misses == 0


def _word_tokenizer(pre_tokenizer: Any, added: AddedToken) -> Tokenizer:
    vocab = {"[UNK]": 0, "▁": 1, "a": 2, "▁a": 3, "b": 4, "▁b": 5}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁", "b")], unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.add_tokens([added])
    return tokenizer


def _encode_with(tokenizer: Tokenizer) -> segments.Encode:
    return lambda text, add_special: tokenizer.encode(text, add_special_tokens=add_special).ids


def test_fails_closed_on_tokens_that_strip_whitespace() -> None:
    tokenizer = _word_tokenizer(pre_tokenizers.Metaspace(), AddedToken("<m>", lstrip=True, normalized=False))
    encoder, segmenter, why_not = segments.build(tokenizer, _encode_with(tokenizer), 1 << 20)
    assert encoder is None and segmenter is None
    assert why_not is not None and "lstrip" in why_not


def test_fails_closed_when_the_self_test_differs() -> None:
    # Metaspace that prepends "▁" to the first piece only: each piece alone would get one.
    tokenizer = _word_tokenizer(
        pre_tokenizers.Metaspace(prepend_scheme="first"), AddedToken("<m>", normalized=False, special=True)
    )
    encoder, segmenter, why_not = segments.build(tokenizer, _encode_with(tokenizer), 1 << 20)
    assert encoder is None and segmenter is None
    assert why_not is not None and "differ" in why_not
    # ...where the same tokenizer prepending to every piece is cached.
    tokenizer = _word_tokenizer(
        pre_tokenizers.Metaspace(prepend_scheme="always"), AddedToken("<m>", normalized=False, special=True)
    )
    encoder, _, why_not = segments.build(tokenizer, _encode_with(tokenizer), 1 << 20)
    assert encoder is not None, why_not
    assert encoder.encode("a<m>b a") == tokenizer.encode("a<m>b a", add_special_tokens=False).ids


def test_disabled_by_a_zero_budget_keeps_the_segmenter(
    qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]
) -> None:
    model = loaded_models(qwen3_model_dir)
    encoder, segmenter, why_not = segments.build(model.hf_tokenizer, model.encode, 0)
    assert encoder is None and segmenter is not None and why_not is not None


def test_cache_is_bounded_by_entries_and_bytes(qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]) -> None:
    model = loaded_models(qwen3_model_dir)
    segmenter, _ = segments.segmenter_for(model.hf_tokenizer)
    assert segmenter is not None
    by_entries = segments.SegmentEncoder(segmenter, model.encode, max_bytes=1 << 30, max_entries=8)
    by_bytes = segments.SegmentEncoder(segmenter, model.encode, max_bytes=40_000)
    texts = [f"<|im_start|>user\nmessage number {i} {'word ' * i}<|im_end|>" for i in range(60)]
    for encoder in (by_entries, by_bytes):
        for text in texts:
            assert encoder.encode(text) == model.encode(text)
    assert by_entries.stats().entries == 8
    stats = by_bytes.stats()
    assert 0 < stats.bytes <= 40_000 and stats.entries < 60
    # The most recent pieces are the ones kept: encoding the last text again only hits.
    before = by_bytes.stats().misses
    by_bytes.encode(texts[-1])
    assert by_bytes.stats().misses == before


def test_nested_added_tokens_disable_prefix_reuse() -> None:
    assert segments.Segmenter({"<a>": 1, "<a><b>": 2}).nested
    assert not segments.Segmenter({"<a>": 1, "<b>": 2}).nested
    # leftmost-longest, as tokenizers matches
    assert segments.Segmenter({"<a>": 1, "<a><b>": 2}).split("x<a><b>y<a>") == ["x", "<a><b>", "y", "<a>", ""]


def test_golden_prompts_encode_identically(qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]) -> None:
    """Every recorded parity prompt's ids, through the cache (twice) and whole."""
    model = loaded_models(qwen3_model_dir)
    encoder, _, _ = segments.build(model.hf_tokenizer, model.encode, 1 << 20)
    assert encoder is not None
    golden = Path(__file__).resolve().parents[1] / "parity" / "golden"
    checked = 0
    for path in sorted(golden.glob("*.json"))[:400]:
        data = json.loads(path.read_text())
        response = data.get("response") if isinstance(data, dict) else None
        ids = response.get("token_ids") if isinstance(response, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            continue
        text = model.hf_tokenizer.decode(ids)
        if model.encode(text) != ids:  # not a text prompt (or not this tokenizer's): skip
            continue
        assert encoder.encode(text) == ids
        assert encoder.encode(text) == ids
        checked += 1
    assert checked > 0
