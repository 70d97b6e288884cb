"""SharedTools: an agent's unchanged tools come back as the same dicts, whose tojson text is found
by identity; anything orjson cannot tell apart from another value is never shared."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from render_service.render import pipeline, templating


def _tools(description: Any = "Look a word up.") -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": description,
                "parameters": {"type": "object", "properties": {"w": {"type": ["string", "null"], "maximum": 1.5}}},
            },
        }
    ]


def test_same_tools_share_dicts_and_tojson_text() -> None:
    shared = templating.SharedTools()
    first = shared.get(orjson.loads(orjson.dumps(_tools())), pipeline.tool_dicts)
    second = shared.get(orjson.loads(orjson.dumps(_tools())), pipeline.tool_dicts)
    assert first is not None and second is not None
    assert first is not second  # a new list each time ...
    assert first[0] is second[0]  # ... of the same dicts
    assert first == pipeline.tool_dicts(_tools())
    assert templating._hf_tojson(second[0]) == json.dumps(pipeline.tool_dicts(_tools())[0], ensure_ascii=False)


def test_other_tools_are_not_confused() -> None:
    shared = templating.SharedTools()
    first = shared.get(_tools("one"), pipeline.tool_dicts)
    second = shared.get(_tools("two"), pipeline.tool_dicts)
    assert first is not None and second is not None
    assert second[0]["function"]["description"] == "two"
    assert templating._hf_tojson(second[0]) == json.dumps(second[0], ensure_ascii=False)


def test_null_and_nan_are_never_shared() -> None:
    # orjson writes NaN as null, json.dumps as NaN: two such lists must not share one text.
    shared = templating.SharedTools()
    with_none = shared.get(_tools(None), pipeline.tool_dicts)
    with_nan = shared.get(_tools(math.nan), pipeline.tool_dicts)
    assert with_none is not None and with_nan is not None
    assert with_none[0] is not shared.get(_tools(None), pipeline.tool_dicts)[0]  # type: ignore[index]
    assert "NaN" in templating._hf_tojson(with_nan[0])
    assert "null" in templating._hf_tojson(with_none[0])


def test_eviction_forgets_identities() -> None:
    shared = templating.SharedTools(max_entries=1)
    first = shared.get(_tools("one"), pipeline.tool_dicts)
    assert first is not None and id(first[0]) in templating._TOJSON_BY_ID
    shared.get(_tools("two"), pipeline.tool_dicts)
    assert id(first[0]) not in templating._TOJSON_BY_ID or templating._TOJSON_BY_ID[id(first[0])][0] is not first[0]
