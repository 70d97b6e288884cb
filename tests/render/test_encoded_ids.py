"""A turn's response writes the ids it shares with the previous turn from that turn's JSON text:
byte for byte what encoding the list gives, on every turn of an agent conversation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.agent_turns import conversation
from render_service.render import pipeline as render
from render_service.render.encoded_ids import EncodedIds, as_fragment, extend_json
from render_service.server.responses import encode_json
from tests.helpers import segment_cache_contexts

FLAGS: dict[str, Any] = {
    "served_model_name": ["tinyqwen3"],
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "enable_auto_tool_choice": True,
}


@pytest.fixture(scope="module")
def contexts(qwen3_model_dir: Path) -> tuple[render.RenderContext, render.RenderContext]:
    return segment_cache_contexts(qwen3_model_dir, **FLAGS)


def test_agent_turns_encode_identically(contexts) -> None:
    cached, uncached = contexts
    written_from_text = 0
    for body in conversation(turns=22, seed=5):
        for _ in range(2):  # a resend finds the same previous turn
            result = render.render_chat(cached, copy.deepcopy(body))
            plain = render.render_chat(uncached, copy.deepcopy(body))
            ids = result["token_ids"]
            written_from_text += type(ids) is EncodedIds and ids.json is not None
            assert ids == plain["token_ids"]
            expected = orjson.dumps({**result, "token_ids": list(ids)})
            assert encode_json(result) == expected
    assert written_from_text == 44
    # the cache-off context never carries text
    assert type(render.render_chat(uncached, copy.deepcopy(body))["token_ids"]) is list


def test_a_changed_list_drops_its_text() -> None:
    ids = [5, 6, 7]
    for change in (
        lambda x: x.append(8),
        lambda x: x.extend([8]),
        lambda x: x.__setitem__(0, 9),
        lambda x: x.__delitem__(0),
        lambda x: x.insert(0, 1),
        lambda x: x.pop(),
        lambda x: x.remove(6),
        lambda x: x.clear(),
        lambda x: x.sort(reverse=True),
        lambda x: x.reverse(),
    ):
        encoded = EncodedIds(ids, orjson.dumps(ids))
        change(encoded)
        assert encoded.json is None
        assert orjson.dumps(as_fragment({"token_ids": encoded})) == orjson.dumps({"token_ids": list(encoded)})
    encoded = EncodedIds(ids, orjson.dumps(ids))
    encoded += [1]
    assert encoded.json is None


def test_extend_json_pieces() -> None:
    ids = list(range(300, 310))
    head = extend_json(b"", ids, 0, 4)
    assert extend_json(head, ids, 4) + b"]" == orjson.dumps(ids)
    assert extend_json(head, ids, 4, 4) == head
    assert extend_json(b"", ids, 0) + b"]" == orjson.dumps(ids)
