"""Incremental detokenization with vLLM 0.33's semantics, on the real Qwen3 vocabulary.

Parity with vLLM itself is checked by tests/parity/compare_parsers.py (every chunk's text
of thousands of streams). Here: the algorithm against a literal transcription of vLLM's code that
calls the transformers tokenizer methods directly, and the properties the service relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from render_service.derender import detokenize as dt

EOS = 151645  # <|im_end|>
EOT = 151643  # <|endoftext|>
THINK = 151667


@pytest.fixture(scope="module")
def tok(qwen3_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


@pytest.fixture(scope="module")
def prompt(tok) -> list[int]:
    return tok.encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")


# -- a literal transcription of vLLM's loop, through the transformers methods ------------------


def _vllm_detokenize_delta(tok, ids, prev_tokens, prefix_offset, read_offset, skip, spaces=True):
    """online_derenderer._detokenize_delta + detokenizer_utils.detokenize_incrementally,
    calling tokenizer.convert_ids_to_tokens / convert_tokens_to_string like vLLM does."""
    parts = []
    for tid in ids:
        if 0 <= tid < len(tok):
            new_tokens = tok.convert_ids_to_tokens([tid], skip_special_tokens=skip)
            new_tokens = [t if t is not None else "" for t in new_tokens]
        else:
            new_tokens = [""]
        count = len(prev_tokens) + len(new_tokens)
        start = min(prefix_offset, read_offset, len(prev_tokens))
        out = (prev_tokens[start:] if start else prev_tokens) + new_tokens
        prefix_text = tok.convert_tokens_to_string(out[prefix_offset - start : read_offset - start])
        new_text = tok.convert_tokens_to_string(out[prefix_offset - start :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            text = ""
        else:
            text = new_text[len(prefix_text) :]
            prefix_offset, read_offset = read_offset, count
        prev_tokens = (prev_tokens + new_tokens)[prefix_offset:]
        read_offset -= prefix_offset
        prefix_offset = 0
        parts.append(text)
    return "".join(parts), prev_tokens, prefix_offset, read_offset


TEXTS = [
    "Hello, world! The answer is 42.",
    "emoji 😀🎉👩‍👩‍👧‍👦 and flags 🇫🇷 then text",
    "中文字符和日本語のテキストと한국어",
    "tabs\tand\nnewlines\r\n\n  spaces ",
    "<think>\nreasoning é\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "<|im_start|>x<|im_end|><|endoftext|>",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [False, True])
def test_matches_vllm_transcription_token_by_token(tok, prompt, text: str, skip: bool) -> None:
    ids = tok.encode(text)
    state = dt.seed_state(tok, prompt, skip_special_tokens=skip)
    ref = (list(state.prev_tokens), state.prefix_offset, state.read_offset)
    for tid in ids:
        ours = dt.step(tok, state, tid, skip_special_tokens=skip)
        theirs, *ref_state = _vllm_detokenize_delta(tok, [tid], *ref, skip)
        ref = tuple(ref_state)
        assert ours == theirs
        assert (state.prev_tokens, state.prefix_offset, state.read_offset) == ref


def test_seed_uses_last_seven_prompt_ids(tok, prompt) -> None:
    tokens, prefix, read = dt.convert_prompt_ids_to_tokens(tok, prompt)
    assert len(tokens) == 7 == read
    assert prefix == 2
    assert tokens == tok.convert_ids_to_tokens(prompt[-7:])
    assert dt.seed_state(tok, [], skip_special_tokens=True) == dt.DetokState()
    assert dt.seed_state(tok, None, skip_special_tokens=True) == dt.DetokState()


def test_multibyte_split_across_chunks(tok, prompt) -> None:
    text = "a😀b中文👩‍👩‍👧c"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 2  # several byte-level pieces
    state = dt.seed_state(tok, prompt, skip_special_tokens=True)
    pieces = []
    max_window = 0
    for tid in ids:  # one token per chunk: partial characters are held back, never emitted
        piece, state = dt.detokenize_delta(tok, [tid], state)
        assert "\ufffd" not in piece
        pieces.append(piece)
        max_window = max(max_window, len(state.prev_tokens))
    assert "".join(pieces) == text
    assert any(p == "" for p in pieces)  # some token completed no character
    assert max_window <= 8


def test_out_of_vocab_id_decodes_to_nothing(tok) -> None:
    state = dt.DetokState()
    assert dt.step(tok, state, 151900) == ""  # inside the model's padded vocab, outside the tokenizer's
    assert dt.step(tok, state, tok.encode("hi")[0]) == "hi"


def test_skip_special_and_spaces(tok) -> None:
    ids = tok.encode("a<|im_end|>b")
    kept, _ = dt.detokenize_delta(tok, ids, dt.DetokState(), skip_special_tokens=False)
    skipped, _ = dt.detokenize_delta(tok, ids, dt.DetokState(), skip_special_tokens=True)
    assert kept == "a<|im_end|>b"
    assert skipped == "ab"
    # <think> is added but not special in Qwen3: it survives skip_special_tokens
    think, _ = dt.detokenize_delta(tok, [THINK], dt.DetokState(), skip_special_tokens=True)
    assert think == "<think>"
    assert dt.decode_params(None) == (True, True)
    assert dt.decode_params(False, False) == (False, False)
    assert dt.decode_params(True, False) == (True, True)  # the fast detokenizer forces spaces on
    assert dt.decode_params(True, False, preserve_special=True) == (False, False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=hs.lists(hs.sampled_from([*'ab \n<>{}"é😀中👩\u200d', "<think>", "<|im_end|>"]), max_size=40).map("".join),
    cuts=hs.lists(hs.integers(min_value=1, max_value=5), max_size=60),
    resume_at=hs.integers(min_value=0, max_value=60),
)
def test_random_chunking_matches_token_by_token(tok, prompt, text: str, cuts: list[int], resume_at: int) -> None:
    ids = tok.encode(text)
    one = dt.seed_state(tok, prompt, skip_special_tokens=False)
    expected = "".join(dt.step(tok, one, t, skip_special_tokens=False) for t in ids)
    state = dt.seed_state(tok, prompt, skip_special_tokens=False)
    out, i, k = [], 0, 0
    while i < len(ids):
        size = cuts[k % len(cuts)] if cuts else 1
        if k == resume_at:  # the state survives JSON on the way to another process
            state = dt.DetokState.from_dict(json.loads(json.dumps(state.to_dict())))
        piece, state = dt.detokenize_delta(tok, ids[i : i + size], state, skip_special_tokens=False)
        out.append(piece)
        i += size
        k += 1
    assert "".join(out) == expected
    assert state == one
    assert expected == tok.decode(ids)


def test_window_stays_bounded_on_long_output(tok, prompt) -> None:
    ids = tok.encode("Some text with emoji 😀 and 中文 words. " * 300)
    state = dt.seed_state(tok, prompt, skip_special_tokens=True)
    sizes = []
    for tid in ids:
        dt.step(tok, state, tid)
        sizes.append(len(json.dumps(state.to_dict(), ensure_ascii=False)))
    assert max(sizes) < 120
    assert state.prefix_offset == 0


def test_state_json_roundtrip_mid_character(tok) -> None:
    ids = tok.encode("x😀y")
    state = dt.DetokState()
    first = "".join(dt.step(tok, state, t) for t in ids[:2])  # stop inside the emoji
    blob = json.dumps(state.to_dict())
    resumed = dt.DetokState.from_dict(json.loads(blob))
    rest = "".join(dt.step(tok, resumed, t) for t in ids[2:])
    assert first + rest == "x😀y"
    with pytest.raises(ValueError):
        dt.DetokState.from_dict({**json.loads(blob), "v": 99})


# -- stop token and stop strings -------------------------------------------------------------------


def _drop(ids, fr, sr, **kw):
    return dt.drop_stop_token(ids, fr, sr, eos_token_id=EOS, model_eos_token_ids=frozenset({EOS, EOT}), **kw)


def test_drop_stop_token() -> None:
    assert _drop([1, 2, EOS], "stop", None) == ([1, 2], None)  # primary EOS: stop_reason stays None
    assert _drop([1, 2, EOT], "stop", None) == ([1, 2], EOT)  # another model EOS: reported
    assert _drop([1, 2, EOS], "length", None) == ([1, 2, EOS], None)
    assert _drop([1, 2, 7], "stop", 7) == ([1, 2], 7)
    assert _drop([1, 2, 7], "stop", 8) == ([1, 2, 7], 8)
    assert _drop([1, 2, 7], "stop", "STOP") == ([1, 2, 7], "STOP")
    assert _drop([1, 2, 9], "stop", None, params=dt.StopParams(stop_token_ids=(9,))) == ([1, 2], 9)
    assert _drop([1, 2, EOS], "stop", None, params=dt.StopParams(ignore_eos=True)) == ([1, 2, EOS], None)
    assert _drop([1, 2, EOS], "stop", None, params=dt.StopParams(include_stop_str_in_output=True)) == (
        [1, 2, EOS],
        None,
    )
    assert _drop([], "stop", None) == ([], None)


def test_check_stop_strings_prefers_earliest_end() -> None:
    assert dt.check_stop_strings("abcdef", 6, ["cde", "bc"], False) == ("bc", 1)
    assert dt.check_stop_strings("abcdef", 6, ["cd"], True) == ("cd", 4)
    assert dt.check_stop_strings("abcdef", 6, ["ef"], True) == ("ef", -1)
    assert dt.check_stop_strings("abcdef", 2, ["bc"], False) is None  # outside the new chars
    assert dt.check_stop_strings("abcdef", 0, ["a"], False) is None


def test_decode_output_stop_strings_and_min_tokens(tok, prompt) -> None:
    ids = [*tok.encode("Hello world. STOP here and more"), EOS]
    seed = dt.seed_state(tok, prompt, skip_special_tokens=True)
    kw = {"eos_token_id": EOS, "model_eos_token_ids": frozenset({EOS, EOT})}

    text, sr = dt.decode_output(tok, ids, "stop", None, seed, **kw)
    assert (text, sr) == ("Hello world. STOP here and more", None)
    text, sr = dt.decode_output(tok, ids, "stop", None, seed, params=dt.StopParams(stop=("STOP",)), **kw)
    assert (text, sr) == ("Hello world. ", "STOP")
    p = dt.StopParams(stop=("STOP",), include_stop_str_in_output=True)
    assert dt.decode_output(tok, ids, "stop", None, seed, params=p, **kw) == ("Hello world. STOP", "STOP")
    # a reported string stop_reason is the only stop string considered
    assert dt.decode_output(tok, ids, "stop", "world", seed, params=dt.StopParams(stop=("STOP",)), **kw) == (
        "Hello ",
        "world",
    )
    # an int stop_reason means no stop string applies
    assert dt.decode_output(tok, ids[:-1], "stop", 999, seed, params=dt.StopParams(stop=("STOP",)), **kw)[0] == (
        "Hello world. STOP here and more"
    )
    # min_tokens: a stop string ending inside the first min_tokens tokens does not count
    n_hello = len(tok.encode("Hello world"))
    p = dt.StopParams(stop=("world",), min_tokens=n_hello)
    assert dt.decode_output(tok, ids, "stop", None, seed, params=p, **kw) == ("Hello world. STOP here and more", None)
    p = dt.StopParams(stop=("world",), min_tokens=n_hello - 1)
    assert dt.decode_output(tok, ids, "stop", None, seed, params=p, **kw) == ("Hello ", "world")
    # length: nothing is cut
    assert (
        dt.decode_output(tok, ids, "length", None, seed, params=dt.StopParams(stop=("STOP",)), **kw)[0].endswith(
            "<|im_end|>"
        )
        is False
    )
    assert dt.StopParams.stop_strings("x") == ("x",)
    assert dt.StopParams.stop_strings(["a", "", "b"]) == ("a", "b")
    assert dt.StopParams.stop_strings(None) == ()


def test_raw_tokenizers_object_is_accepted(tok) -> None:
    raw = tok.backend_tokenizer
    ids = tok.encode("héllo 😀 <think>x</think>")
    a, _ = dt.detokenize_delta(raw, ids, dt.DetokState(), skip_special_tokens=False)
    b, _ = dt.detokenize_delta(tok, ids, dt.DetokState(), skip_special_tokens=False)
    assert a == b
