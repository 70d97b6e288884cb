"""The `mistral` renderer: selection, loading and vLLM's Mistral-only request checks.

Prompt parity with vLLM is in tests/parity/test_mistral_parity.py (goldens from vLLM 0.33).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.audit.fingerprint import fingerprint
from render_service.exceptions import BadRequestError
from render_service.model.loader import ModelLoadError, load_model
from render_service.render.renderers.mistral import truncate_tool_call_ids
from render_service.settings import Settings
from tests.mistral_fixture import build_mistral_model


@pytest.fixture(scope="module")
def v13_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mistral_model(tmp_path_factory.mktemp("v13"), "v13")


def test_a_mistral_folder_loads_the_mistral_renderer(v13_dir: Path) -> None:
    settings = Settings(model=str(v13_dir)).validate()
    model = load_model(settings)
    assert model.renderer_mode == model.renderer.mode == "mistral"
    assert model.backend.name == "mistral-common" and model.chat_template is None
    assert model.encode("Hi", True)[0] == model.hf_tokenizer.bos_token_id
    values = fingerprint(settings, model)["values"]
    assert values["renderer"]["mode"] == "mistral"
    assert values["renderer"]["details"]["tokenizer_version"] == 13
    assert list(values["tokenizer_files"]) == ["tekken.json"]


def test_mistral_mode_without_a_mistral_tokenizer_fails_at_start(qwen3_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot load the Mistral tokenizer"):
        load_model(Settings(model=str(qwen3_model_dir), tokenizer_mode="mistral").validate())


def test_without_the_extra_the_start_error_names_it(v13_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mistral_common.protocol.instruct.validator", None)
    with pytest.raises(ModelLoadError, match=r"render-service\[mistral\]"):
        load_model(Settings(model=str(v13_dir)).validate())


def test_tool_call_ids_keep_their_last_nine_characters() -> None:
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0123456789", "type": "function"}]},
        {"role": "tool", "tool_call_id": "call_0123456789", "content": "x"},
        {"role": "tool", "tool_call_id": "short", "content": "y"},
    ]
    out = truncate_tool_call_ids(messages)
    assert out[0]["tool_calls"][0]["id"] == out[1]["tool_call_id"] == "123456789"
    assert out[2]["tool_call_id"] == "short"
    assert messages[0]["tool_calls"][0]["id"] == "call_0123456789"  # the request is not changed


def test_vllm_mistral_request_checks(v13_dir: Path) -> None:
    renderer = load_model(Settings(model=str(v13_dir)).validate()).renderer
    with pytest.raises(BadRequestError, match="chat_template is not supported for Mistral tokenizers"):
        renderer.check_request({"messages": [], "chat_template_kwargs": {}})
    with pytest.raises(BadRequestError, match="reasoning_effort=huge is not supported by Mistral models"):
        renderer.check_request({"messages": [], "reasoning_effort": "huge"})
    renderer.check_request({"messages": [], "reasoning_effort": "high"})


def test_the_fast_paths_give_mistral_commons_ids(v13_dir: Path) -> None:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from render_service.model.backends import SELF_TEST_CORPUS
    from render_service.model.mistral import MistralTokenizer

    tok = MistralTokenizer(v13_dir)
    for text in SELF_TEST_CORPUS:
        for bos in (False, True):
            assert tok.raw.encode(text, bos, False) == Tekkenizer.encode(tok.raw, text, bos, False)
            assert tok.raw.encode(text, bos, False) == Tekkenizer.encode(tok.raw, text, bos, False)  # cached
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for messages in (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SELF_TEST_CORPUS[10]}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yo", "reasoning": "hm"},
            {"role": "user", "content": "?"},
        ],
    ):
        request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
        assert tok.encode_chat(request) == tok.mistral.encode_chat_completion(request).tokens
        assert tok.encode_chat(request) == tok.mistral.encode_chat_completion(request).tokens  # warm


def test_tekken_text_encodes_with_fastokens_and_the_library_ids(v13_dir: Path) -> None:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from render_service.model.mistral import MistralTokenizer

    tok = MistralTokenizer(v13_dir)
    assert tok.encoder == "fastokens"
    texts = [
        "".join(chr(code) for code in range(32, 0x800)),  # every 1- and 2-byte UTF-8 character
        "naïve café 東京 🎉 [INST] [/INST] </s> " * 50,
        '{"name": "run_query", "arguments": {"sql": "SELECT 1", "limit": 10}}',
    ]
    for text in texts:
        ids = tok.raw.encode(text, False, False)
        assert ids == Tekkenizer.encode(tok.raw, text, False, False)
        assert min(ids) >= tok.raw.num_special_tokens  # never a filler id


def test_fastokens_is_not_used_when_it_differs_from_the_library(v13_dir: Path) -> None:
    from render_service.model.mistral import MistralTokenizer, tekken_fastokens

    raw = MistralTokenizer(v13_dir).raw
    shift = raw.num_special_tokens

    def library(text: str) -> list[int]:
        return [rank + shift for rank in raw._model.encode_ordinary(text)]

    ranks, pattern = raw._tekken_token2id_nospecial, raw._model._pat_str
    assert tekken_fastokens(ranks, pattern, shift, library) is not None
    assert tekken_fastokens(ranks, pattern, shift, lambda text: library(text)[::-1]) is None


def test_chat_request_is_from_openais_request(v13_dir: Path) -> None:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    from render_service.model.mistral import MistralTokenizer

    tok = MistralTokenizer(v13_dir)
    tools = [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}},
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yo", "reasoning": "hm"},
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "partial"},
    ]
    for continue_final in (False, True):
        for effort in (None, "high"):
            for _ in range(2):  # the second time the tools come from the cache
                ours = tok.chat_request(messages, tools, continue_final, effort)
                theirs = ChatCompletionRequest.from_openai(
                    messages=messages, tools=tools, continue_final_message=continue_final, reasoning_effort=effort
                )
                assert ours == theirs
    assert tok.chat_request(messages, None, False, None) == ChatCompletionRequest.from_openai(messages=messages)
    bad = [{"type": "function", "function": {"parameters": {}}}]  # no name: the library's error, never kept
    for _ in range(2):
        with pytest.raises(Exception) as ours_error:
            tok.chat_request(messages, bad, False, None)
        with pytest.raises(Exception) as theirs_error:
            ChatCompletionRequest.from_openai(messages=messages, tools=bad)
        assert str(ours_error.value) == str(theirs_error.value)


@pytest.mark.parametrize("version", ["v7", "v11", "v13"])
def test_the_cached_tools_block_is_the_librarys(version: str, tmp_path: Path) -> None:
    """The tools block goes before the first user message (v13) or the last (v7, v11); it is built
    once per tool list and reused, and each prompt equals mistral-common's."""
    from render_service.model.mistral import MistralTokenizer

    tok = MistralTokenizer(build_mistral_model(tmp_path / version, version))
    tools = [
        {"type": "function", "function": {"name": "f", "description": "é", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}, "strict": True}},
    ]
    chats = [
        [{"role": "user", "content": "one"}],
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ],
    ]
    for messages in chats:
        for tool_list in (tools, tools[:1], tools):
            request = tok.chat_request(messages, tool_list, False, None)
            assert tok.encode_chat(request) == tok.mistral.encode_chat_completion(request).tokens
    assert len(tok._tools_blocks) == 2  # one block per distinct list, however often it is sent


def test_the_conversation_is_skipped_only_when_parsing_it_cannot_fail(v13_dir: Path) -> None:
    """The pipeline skips vLLM's message parsing for this renderer only where that parsing could
    neither fail nor find media; anything else is parsed (and gives its own errors)."""
    import random

    from render_service.render.templating import build_conversation
    from tests.model.test_mistral_encoder import conversation

    renderer = load_model(Settings(model=str(v13_dir)).validate()).renderer
    rng = random.Random(3)
    skipped = 0
    for _ in range(400):
        messages, _, _ = conversation(rng, "v13")
        if renderer.conversation_unused(messages):
            skipped += 1
            build_conversation(messages, "string", None)  # never raises for these
    assert skipped > 100  # the rest have content parts (or a broken message), which are parsed
    for bad in (
        [{"role": "assistant", "content": None, "tool_calls": ["not an object"]}],
        [{"role": "assistant", "content": None, "tool_calls": [{"type": "custom", "function": {}}]}],
        [{"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    ):
        assert not renderer.conversation_unused(bad)
    for bad in ([{"role": "assistant", "content": None, "tool_calls": ["not an object"]}],):
        with pytest.raises(BadRequestError):
            build_conversation(bad, "string", None)
