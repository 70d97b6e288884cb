"""Bad derender bodies for the derender validation goldens (tests/api/golden/derender_schema.json).

For each derender route and member of its `batch | stream` union: every field of the request
table and of the tables it nests (generate_response / generate_chunk, their choices, logprobs,
usage, metrics, stream_state), set in a valid base body to values of the wrong type, lax-coerced
values and values past the bounds; pairs of bad fields in reverse declaration order; and crafted
bodies (no `stream`, a non-object body, both members failing, model validators). Recorded from
vLLM 0.33 by `python -m tests.api.record_derender_schema`; compared by test_derender_schema.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from render_service.api import derender
from render_service.api.schema import After, Check, FieldType, ListOf, Model, Nullable
from tests.parity.schema_corpus import bad_values

GOLDEN = Path(__file__).resolve().parent / "golden" / "derender_schema.json"
SEED = 20261130
CHAT_PATH = "/v1/chat/completions/derender"
COMPLETION_PATH = "/v1/completions/derender"

HI = [{"role": "user", "content": "Hi"}]
PROMPT_IDS = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]
CHOICE = {"index": 0, "token_ids": [9707, 11, 1879, 0], "finish_reason": "stop"}
STREAM_CHOICE = {"index": 0, "token_ids": [9707, 11]}

# (path, member table, a valid base body): the parsers configuration needs a chat_request and
# prompt ids on chat routes.
MEMBERS: dict[str, tuple[str, Model, dict[str, Any]]] = {
    "chat": (
        CHAT_PATH,
        derender.DERENDER_CHAT_REQUEST,
        {
            "model": "tinyqwen3",
            "generate_response": {"request_id": "r", "choices": [CHOICE]},
            "prompt_token_ids": PROMPT_IDS,
            "chat_request": {"model": "tinyqwen3", "messages": HI},
        },
    ),
    "chat_stream": (
        CHAT_PATH,
        derender.DERENDER_CHAT_STREAM_REQUEST,
        {
            "stream": True,
            "model": "tinyqwen3",
            "generate_chunk": {"request_id": "r", "choices": [STREAM_CHOICE]},
            "stream_state": {"output_token_ids": [9707], "output_chunk_lens": [1]},
            "prompt_token_ids": PROMPT_IDS,
            "chat_request": {"model": "tinyqwen3", "messages": HI},
        },
    ),
    "completion": (
        COMPLETION_PATH,
        derender.DERENDER_COMPLETION_REQUEST,
        {"model": "tinyqwen3", "generate_responses": [{"request_id": "r", "choices": [CHOICE]}]},
    ),
    "completion_stream": (
        COMPLETION_PATH,
        derender.DERENDER_COMPLETION_STREAM_REQUEST,
        {
            "stream": True,
            "model": "tinyqwen3",
            "generate_chunk": {"request_id": "r", "choices": [STREAM_CHOICE]},
            "stream_state": {"prev_tokens": ["Hello"], "prefix_offset": 0, "read_offset": 1},
        },
    ),
}
# nested tables walked into, by field name (the chat/completion request tables are covered by the
# render goldens; only their top-level shape is varied here)
_NOT_WALKED = frozenset({"chat_request", "completion_request"})


def _unwrap(kind: FieldType) -> FieldType:
    while isinstance(kind, (Nullable, Check, After)):
        inner = kind.schema if isinstance(kind, Check) else kind.inner
        if not isinstance(inner, FieldType):
            break
        kind = inner
    return kind


def _set(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A deep copy of `body` with `value` at `path` (creating missing objects)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(body, list):
        out_list = list(body)
        out_list[int(head)] = _set(out_list[int(head)], rest, value)
        return out_list
    out = dict(body)
    out[head] = _set(out.get(head, {}), rest, value)
    return out


def _get(body: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        body = body[part] if isinstance(body, list) else body.get(part, {})
    return body


def _field_paths(table: Model, base: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[tuple, FieldType]]:
    """(path, type) for every field of `table` and of the tables below it that `base` reaches."""
    found: list[tuple[tuple, FieldType]] = []
    for spec in table.fields:
        path = (*prefix, spec.name)
        found.append((path, spec.type))
        if spec.name in _NOT_WALKED:
            continue
        inner = _unwrap(spec.type)
        if isinstance(inner, ListOf) and isinstance(_unwrap(inner.item), Model):
            items = _get(base, path)
            if not isinstance(items, list) or not items:
                continue  # no item to vary
            inner, path = _unwrap(inner.item), (*path, 0)
        if isinstance(inner, Model):
            found += _field_paths(inner, base, path)
    return found


def _sample(values: list[Any], rng: random.Random, count: int) -> list[Any]:
    return values if len(values) <= count else rng.sample(values, count)


def crafted() -> list[tuple[str, Any]]:
    """Bodies that no field walk produces."""
    chat_base = MEMBERS["chat"][2]
    stream_base = MEMBERS["chat_stream"][2]
    cmpl_base = MEMBERS["completion"][2]
    cmpl_stream_base = MEMBERS["completion_stream"][2]
    return [
        (CHAT_PATH, {}),
        (CHAT_PATH, []),
        (CHAT_PATH, "x"),
        (CHAT_PATH, None),
        (CHAT_PATH, {"stream": True}),
        (CHAT_PATH, {"stream": "true"}),
        (CHAT_PATH, {"stream": 1, **{k: v for k, v in stream_base.items() if k != "stream"}}),
        (CHAT_PATH, {"stream": 0, **{k: v for k, v in chat_base.items() if k != "stream"}}),
        (CHAT_PATH, {"stream": None, **chat_base}),
        (CHAT_PATH, {**chat_base, "generate_chunk": stream_base["generate_chunk"]}),
        (CHAT_PATH, {**stream_base, "stream_state": {"output_chunk_lens": [2]}}),
        (CHAT_PATH, {**stream_base, "stream_state": {"prev_tokens": ["a"] * 1025}}),
        (CHAT_PATH, {**stream_base, "stream_state": {"logprob_context_token_ids": [1, 2, 3, 4, 5]}}),
        (CHAT_PATH, {**stream_base, "stream_state": {"output_chunk_lens": [0, -1], "role_sent": "x"}}),
        (CHAT_PATH, {**chat_base, "chat_request": {"messages": HI, "max_tokens": "a"}}),
        (CHAT_PATH, {**chat_base, "chat_request": {"messages": HI, "max_tokens": "a", "temperature": "b"}}),
        (CHAT_PATH, {**stream_base, "chat_request": {"messages": HI, "n": "x"}, "prompt_tokens": "y"}),
        (CHAT_PATH, {**chat_base, "generate_response": {"choices": [{"index": 0, "token_ids": [-1, 5]}]}}),
        (CHAT_PATH, {**chat_base, "generate_response": {"choices": [{"index": 0, "token_ids": [1, "a", -1]}]}}),
        (
            CHAT_PATH,
            {
                **chat_base,
                "generate_response": {
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": [1],
                            "logprobs": {"content": [{"token_id": "a", "top_logprobs": [{}, {"token_id": 1}]}]},
                        }
                    ],
                    "usage": {"prompt_tokens": "x", "prompt_tokens_details": {"multimodal_tokens": {"a": "b"}}},
                    "metrics": 5,
                    "prompt_logprobs": [{"a": 1}, None, {"007": {"logprob": "x"}}],
                    "mm_placeholders": {"image": [{"offset": -1}]},
                    "output_mode": "text",
                },
            },
        ),
        (
            CHAT_PATH,
            {
                **chat_base,
                "generate_response": {
                    "request_id": "r",
                    "choices": [{"index": "0", "token_ids": [9707, 2.0, "11", True], "stop_reason": 1.5}],
                    "prompt_logprobs": [None, {"5": {"logprob": "-1"}, "007": {"logprob": 2, "rank": "3"}}],
                },
                "prompt_tokens": "7",
            },
        ),
        (
            CHAT_PATH,
            {
                **stream_base,
                "generate_chunk": {
                    "choices": [{"index": 0, "weight_versions": [{}], "sampling_mask": [["a"]]}],
                    "usage": {},
                    "metrics": {"speculative_decoding": {}},
                },
            },
        ),
        (COMPLETION_PATH, {}),
        (COMPLETION_PATH, []),
        (COMPLETION_PATH, {"stream": True}),
        (COMPLETION_PATH, {"stream": "false"}),
        (COMPLETION_PATH, {**cmpl_base, "prompt_tokens": [1, 2]}),
        (COMPLETION_PATH, {**cmpl_base, "prompt_token_ids": [[1], None]}),
        (COMPLETION_PATH, {**cmpl_base, "prompt_tokens": [1, 2], "prompt_token_ids": [[1], None]}),
        (COMPLETION_PATH, {**cmpl_base, "prompt_tokens": ["x", 2]}),
        (COMPLETION_PATH, {**cmpl_base, "generate_responses": []}),
        (COMPLETION_PATH, {**cmpl_base, "generate_responses": [{}, {"choices": 5}]}),
        (COMPLETION_PATH, {**cmpl_base, "completion_request": {"prompt": "x", "max_tokens": "a"}}),
        (COMPLETION_PATH, {**cmpl_stream_base, "stream_state": {"prefix_offset": -1, "read_offset": "x"}}),
        (COMPLETION_PATH, {**cmpl_stream_base, "completion_request": 5, "prompt_tokens": [1]}),
    ]


def cases() -> list[dict[str, Any]]:
    """Every case as {"path", "body"}, in a fixed order."""
    rng = random.Random(SEED)
    out = [{"path": path, "body": body} for path, body in crafted()]
    for path, table, base in MEMBERS.values():
        fields = _field_paths(table, base)
        refused: dict[tuple, list[Any]] = {}
        for field_path, kind in fields:
            values = bad_values(_unwrap(kind))
            refused[field_path] = [v for v in values if isinstance(v, (list, dict)) or v == "x"]
            for value in _sample(values, rng, 8):
                out.append({"path": path, "body": _set(base, field_path, value)})
        top = [(p, k) for p, k in fields if len(p) == 1]
        for _ in range(15):
            first, second = sorted(rng.sample(range(len(top)), 2), reverse=True)
            (a, _), (b, _) = top[first], top[second]
            body = _set(base, a, rng.choice(refused[a]))
            out.append({"path": path, "body": _set(body, b, rng.choice(refused[b]))})
    return out


def request(case: dict[str, Any]) -> dict[str, Any]:
    return {"method": "POST", "path": case["path"], "headers": {}, "json": case["body"]}
