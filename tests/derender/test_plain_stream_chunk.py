"""`api.derender.plain_stream_chunk`, the per-token fast path of the derender request check, held
to the full check: whatever it accepts, the stream member's check accepts unchanged (no error,
no coercion); and it accepts the chunks a stream sends every token, so it is not dead code."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from render_service.api import derender as api
from render_service.api.derender import Vouched, plain_stream_chunk
from render_service.api.schema import INVALID

_ABSENT = object()
# Values of every JSON kind, plus the lax spellings the full check coerces (which the fast path
# must leave to it) and bounds' edges.
PALETTE: list[Any] = [
    _ABSENT,
    None,
    True,
    False,
    0,
    1,
    -1,
    3.0,
    1.5,
    "",
    "x",
    "3",
    "tokens",
    [],
    [1],
    [1, 2],
    [-1],
    ["a"],
    [True],
    [1.0],
    ["1"],
    [None],
    ["a"] * (api.PREV_TOKENS_LIMIT + 1),
    [1] * (api.LOGPROB_CONTEXT_LIMIT + 1),
    {},
    {"a": 1},
    [{"index": 0}],
]


def full_state() -> dict[str, Any]:
    return {
        "prev_tokens": ["a", "b"],
        "prefix_offset": 0,
        "read_offset": 2,
        "role_sent": True,
        "logprob_context_token_ids": [1, 2, 3, 4],
        "logprob_text_offset": 0,
        "output_token_ids": [5, 6, 7],
        "output_chunk_lens": [1, 2],
        "tools_streamed": False,
        "last_tool_call_ids": ["call_1"],
        "rs_sid": "ab" * 16,
        "rs_pos": 3,
        "rs_fp": "0" * 16,
    }


def full_body() -> dict[str, Any]:
    return {
        "stream": True,
        "model": "m",
        "generate_chunk": {
            "request_id": "r",
            "choices": [{"index": 0, "token_ids": [8], "finish_reason": None}],
            "output_mode": "tokens",
        },
        "stream_state": full_state(),
        "prompt_tokens": 5,
        "prompt_token_ids": [1, 2, 3],
        "chat_request": {"messages": [{"role": "user", "content": "hi"}], "model": "m"},
    }


def compact_body() -> dict[str, Any]:
    return {
        "stream": True,
        "model": "m",
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [8]}]},
        "stream_state": {"rs_sid": "ab" * 16, "rs_pos": 3, "rs_fp": "0" * 16},
    }


PATHS: list[tuple[str, ...]] = [
    ("stream",),
    ("model",),
    ("prompt_tokens",),
    ("prompt_token_ids",),
    ("chat_request",),
    ("generate_chunk",),
    ("generate_chunk", "request_id"),
    ("generate_chunk", "usage"),
    ("generate_chunk", "prompt_token_ids"),
    ("generate_chunk", "mm_placeholders"),
    ("generate_chunk", "metrics"),
    ("generate_chunk", "output_mode"),
    ("generate_chunk", "choices"),
    ("generate_chunk", "choices", 0),
    *(
        ("generate_chunk", "choices", 0, key)
        for key in (
            "index",
            "finish_reason",
            "stop_reason",
            "token_ids",
            "routed_experts",
            "sampling_mask",
            "weight_versions",
            "logprobs",
        )
    ),
    ("stream_state",),
    *(("stream_state", key) for key in full_state()),
]


def with_value(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any] | None:
    out = copy.deepcopy(body)
    target: Any = out
    for step in path[:-1]:
        try:
            target = target[step]
        except (KeyError, IndexError, TypeError):
            return None
    if not isinstance(target, (dict, list)) or (isinstance(target, list) and len(target) <= path[-1]):
        return None
    if value is _ABSENT:
        if isinstance(target, list):
            return None
        target.pop(path[-1], None)
    else:
        target[path[-1]] = copy.deepcopy(value)
    return out


def fitting(body: dict[str, Any], vouched: Vouched) -> dict[str, Any]:
    """`body` minus what the fast path leaves to the full check under `vouched`."""
    if vouched != Vouched.ECHO | Vouched.REQUEST:
        body.pop("prompt_token_ids", None)
        body.pop("chat_request", None)
    if Vouched.ECHO not in vouched:
        body["stream_state"].pop("output_token_ids", None)
        body["stream_state"].pop("output_chunk_lens", None)
    return body


def member_for(vouched: Vouched) -> api.Model:
    return api._VOUCHED_CHAT_STREAM.get(vouched, api.DERENDER_CHAT_STREAM_REQUEST)


def assert_full_check_agrees(body: dict[str, Any], vouched: Vouched) -> None:
    member = member_for(vouched)
    errors: list[Any] = []
    before = copy.deepcopy(body)
    result = member.check(body, api._member_loc(member), errors)
    assert errors == [] and result is not INVALID, (body, errors)
    assert result is body and body == before, "the full check coerced what the fast path accepted"


VOUCHES = [Vouched.NOTHING, Vouched.ECHO, Vouched.ECHO | Vouched.REQUEST]


@pytest.mark.parametrize("vouched", VOUCHES, ids=str)
def test_everyday_chunks_take_the_fast_path(vouched: Vouched) -> None:
    compact = compact_body()
    assert plain_stream_chunk(compact, vouched)
    assert_full_check_agrees(compact, vouched)
    full = full_body()
    assert plain_stream_chunk(full, vouched) is (vouched == Vouched.ECHO | Vouched.REQUEST)
    first = {**compact_body(), "stream_state": None}
    assert plain_stream_chunk(first, vouched)


@pytest.mark.parametrize("vouched", VOUCHES, ids=str)
@pytest.mark.parametrize("base", [full_body, compact_body], ids=["full", "compact"])
def test_whatever_the_fast_path_accepts_the_full_check_accepts_unchanged(base: Any, vouched: Vouched) -> None:
    accepted = refused = 0
    for path, value in itertools.product(PATHS, PALETTE):
        body = with_value(fitting(base(), vouched), path, value)
        if body is None:
            continue
        if plain_stream_chunk(body, vouched):
            accepted += 1
            assert_full_check_agrees(body, vouched)
        else:
            refused += 1
    assert accepted and refused


@pytest.mark.parametrize("vouched", VOUCHES, ids=str)
def test_pairs_of_changes(vouched: Vouched) -> None:
    """Two fields changed at once (a sample: the state's and the choice's fields crossed)."""
    state_paths = [p for p in PATHS if p[0] == "stream_state" and len(p) == 2]
    choice_paths = [p for p in PATHS if len(p) == 4]
    small = [None, True, 0, -1, 3.0, "3", [], [1], ["a"], {}]
    for first, second in itertools.product(state_paths, choice_paths):
        for a, b in itertools.product(small, small):
            body = with_value(fitting(full_body(), vouched), first, a)
            body = with_value(body, second, b) if body is not None else None
            if body is not None and plain_stream_chunk(body, vouched):
                assert_full_check_agrees(body, vouched)


def test_the_route_check_answers_as_before_for_what_the_fast_path_refuses() -> None:
    body = full_body()
    body["generate_chunk"]["choices"][0]["index"] = "0"  # lax: coerced by the full check
    assert not plain_stream_chunk(body, Vouched.ECHO | Vouched.REQUEST)
    assert api.validate_chat_derender(body, Vouched.ECHO | Vouched.REQUEST) is True
    assert body["generate_chunk"]["choices"][0]["index"] == 0
