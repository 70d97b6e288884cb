"""phi4_mini_json (`parsers/phi4_mini_json.py`): vLLM 0.33's batch from the first `functools[` to
the first `]` after it; content before the marker streams and stays content (a listed deliberate
batch difference), everything from the marker is held to the end of the stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import phi4_mini_json
from tests.parsers.families import json_checks, json_tools

CALL = '{"name": "get_weather", "arguments": {"city": "Paris é 😀", "n":3}}'
CALL_ARGS = '{"city": "Paris é 😀", "n": 3}'  # json.dumps of the loaded arguments
PARAMS = '{"name": "search", "parameters": {"q": "x"}}'
EOS = json_tools.eos("phi4_mini")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    folder = json_tools.build(tmp_path_factory.mktemp("phi4") / "m", "phi4_mini")
    return AutoTokenizer.from_pretrained(str(Path(folder)))


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("functools[" + CALL + ", " + PARAMS + "]", "", [["get_weather", CALL_ARGS], ["search", '{"q": "x"}']]),
        ("Sure. functools[" + CALL + "] done", "Sure. ", [["get_weather", CALL_ARGS]]),  # vLLM: content None
        ("\n\nfunctools[" + CALL + "]", "", [["get_weather", CALL_ARGS]]),  # blank content dropped
        ('functools[{"name": "f", "arguments": {"a": [1]}}]', "", []),  # cut at the first ]: no calls, no content
        ('x functools[{"nom": "f", "arguments": {}}]', 'x functools[{"nom": "f", "arguments": {}}]', []),
        ('functools[{"name": 3, "arguments": {}}]', 'functools[{"name": 3, "arguments": {}}]', []),
        ("functools[" + CALL, "functools[" + CALL, []),  # no ]: all content
        ("use functools.partial [x]", "use functools.partial [x]", []),
        ("functools", "functools", []),  # a possible marker at the end is content
    ],
)
def test_stream_accumulates_to_batch(tok: Any, text: str, content: str, calls: list[list[str]]) -> None:
    parser = json_checks.parser_for(tok, "phi4_mini_json")
    batch = json_checks.check_any_chunking(tok, parser, text, EOS)
    assert [c[:2] for c in batch["tool_calls"]] == calls
    assert (batch["content"] or "") == content


def test_resume_from_every_snapshot_with_a_long_call_held(tok: Any) -> None:
    value = "alpha beta é 😀 \\n " * 400
    text = "Looking. functools[" + json.dumps({"name": "search", "arguments": {"q": value}}) + "]"
    batch = json_checks.check_resume_and_bounds(tok, json_checks.parser_for(tok, "phi4_mini_json"), text, EOS)
    assert json.loads(batch["tool_calls"][0][1]) == {"q": value}
    assert batch["content"] == "Looking. "


def test_registered_without_request_adjustments() -> None:
    cls = parsers.tool_parser_class("phi4_mini_json")
    assert cls is phi4_mini_json.Phi4MiniJsonToolParser
    assert cls.supports_required_and_named and cls.structural_tag_model is None
    adjustment = parsers.adjust_request(None, "phi4_mini_json", parsers.RequestAdjustment(True, "auto", None))
    assert adjustment.skip_special_tokens is None
