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
from render_service.render.encoded_ids import EncodedIds, as_fragment, with_json
from render_service.render.segments import Encoded
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


class _Record:
    """What `with_json` reads of the previous turn's record (prefix.PromptRecord)."""

    def __init__(self, head_ids: int, ids_json: bytes, json_head: int) -> None:
        self.head_ids, self.ids_json, self.json_head = head_ids, ids_json, json_head


def test_with_json_chains_turns() -> None:
    first = list(range(300, 310))
    ids, json_head = with_json(Encoded(first, 0, 4), None)
    assert ids.json == orjson.dumps(first) and ids.json[:json_head] == orjson.dumps(first[:4])[:-1]
    record = _Record(4, ids.json, json_head)
    second = [*first[:4], 7, 8, 151_643]
    ids, json_head = with_json(Encoded(list(second), 0, 6, reused_ids=4), record)
    assert ids.json == orjson.dumps(second) and ids.json[:json_head] == orjson.dumps(second[:6])[:-1]
    # no new added token: the head is the previous head
    ids, json_head = with_json(Encoded([*first[:4], 9], 0, 4, reused_ids=4), record)
    assert ids.json == orjson.dumps([*first[:4], 9]) and json_head == len(orjson.dumps(first[:4])) - 1
    # no head at all: nothing for the next turn
    assert with_json(Encoded([1, 2], 0, 0), None)[1] == 0


def test_with_json_writes_everything_when_the_copy_is_not_the_previous_head() -> None:
    """Fail closed: ids that were not copied from the previous head (another count, or a record
    without text) are written from the ids, never from the record's text."""
    ids = [5, 6, 7, 8]
    wrong = _Record(2, b"[999,999,999]", 7)
    for encoded, record in (
        (Encoded(list(ids), 0, 3, reused_ids=3), wrong),  # reused 3, the record's head is 2 ids
        (Encoded(list(ids), 0, 3, reused_ids=0), _Record(0, b"[999]", 4)),
        (Encoded(list(ids), 0, 3, reused_ids=2), _Record(2, b"[999,999]", 0)),  # no head text kept
    ):
        written, json_head = with_json(encoded, record)
        assert written.json == orjson.dumps(ids) and written.json[:json_head] == orjson.dumps(ids[:3])[:-1]
