"""internlm (`parsers/internlm.py`): vLLM 0.33's batch (one call after `<|action_start|><|plugin|>`
up to `<|action_end|>`, the content before it kept); content streams up to the first
`<|action_start|>`, the rest (with that chunk's content) is held to the end of the stream. Where
vLLM's batch raises, ours answers the whole text as content (listed). The render side keeps the
special tokens for the parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import parsers
from render_service.parsers import internlm
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.parsers.families import json_checks, json_tools

EOS = json_tools.eos("internlm")
START = "<|action_start|><|plugin|>"
CALL = '{"name": "get_weather", "parameters": {"city": "Paris é 😀", "n":3}}'
ARGS = '{"city": "Paris é 😀", "n": 3}'


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return json_tools.build(tmp_path_factory.mktemp("internlm") / "m", "internlm")


@pytest.fixture(scope="module")
def tok(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (START + "\n" + CALL + "<|action_end|>", "", [["get_weather", ARGS]]),
        ("Checking. " + START + CALL + "<|action_end|> dropped", "Checking. ", [["get_weather", ARGS]]),
        ("\n\n" + START + CALL + "<|action_end|>", "", [["get_weather", ARGS]]),  # blank content dropped
        (START + '{"name": "f", "arguments": {"a": 1}}', "", [["f", '{"a": 1}']]),  # unclosed, loads
        (START + '{"name": "f"}<|action_end|>', "", [["f", "{}"]]),
        (
            "<|action_start|><|interpreter|>\nprint(1)<|action_end|>",
            "<|action_start|><|interpreter|>\nprint(1)<|action_end|>",
            [],
        ),
        # vLLM raises on these (an error response): ours answers the text as content
        (START + '{"name": "f", "parameters": {', START + '{"name": "f", "parameters": {', []),
        (START + '{"parameters": {}}<|action_end|>', START + '{"parameters": {}}<|action_end|>', []),
        (START + CALL + "<|action_end|>" + START + CALL, START + CALL + "<|action_end|>" + START + CALL, []),
        ("plain text", "plain text", []),
    ],
)
def test_stream_accumulates_to_batch(tok: Any, text: str, content: str, calls: list[list[str]]) -> None:
    batch = json_checks.check_any_chunking(tok, json_checks.parser_for(tok, "internlm"), text, EOS)
    assert [c[:2] for c in batch["tool_calls"]] == calls
    assert (batch["content"] or "") == content


def test_resume_from_every_snapshot_with_a_long_call_held(tok: Any) -> None:
    value = "alpha beta é 😀 \\n " * 400
    text = "Looking. " + START + '\n{"name": "search", "parameters": {"q": "' + value + '"}}<|action_end|>'
    batch = json_checks.check_resume_and_bounds(tok, json_checks.parser_for(tok, "internlm"), text, EOS)
    assert batch["content"] == "Looking. "
    assert batch["tool_calls"][0][0] == "search"


def test_adjust_request_keeps_special_tokens() -> None:
    assert parsers.tool_parser_class("internlm") is internlm.InternlmToolParser
    for choice, expected in (("auto", False), ("required", False), ("none", None)):
        adjustment = parsers.adjust_request(None, "internlm", parsers.RequestAdjustment(True, choice, None))
        assert adjustment.skip_special_tokens is expected, choice
    assert (
        parsers.adjust_request(None, "internlm", parsers.RequestAdjustment(False, None, None)).skip_special_tokens
        is None
    )


def test_render_keeps_special_tokens_in_the_generate_request(folder: Path) -> None:
    settings = Settings(
        model=str(folder), served_model_name=["tinyinternlm"], tool_call_parser="internlm", enable_auto_tool_choice=True
    )
    body = {
        "model": "tinyinternlm",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": json_checks.cases.TOOLS,
        "skip_special_tokens": True,
    }
    with TestClient(create_app(settings.validate())) as client:
        rendered = client.post("/v1/chat/completions/render", json=body).json()
        assert rendered["sampling_params"]["skip_special_tokens"] is False
        rendered = client.post("/v1/chat/completions/render", json={**body, "tool_choice": "none"}).json()
        assert rendered["sampling_params"].get("skip_special_tokens", True) is True  # the default is left out
