"""The `mistral` reasoning and tool parsers on real mistral-common tokenizers (v7, v11, v13 fixtures).

Streams are fed token by token (and in other chunkings) with the parser state serialised to
JSON and loaded again between every two chunks, as another replica would; the assembled
message must equal the batch parse. End-to-end parity with vLLM is in
tests/parity/test_mistral_derender_parity.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.derender.detokenize import TokenizerInfo
from render_service.model.mistral import MistralTokenizer
from render_service.parsers import RequestOptions, tool_parser_class
from render_service.parsers.base import tool_ids
from render_service.parsers.chat import ChatParser
from render_service.parsers.mistral import forced_call_schema, reasoning_encoding
from render_service.parsers.registry import reasoning_parser_names, tool_parser_names
from tests.mistral_fixture import build_mistral_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MistralTokenizer]:
    root: Path = tmp_path_factory.mktemp("mistral")
    return {v: MistralTokenizer(build_mistral_model(root / v, v)) for v in ("v7", "v11", "v13")}


def _ids(tok: MistralTokenizer, segments: list[tuple[str, str]]) -> list[int]:
    vocab = tok.get_vocab()
    out: list[int] = []
    for kind, value in segments:
        out.extend([vocab[value]] if kind == "s" else tok.encode(value, add_special_tokens=False))
    return out


def _stream(
    parser: ChatParser, tok: MistralTokenizer, ids: list[int], size: int, opts: RequestOptions
) -> dict[str, Any]:
    """Feed `ids` in chunks of `size` (special tokens kept in the text), JSON round trip between chunks."""
    tool_id = tool_ids("req-1")
    st = parser.new_state([1, 3])
    reasoning, content, calls = "", "", {}
    for start in range(0, len(ids), size):
        part = ids[start : start + size]
        text = tok.convert_tokens_to_string(tok.convert_ids_to_tokens(part, skip_special_tokens=False))
        finished = start + size >= len(ids)
        st = parser.load_state(json.loads(json.dumps(st.to_obj())))
        delta, _ = parser.step(st, text, part, "stop" if finished else None, opts, tool_id)
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls:
            entry = calls.setdefault(call.index, {"name": "", "arguments": "", "ids": set()})
            entry["name"] += call.name or ""
            entry["arguments"] += call.arguments or ""
            if call.id:
                entry["ids"].add(call.id)
    return {"reasoning": reasoning or None, "content": content or None, "calls": calls}


def test_registered_under_vllm_names() -> None:
    assert "mistral" in reasoning_parser_names()
    assert "mistral" in tool_parser_names()


def test_reasoning_encoding_follows_the_tokenizer(tokenizers: dict[str, MistralTokenizer]) -> None:
    assert reasoning_encoding(TokenizerInfo.of(tokenizers["v13"])) == "special_token"
    assert reasoning_encoding(TokenizerInfo.of(tokenizers["v11"])) == "text"
    assert reasoning_encoding(TokenizerInfo.of(tokenizers["v7"])) == "none"


def test_skip_special_tokens_keeps_the_parser_markers(tokenizers: dict[str, MistralTokenizer]) -> None:
    tok = tokenizers["v13"]
    ids = _ids(
        tok,
        [
            ("s", "[INST]"),
            ("s", "[THINK]"),
            ("t", "hm"),
            ("s", "[/THINK]"),
            ("s", "[TOOL_CALLS]"),
            ("t", "f"),
            ("s", "[ARGS]"),
            ("t", "{}"),
        ],
    )
    kept = tok.convert_ids_to_tokens(ids, skip_special_tokens=True)
    assert "[INST]" not in kept and "[THINK]" in kept and "[ARGS]" in kept
    assert tok.convert_tokens_to_string(tok.convert_ids_to_tokens(ids)) == "[THINK]hm[/THINK][TOOL_CALLS]f[ARGS]{}"


V13_OUTPUTS = [
    [
        ("s", "[THINK]"),
        ("t", "Let me check the weather."),
        ("s", "[/THINK]"),
        ("s", "[TOOL_CALLS]"),
        ("t", "get_weather"),
        ("s", "[ARGS]"),
        ("t", '{"city": "Paris", "days": 3}'),
    ],
    [
        ("t", "Sure."),
        ("s", "[TOOL_CALLS]"),
        ("t", "get_weather"),
        ("s", "[ARGS]"),
        ("t", '{"city": "Oslo"}'),
        ("s", "[TOOL_CALLS]"),
        ("t", "get_weather"),
        ("s", "[ARGS]"),
        ("t", '{"city": "Rome", "days": 2}'),
    ],
    [("s", "[TOOL_CALLS]"), ("t", 'get_weather{"city": "Lima"}')],
    [("s", "[THINK]"), ("t", "Only thinking, no answer.")],
    [("t", "Plain answer with a { brace } and [brackets].")],
]


@pytest.mark.parametrize("segments", V13_OUTPUTS)
@pytest.mark.parametrize("size", [1, 2, 5])
def test_v13_stream_with_snapshots_matches_batch(
    tokenizers: dict[str, MistralTokenizer], segments: list[tuple[str, str]], size: int
) -> None:
    tok = tokenizers["v13"]
    parser = ChatParser(tok, "mistral", "mistral", enable_auto_tools=True)
    opts = RequestOptions(tool_choice="auto", has_tools=True, tools=TOOLS)
    ids = _ids(tok, segments)
    streamed = _stream(parser, tok, ids, size, opts)
    text = tok.convert_tokens_to_string(tok.convert_ids_to_tokens(ids))
    reasoning, content = parser.reasoning.extract(text) if parser.reasoning else (None, text)  # type: ignore[union-attr]
    assert parser.tool is not None
    called, calls, rest = parser.tool.extract_for_request(content or "", opts)
    assert streamed["reasoning"] == reasoning
    if called:
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed["calls"].values()] == [
            (c.name, json.loads(c.arguments)) for c in calls
        ]
        assert all(len(c["ids"]) == 1 for c in streamed["calls"].values())
    else:
        assert not streamed["calls"]
        assert (streamed["content"] or None) == (rest or None)


def test_v13_batch_values(tokenizers: dict[str, MistralTokenizer]) -> None:
    tool = tool_parser_class("mistral")(TokenizerInfo.of(tokenizers["v13"]))
    opts = RequestOptions(tool_choice="auto", has_tools=True, tools=TOOLS)
    called, calls, content = tool.extract_for_request('Hi[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} extra', opts)
    assert called and content == "Hi"
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    # An empty name is a call named "" (vLLM surfaces the malformed generation).
    called, calls, _ = tool.extract_for_request("[TOOL_CALLS][ARGS]{}", opts)
    assert called and [(c.name, c.arguments) for c in calls] == [("", "{}")]


def test_v7_legacy_batch(tokenizers: dict[str, MistralTokenizer]) -> None:
    tool = tool_parser_class("mistral")(TokenizerInfo.of(tokenizers["v7"]))
    opts = RequestOptions(tool_choice="auto", has_tools=True, tools=TOOLS)
    out = 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": "{}"}, 3] tail'
    called, calls, content = tool.extract_for_request(out, opts)
    assert called and content == "Sure. "
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}'), ("get_weather", "{}")]
    assert tool.extract_for_request("[TOOL_CALLS]not json", opts) == (False, [], "not json")
    none = RequestOptions(tool_choice="none", has_tools=True, tools=TOOLS)
    assert tool.extract_for_request(out, none) == (False, [], out)


@pytest.mark.parametrize("size", [1, 4])
def test_v7_legacy_stream_with_snapshots(tokenizers: dict[str, MistralTokenizer], size: int) -> None:
    tok = tokenizers["v7"]
    parser = ChatParser(tok, "mistral", "mistral", enable_auto_tools=True)
    opts = RequestOptions(tool_choice="auto", has_tools=True, tools=TOOLS)
    ids = _ids(
        tok,
        [("t", "Sure. "), ("s", "[TOOL_CALLS]"), ("t", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')],
    )
    streamed = _stream(parser, tok, ids, size, opts)
    assert streamed["reasoning"] is None and streamed["content"] == "Sure. "
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed["calls"].values()] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_forced_call_schema_only_without_a_grammar(tokenizers: dict[str, MistralTokenizer]) -> None:
    body = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    schema = forced_call_schema(body, tokenizers["v7"])
    assert schema is not None and schema["maxItems"] == 1
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert forced_call_schema(body, tokenizers["v13"]) is None  # v11+: vLLM's grammar branch
    assert forced_call_schema({**body, "tool_choice": "auto"}, tokenizers["v7"]) is None
    assert forced_call_schema({**body, "response_format": {"type": "structural_tag"}}, tokenizers["v7"]) is None
