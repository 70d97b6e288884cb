"""jamba (`parsers/jamba.py`): vLLM 0.33's batch (the first `<tool_calls>...</tool_calls>` region as
a JSON list, the content before the first `<tool_calls>` kept); content streams up to the marker,
the rest is held to the end of the stream. The render side keeps the special tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import parsers
from render_service.parsers import jamba
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.parsers.families import json_checks, json_tools

EOS = json_tools.eos("jamba")
CALL = '{"name": "get_weather", "arguments": {"city": "Paris é 😀", "n":3}}'
ARGS = '{"city": "Paris é 😀", "n": 3}'


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return json_tools.build(tmp_path_factory.mktemp("jamba") / "m", "jamba")


@pytest.fixture(scope="module")
def tok(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("<tool_calls>[" + CALL + ", " + CALL + "]</tool_calls>", "", [["get_weather", ARGS]] * 2),
        ("Sure. <tool_calls>[" + CALL + "]</tool_calls> dropped", "Sure. ", [["get_weather", ARGS]]),
        (" <tool_calls>[" + CALL + "]</tool_calls>", "", [["get_weather", ARGS]]),
        ("\n<tool_calls>[]</tool_calls>", "", []),  # an empty list: no calls, blank content dropped
        ("a <tool_calls>[" + CALL + "]", "a <tool_calls>[" + CALL + "]", []),  # never closed
        ('<tool_calls>[{"name": "f"}]</tool_calls>', '<tool_calls>[{"name": "f"}]</tool_calls>', []),
        ("<tool_calls>" + CALL + "</tool_calls>", "<tool_calls>" + CALL + "</tool_calls>", []),  # not a list
        ("text </tool_calls> only", "text </tool_calls> only", []),
    ],
)
def test_stream_accumulates_to_batch(tok: Any, text: str, content: str, calls: list[list[str]]) -> None:
    batch = json_checks.check_any_chunking(tok, json_checks.parser_for(tok, "jamba"), text, EOS)
    assert [c[:2] for c in batch["tool_calls"]] == calls
    assert (batch["content"] or "") == content


def test_resume_from_every_snapshot_with_a_long_call_held(tok: Any) -> None:
    value = "alpha beta é 😀 \\n " * 400
    text = 'Looking. <tool_calls>[{"name": "search", "arguments": {"q": "' + value + '"}}]</tool_calls>'
    batch = json_checks.check_resume_and_bounds(tok, json_checks.parser_for(tok, "jamba"), text, EOS)
    assert batch["content"] == "Looking. "
    assert batch["tool_calls"][0][0] == "search"


def test_needs_the_markers_and_keeps_special_tokens(tmp_path: Path) -> None:
    assert parsers.tool_parser_class("jamba") is jamba.JambaToolParser
    for choice, expected in (("auto", False), ("required", False), ("none", None)):
        adjustment = parsers.adjust_request(None, "jamba", parsers.RequestAdjustment(True, choice, None))
        assert adjustment.skip_special_tokens is expected, choice
    from transformers import AutoTokenizer

    no_markers = AutoTokenizer.from_pretrained(str(json_tools.build(tmp_path / "x", "xlam")))
    with pytest.raises(ValueError, match="tool calls start/end tokens"):
        parsers.get_parser(no_markers, None, "jamba", enable_auto_tools=True)


def test_render_keeps_special_tokens_in_the_generate_request(folder: Path) -> None:
    settings = Settings(
        model=str(folder), served_model_name=["tinyjamba"], tool_call_parser="jamba", enable_auto_tool_choice=True
    )
    body = {
        "model": "tinyjamba",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": json_checks.cases.TOOLS,
        "skip_special_tokens": True,
    }
    with TestClient(create_app(settings.validate())) as client:
        rendered = client.post("/v1/chat/completions/render", json=body).json()
        assert rendered["sampling_params"]["skip_special_tokens"] is False
        rendered = client.post("/v1/chat/completions/render", json={**body, "tool_choice": "none"}).json()
        assert rendered["sampling_params"].get("skip_special_tokens", True) is True  # the default is left out
