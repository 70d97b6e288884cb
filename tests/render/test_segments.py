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
    previous = _Previous(text[: first.head_chars], first.ids, first.head_ids, first.marks)
    reused = encoder.encode_prompt(later, previous)
    assert reused.ids == model.hf_tokenizer._tokenizer.encode(later, add_special_tokens=False).ids


class _Previous:
    def __init__(self, head: str, ids: list[int], head_ids: int, marks: segments.Marks | None = None) -> None:
        self.head, self.ids, self.head_ids, self.marks = head, ids, head_ids, marks


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_prompt_that_shares_less_than_the_head_reuses_up_to_a_shared_mark(model: Any, data: st.DataObject) -> None:
    """A later prompt that leaves the earlier one before its head (another history) copies the ids
    up to the last added token both share; its ids are HF's, and so are those of every mark it keeps."""
    encoder, _, why_not = segments.build(model.hf_tokenizer, model.encode, 1 << 20)
    assert encoder is not None, why_not
    tokens = st.sampled_from(_added(model))
    pieces = data.draw(st.lists(st.one_of(tokens, _FRAGMENTS, _TEXT), min_size=1, max_size=14))
    text = "".join(pieces)
    first = encoder.encode_prompt(text)
    cut = data.draw(st.integers(0, len(text)))
    later = text[:cut] + "".join(data.draw(st.lists(st.one_of(tokens, _FRAGMENTS, _TEXT), max_size=6)))
    previous = _Previous(text[: first.head_chars], first.ids, first.head_ids, first.marks)
    encoded = encoder.encode_prompt(later, previous)

    def hf(part: str) -> list[int]:
        return model.hf_tokenizer._tokenizer.encode(part, add_special_tokens=False).ids

    assert encoded.ids == hf(later)
    count = segments.shared_mark(later, previous)
    assert first.marks is not None and encoded.marks is not None
    expected = first.marks.ids[count - 1] if count else 0
    if not later.startswith(previous.head):
        assert encoded.reused_ids == expected
    for chars, ids in zip(encoded.marks.chars, encoded.marks.ids, strict=True):
        assert later[chars - len(_ends_with(later[:chars], _added(model))) : chars] in _added(model)
        assert encoded.ids[:ids] == hf(later[:chars])
    assert (encoded.head_chars, encoded.head_ids) == (
        (encoded.marks.chars[-1], encoded.marks.ids[-1]) if encoded.marks.chars else (0, 0)
    )


def _ends_with(text: str, tokens: list[str]) -> str:
    """The longest added token `text` ends with ('' if none)."""
    return max((token for token in tokens if text.endswith(token)), key=len, default="")


def test_marks_that_are_not_the_prompts_fail_closed(
    qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]
) -> None:
    """Marks whose last entry is not the head (a record they do not belong to) copy nothing: the
    later prompt is encoded whole."""
    model = loaded_models(qwen3_model_dir)
    encoder, _, why_not = segments.build(model.hf_tokenizer, model.encode, 1 << 20)
    assert encoder is not None, why_not
    text = "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\n"
    first = encoder.encode_prompt(text)
    assert first.marks is not None and len(first.marks.chars) == 5
    later = text[: text.index("B")] + "C<|im_end|>\n"
    good = _Previous(text[: first.head_chars], first.ids, first.head_ids, first.marks)
    assert segments.shared_mark(later, good) == 3
    assert encoder.encode_prompt(later, good).reused_ids == first.marks.ids[2]
    shifted = segments.Marks(first.marks.chars[:-1], first.marks.ids[:-1])  # the head is not its last mark
    wrong_ids = segments.Marks(first.marks.chars, segments.array("q", [*first.marks.ids[:-1], first.head_ids + 1]))
    for marks in (shifted, wrong_ids, segments.Marks.empty(), None):
        previous = _Previous(text[: first.head_chars], first.ids, first.head_ids, marks)
        assert segments.shared_mark(later, previous) == 0
        encoded = encoder.encode_prompt(later, previous)
        assert encoded.reused_ids == 0 and encoded.ids == model.encode(later)
    # a record without ids (never kept) copies nothing either
    empty = _Previous(text[: first.head_chars], [], first.head_ids, first.marks)
    encoded = encoder.encode_prompt(later, empty)
    assert encoded.reused_ids == 0 and encoded.ids == model.encode(later)


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


# Tokens that share prefixes, nest and overlap: where a prefix tree's fallbacks and longest-first matter.
_TRICKY_TOKENS = (
    "<a>",
    "<a><b>",
    "<ab>",
    "<abc>",
    "a",
    "ab",
    "abcd",
    "bc",
    "<|",
    "<|x|>",
    "<|xy|>",
    "|>",
    "\u2581\u2581",
)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.sampled_from(_TRICKY_TOKENS), min_size=1, unique=True),
    pieces=st.lists(st.one_of(st.sampled_from(_TRICKY_TOKENS), _FRAGMENTS, _TEXT), max_size=14),
)
def test_the_prefix_tree_cuts_where_the_alternation_cuts(tokens: list[str], pieces: list[str]) -> None:
    """`trie_pattern` (what the segmenter compiles) splits every text exactly as the longest-first
    alternation of the tokens, the plain form it replaces."""
    import re

    text = "".join(pieces)
    tree = re.compile("(" + segments.trie_pattern(tokens) + ")")
    plain = re.compile("(" + segments.alternation_pattern(tokens) + ")")
    assert tree.split(text) == plain.split(text)


def test_long_added_tokens_and_deep_chains_still_cut_as_the_alternation() -> None:
    """A 2,000-character added token is one literal of the tree (no recursion per character); a
    chain of 3,000 tokens each one character longer than the last, too deep for the recursive
    tree, falls back to the alternation. Both cut as the alternation does; an empty token is
    ignored."""
    import re

    long_token = "<|" + "x" * 2000 + "|>"
    chain = ["y" * n for n in range(1, 3001)]
    for tokens in ([long_token, "<|x|>"], chain):
        segmenter = segments.Segmenter({token: i for i, token in enumerate(["", *tokens])})
        plain = re.compile("(" + segments.alternation_pattern(tokens) + ")")
        for text in (f"a{long_token}b<|x|>c<|xx", "z" + "y" * 3005 + "z" + "y" * 7):
            assert segmenter.split(text) == plain.split(text)
    assert segments.trie_pattern([long_token]) == re.escape(long_token)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_prefix_tree_cuts_like_the_alternation_on_each_tokenizer(model: Any, data: st.DataObject) -> None:
    """The same on the fixtures' own added tokens (DeepSeek's 1,237 among them)."""
    import re

    segmenter, _ = segments.segmenter_for(model.hf_tokenizer)
    assert segmenter is not None
    tokens = list(segmenter.token_ids)
    plain = re.compile("(" + segments.alternation_pattern(tokens) + ")")
    drawn = st.sampled_from(tokens)
    # Cut tokens too: their prefixes are where a prefix tree must fall back.
    partial = drawn.flatmap(lambda token: st.integers(1, len(token)).map(lambda end: token[:end]))
    pieces = data.draw(st.lists(st.one_of(drawn, partial, _FRAGMENTS, _TEXT), max_size=16))
    text = "".join(pieces)
    assert segmenter.split(text) == plain.split(text)


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
