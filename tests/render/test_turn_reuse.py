"""What a turn reuses from the previous turn of its conversation instead of reading its whole history
again: the messages' encoding and digests, the facts kept with the previous prompt (kinds of
message, user positions, tool-call count), the content-part checks of a validated history, the
prompt fingerprint's tool encoding, the response's id JSON. Each is compared with what reading the
whole history gives, and a changed earlier message or tool falls back to reading everything."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.agent_turns import conversation
from render_service.exceptions import RenderServiceError
from render_service.render import encoded_ids, history, pipeline, prefix, segments, templating
from render_service.render import pipeline as render
from tests.helpers import segment_cache_contexts

FLAGS: dict[str, Any] = {
    "served_model_name": ["tinyqwen3"],
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "enable_auto_tool_choice": True,
    "max_model_len": 32768,
}


@pytest.fixture(scope="module")
def contexts(qwen3_model_dir: Path) -> tuple[render.RenderContext, render.RenderContext]:
    """(segment cache on, off)."""
    return segment_cache_contexts(qwen3_model_dir, **FLAGS)


def _result(ctx: render.RenderContext, body: dict[str, Any]) -> Any:
    """The whole render result (request id fixed), or the error."""
    try:
        result = render.render_chat(ctx, copy.deepcopy(body), "fixed-id")
    except RenderServiceError as exc:
        return (exc.status_code, exc.body())
    return orjson.loads(orjson.dumps({**result, "token_ids": list(result["token_ids"])}))


# -- the whole result -------------------------------------------------------------------------


def test_every_turn_returns_what_reading_everything_returns(contexts) -> None:
    """Not just the ids: parse_context (its history tool-call count comes from the kept facts),
    sampling params, everything; each turn sent twice (the resend finds the same previous turn)."""
    cached, uncached = contexts
    incremental_before = cached.history.stats().incremental if cached.history else 0
    for body in conversation(turns=24, seed=11):
        for _ in range(2):
            assert _result(cached, body) == _result(uncached, body)
    assert cached.history is not None and cached.history.stats().incremental - incremental_before >= 20


# -- digests of the messages ------------------------------------------------------------------

_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "tool", "system"]),
        "content": st.one_of(st.none(), st.text(max_size=8), st.just([{"type": "text", "text": "x,]"}])),
    },
    optional={"tool_calls": st.lists(st.just({"id": "c", "function": {"name": "f", "arguments": "{}"}}), max_size=2)},
)


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=8))
def test_history_key_is_the_list_encoding_and_chains_turns(messages: list[dict[str, Any]]) -> None:
    key = prefix.history_key(messages)
    assert key is not None
    assert key.encoded == orjson.dumps(messages)
    reply = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    assert key.reply_index == reply
    earlier = prefix.history_key(messages[: max(reply, 0)])
    assert earlier is not None
    # The previous turn's request (the messages before the reply) is recorded under this turn's previous_key.
    assert key.previous_key == earlier.key
    assert key.previous_length == len(earlier.encoded) - 1 and key.extends(earlier.encoded)
    # The digests are those of the encodings: the history's without its closing bracket, and the whole list's.
    assert (
        key.previous_key == xxhash.xxh3_128(orjson.dumps(messages[: max(reply, 0)])[:-1], prefix._DIGEST_SEED).digest()
    )
    assert key.key == xxhash.xxh3_128(orjson.dumps(messages)[:-1], prefix._DIGEST_SEED).digest()


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=8), at=st.integers(0, 7), extra=st.booleans())
def test_history_key_extends_only_the_exact_history(messages: list[dict[str, Any]], at: int, extra: bool) -> None:
    """A record is found only for byte-identical history: one changed byte, one message more or one
    fewer, and `extends` says no (the lookup then renders from scratch)."""
    messages = [*messages, {"role": "assistant", "content": "reply"}]
    key = prefix.history_key(messages)
    assert key is not None
    history_messages = messages[:-1]
    exact = prefix.history_key(history_messages)
    assert exact is not None and key.extends(exact.encoded)
    changed = copy.deepcopy(history_messages)
    target = changed[at % len(changed)]
    target["content"] = (target["content"] if isinstance(target["content"], str) else "") + "!"
    other = prefix.history_key(changed[:-1] if extra and len(changed) > 1 else changed)
    assert other is not None and not key.extends(other.encoded)
    longer = prefix.history_key([*history_messages, {"role": "tool", "content": "x"}])
    assert longer is not None and not key.extends(longer.encoded)
    shorter = prefix.history_key(history_messages[:-1])
    assert shorter is not None and not key.extends(shorter.encoded)


def test_history_key_of_other_messages_differs() -> None:
    a = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    b = [{"role": "user", "content": "a "}, {"role": "assistant", "content": "b"}]
    ka, kb = prefix.history_key(a), prefix.history_key(b)
    assert ka is not None and kb is not None
    assert ka.key != kb.key and ka.previous_key != kb.previous_key
    # true and 1 are equal in Python, not in JSON (nor in a template): the bytes tell them apart
    one, true = (
        prefix.history_key([{"role": "user", "content": 1}]),
        prefix.history_key([{"role": "user", "content": True}]),
    )
    assert one is not None and true is not None and one.key != true.key
    assert prefix.history_key("not a list") is None
    assert prefix.history_key([{"role": "user", "content": "x"}, "not a dict"]) is None


# -- facts kept with the previous prompt ------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=10), cut=st.integers(0, 10))
def test_facts_from_kept_facts_equal_facts_read_whole(messages: list[dict[str, Any]], cut: int) -> None:
    cut = min(cut, len(messages))
    whole = history.history_facts(messages)
    assert history.history_facts(messages, history.history_facts(messages[:cut])) == whole
    assert whole.tool_calls == pipeline._history_tool_calls(messages)
    start = cut
    assert history.anchor_indices(messages, start, [i for i in whole.users if i < start]) == history.anchor_indices(
        messages, start
    )
    kept = history.history_facts(messages[:start])
    assert history._shape(messages, start, kept.kinds) == history._shape(messages, start)


def test_facts_of_more_messages_than_described_are_read_whole() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{}, {}]}]
    longer = history.history_facts([*messages, {"role": "user", "content": "b"}])
    assert history.history_facts(messages, longer) == history.history_facts(messages)


def test_a_changed_earlier_message_reads_the_history_again(contexts) -> None:
    """The kept facts and the skipped checks belong to byte-identical history only: one changed
    byte in an earlier message (here: it gains a tool call, so the tool-call count changes) finds
    no previous turn, and the result is what reading everything gives."""
    cached, uncached = contexts
    bodies = conversation(turns=6, seed=21)
    for body in bodies[:5]:
        _result(cached, body)
    changed = copy.deepcopy(bodies[5])
    first_reply = next(m for m in changed["messages"] if m["role"] == "assistant")
    first_reply["tool_calls"] = [*first_reply["tool_calls"], copy.deepcopy(first_reply["tool_calls"][0])]
    checks: list[prefix.PrefixCheck] = []
    result = render.render_chat(cached, copy.deepcopy(changed), "fixed-id", prefix_checks=checks)
    assert checks[0].status == prefix.UNKNOWN  # no record for that history
    assert (
        result["parse_context"]["history_tool_call_cnt"]
        == _result(uncached, changed)["parse_context"]["history_tool_call_cnt"]
    )
    assert _result(cached, changed) == _result(uncached, changed)


def test_an_invalid_part_in_a_changed_earlier_message_is_still_refused(contexts) -> None:
    """Content parts of a validated history are not checked again; a history that differs by a
    byte is a new history, checked whole: the same 400 as without the cache."""
    cached, uncached = contexts
    bodies = conversation(turns=4, seed=23)
    for body in bodies[:3]:
        assert not isinstance(_result(cached, body), tuple)
    broken = copy.deepcopy(bodies[3])
    broken["messages"][1]["content"] = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    error = _result(cached, broken)
    assert isinstance(error, tuple) and error[0] == 400
    assert error == _result(uncached, broken)


# -- tools ------------------------------------------------------------------------------------


def test_the_fingerprint_encoding_is_the_shared_lists_and_nothing_else() -> None:
    shared = templating.SharedTools()
    tools = conversation(turns=1)[0]["tools"]
    dumped = shared.get(copy.deepcopy(tools), pipeline.tool_dicts)
    assert dumped is not None
    assert shared.encoding(dumped) == orjson.dumps(pipeline.tool_dicts(tools))
    # A list of other dicts (same first dict, one changed after it) is encoded afresh.
    other = [dumped[0], {**dumped[1], "function": {**dumped[1]["function"], "description": "changed"}}, *dumped[2:]]
    assert shared.encoding(other) == orjson.dumps(other)
    assert shared.encoding(dumped[:1]) == orjson.dumps(dumped[:1])
    assert shared.encoding(None) == b"null" and shared.encoding([]) == b"[]"


def test_a_changed_tool_byte_renders_as_without_the_cache(contexts) -> None:
    cached, uncached = contexts
    bodies = conversation(turns=5, seed=25)
    for body in bodies[:4]:
        _result(cached, body)
    changed = copy.deepcopy(bodies[4])
    function = changed["tools"][-1]["function"]
    function["description"] = function["description"][:-1] + "!"
    checks: list[prefix.PrefixCheck] = []
    render.render_chat(cached, copy.deepcopy(changed), prefix_checks=checks)
    assert (checks[0].status, checks[0].cause) == (prefix.BREAKS, prefix.TEMPLATE_CHANGED)
    assert _result(cached, changed) == _result(uncached, changed)


def _tool_variants(tools: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], Any]]:
    """(tools, tool_choice): valid ones, ones validation coerces or refuses, named choices."""
    coerced = copy.deepcopy(tools)
    coerced[0]["function"]["strict"] = "true"
    missing_name = copy.deepcopy(tools)
    del missing_name[1]["function"]["name"]
    bad_type = copy.deepcopy(tools)
    bad_type[0]["type"] = "retrieval"
    first = tools[0]["function"]["name"]
    return [
        (tools, "auto"),
        (tools, {"type": "function", "function": {"name": first}}),
        (tools, {"type": "function", "function": {"name": "not_a_tool"}}),
        (tools, {"type": "function", "function": {"name": ""}}),
        (tools, "sometimes"),
        (coerced, "auto"),
        (missing_name, "auto"),
        (bad_type, "auto"),
    ]


def test_tools_validated_before_stand_in_by_name_with_the_same_outcome(contexts) -> None:
    """A tool list that passed validation unchanged is not validated again (its names stand in):
    every request answers as without the cache, sent twice (the second finds the list validated),
    errors included; a list validation would change or refuse is never remembered."""
    cached, uncached = contexts
    bodies = conversation(turns=4, seed=29)
    for body in bodies[:3]:
        _result(cached, body)
    for tools, choice in _tool_variants(bodies[3]["tools"]):
        body = {**copy.deepcopy(bodies[3]), "tools": tools, "tool_choice": choice}
        for _ in range(2):
            assert _result(cached, body) == _result(uncached, body), choice
    key = templating.SharedTools.key_of(bodies[3]["tools"])
    assert key is not None and templating.SHARED_TOOLS.validated_names(key) is not None
    for tools, _ in _tool_variants(bodies[3]["tools"])[5:]:
        changed_key = templating.SharedTools.key_of(tools)
        assert changed_key is not None and templating.SHARED_TOOLS.validated_names(changed_key) is None


_JSONISH = st.lists(st.sampled_from(['"null"', "null", ":", ",", "[", "]", "}", "{", "nul", "l", "x", '"a"']))


@settings(max_examples=500, deadline=None)
@given(parts=_JSONISH)
def test_null_literal_scan_equals_the_regex(parts: list[str]) -> None:
    key = "".join(parts).encode()
    assert templating._has_null_literal(key) == bool(re.search(rb"[:\[,]null[,\]}]", key))


# -- the response's id JSON -------------------------------------------------------------------


class _Record:
    def __init__(self, head_ids: int, ids_json: bytes, json_head: int) -> None:
        self.head_ids, self.ids_json, self.json_head = head_ids, ids_json, json_head


@settings(max_examples=300, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.integers(0, 30), st.lists(st.integers(0, 200_000), max_size=12), st.integers(0, 12)),
        min_size=1,
        max_size=6,
    )
)
def test_response_json_over_turns_equals_encoding_the_list(turns: list[tuple[int, list[int], int]]) -> None:
    """Each turn keeps a prefix of the previous turn's ids (all of its head when `keep` reaches it,
    the only case that copies the text), adds ids, and marks a head: the JSON written from the
    previous turn's text is `orjson.dumps` of the ids, and the head's byte count is right."""
    previous: _Record | None = None
    ids: list[int] = []
    for keep, added, head_after in turns:
        reused = min(keep, previous.head_ids if previous else 0)
        ids = [*ids[:reused], *added]
        head = min(reused + head_after, len(ids))
        encoded = segments.Encoded(list(ids), 0, head, reused_ids=reused)
        written, json_head = encoded_ids.with_json(encoded, previous)
        assert written.json == orjson.dumps(ids)
        if head:
            assert written.json[:json_head] == orjson.dumps(ids[:head])[:-1]
        else:
            assert json_head == 0
        previous = _Record(head, written.json, json_head)


def test_encode_prompt_into_encoded_ids_equals_a_list(contexts) -> None:
    cached, _ = contexts
    assert cached.segments is not None and cached.prefix_guard is not None
    bodies = conversation(turns=3, seed=27)
    for body in bodies:
        render.render_chat(cached, copy.deepcopy(body))
    record = next(reversed(cached.prefix_guard._records.values()))
    text = record.text + "<|im_start|>user\nmore<|im_end|>\n"
    as_list = cached.segments.encode_prompt(text, record)
    as_encoded = cached.segments.encode_prompt(text, record, encoded_ids.EncodedIds)
    assert type(as_encoded.ids) is encoded_ids.EncodedIds and type(as_list.ids) is list
    assert as_encoded == as_list or (list(as_encoded.ids), as_encoded.head_chars) == (as_list.ids, as_list.head_chars)
    assert list(as_encoded.ids) == cached.model.encode(text, False)


def test_a_turn_that_drops_earlier_thinking_still_copies_the_shared_ids(contexts) -> None:
    """Qwen3 drops the thinking of earlier replies at a new user message, so that turn's prompt
    leaves the previous one before its head: the ids up to the last added token both share are
    copied (segments.shared_mark), and the result is still what reading everything gives."""
    cached, uncached = contexts
    assert cached.segments is not None
    bodies = conversation(turns=12, seed=3, user_every=5)
    copied_on_breaks = 0
    for body in bodies:
        before = cached.segments.stats().reused_tokens
        checks: list[prefix.PrefixCheck] = []
        result = render.render_chat(cached, copy.deepcopy(body), "fixed-id", prefix_checks=checks)
        assert _result(uncached, body) == orjson.loads(orjson.dumps({**result, "token_ids": list(result["token_ids"])}))
        if checks and checks[0].status == prefix.BREAKS:
            assert checks[0].cause == prefix.THINKING_DROPPED
            copied = cached.segments.stats().reused_tokens - before
            assert 0 < copied <= (checks[0].shared_tokens or 0)
            copied_on_breaks += 1
    assert copied_on_breaks >= 2  # turns 6 and 11
