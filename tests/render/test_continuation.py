"""Token-identical continuation over HTTP with the fixtures' Qwen3 template (thinking on): each turn's
prompt is the previous prompt + the ids the "engine" generated + the template's suffix, on this
replica or another one (Redis); altered handles are refused; with the option off nothing changes."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.render import continuation
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import chunk_body, metric, redis_server

FLAGS: dict[str, Any] = {
    "served_model_name": ["tinyqwen3"],
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "enable_auto_tool_choice": True,
}
SECRET = "continuation-test-key-" + "k" * 16
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"w": {"type": "string"}}},
        },
    }
]
IM_END, END_OF_TEXT = 151645, 151643

# What the model "generates" each turn (its own spacing, which the template would not reproduce),
# and what the client sends after it. Thinking everywhere: Qwen3 drops it from earlier turns.
TURNS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        '<think>\nThe user wants a definition; call lookup.\n</think>\n\n<tool_call>\n{"name": "lookup", '
        '"arguments": {"w": "prefix"}}\n</tool_call>',
        [{"role": "tool", "tool_call_id": "t1", "content": "prefix: a beginning"}],
    ),
    (
        "<think>\nThe tool answered.  Summarise it.\n</think>\n\nA prefix is a beginning.",
        [{"role": "user", "content": "And 'suffix'? Look up two words."}],
    ),
    (
        '<think>\nTwo calls this time.\n</think>\n\n<tool_call>\n{"name": "lookup", "arguments": {"w": "suffix"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "lookup", "arguments": {"w": "affix"}}\n</tool_call>',
        [
            {"role": "tool", "tool_call_id": "t2", "content": "suffix: an ending"},
            {"role": "tool", "tool_call_id": "t3", "content": "affix: either"},
        ],
    ),
    (
        "<think>\nBoth answered.\n</think>\n\nA suffix ends a word; an affix is either.",
        [{"role": "user", "content": "Thanks!"}],
    ),
]


def _suffix(added: list[dict[str, Any]]) -> str:
    """What Qwen3's template renders after an assistant message's `<|im_end|>` (written out by hand)."""
    text = "\n"
    for index, message in enumerate(added):
        if message["role"] == "tool":
            if index == 0 or added[index - 1]["role"] != "tool":
                text += "<|im_start|>user"
            text += f"\n<tool_response>\n{message['content']}\n</tool_response>"
            if index == len(added) - 1 or added[index + 1]["role"] != "tool":
                text += "<|im_end|>\n"
        else:
            text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def _settings(model_dir: Path, **extra: Any) -> Settings:
    return Settings(model=str(model_dir), **FLAGS, **extra).validate()


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(qwen3_model_dir, preserve_generated_tokens=True))) as client:
        yield client


def _tokenizer(client: TestClient) -> Any:
    return client.app.state.render.model.hf_tokenizer  # type: ignore[attr-defined]


def _first_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tinyqwen3",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Define 'prefix'."},
        ],
        "tools": TOOLS,
        continuation.REQUEST_FIELD: True,
        **extra,
    }


def _render(client: TestClient, body: dict[str, Any]) -> tuple[list[int], dict[str, Any], Any]:
    response = client.post("/v1/chat/completions/render", json=copy.deepcopy(body))
    assert response.status_code == 200, response.text
    data = response.json()
    return data["token_ids"], data.get(continuation.BODY_FIELD), response.headers.get(continuation.HEADER)


def _derender(client: TestClient, body: dict[str, Any], prompt: list[int], generated: list[int]) -> dict[str, Any]:
    request = {
        "generate_response": {
            "request_id": "generate-tokens-chatcmpl-t",
            "choices": [{"index": 0, "token_ids": generated, "finish_reason": "stop"}],
            "prompt_token_ids": prompt,
        },
        "chat_request": copy.deepcopy(body),
        "prompt_token_ids": prompt,
    }
    response = client.post("/v1/chat/completions/derender", json=request)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


def _sent_back(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as an OpenAI client appends it: the fields it holds, nulls dropped."""
    keep = ("role", "content", "reasoning", "tool_calls", continuation.MESSAGE_FIELD)
    return {k: v for k, v in message.items() if k in keep and v is not None}


def _conversation(
    render_client: TestClient, derender_client: TestClient | None = None, turns: int = len(TURNS), **extra: Any
) -> list[tuple[list[int], list[int], dict[str, Any] | None, list[dict[str, Any]]]]:
    """Play the conversation: (prompt, generated ids, continuation report, messages added after) per turn."""
    derender_client = derender_client or render_client
    tokenizer = _tokenizer(render_client)
    body = _first_body(**extra)
    played = []
    for output, added in TURNS[:turns]:
        prompt, report, _ = _render(render_client, body)
        generated = [*tokenizer.encode(output, add_special_tokens=False), IM_END]
        message = _derender(derender_client, body, prompt, generated)
        assert continuation.MESSAGE_FIELD in message
        played.append((prompt, generated, report, added))
        body = copy.deepcopy(body)
        body["messages"] += [_sent_back(message), *copy.deepcopy(added)]
    prompt, report, _ = _render(render_client, body)
    played.append((prompt, [], report, []))
    return played


def _assert_token_identical(client: TestClient, played: list[Any]) -> None:
    tokenizer = _tokenizer(client)
    for (prompt, generated, _, added), (next_prompt, _, report, _) in itertools.pairwise(played):
        expected = prompt + generated + tokenizer.encode(_suffix(added), add_special_tokens=False)
        assert next_prompt == expected
        assert report == {
            "prefix_extends": True,
            "shared_tokens": len(prompt) + len(generated),
            "spliced_turns": report["spliced_turns"],
            "reason": None,
        }
    assert [report["spliced_turns"] for _, _, report, _ in played[1:]] == list(range(1, len(played)))
    final = tokenizer.decode(played[-1][0])
    for output, _ in TURNS[: len(played) - 1]:  # every turn's thinking, as generated, is in the last prompt
        assert output.split("</think>")[0] in final


def test_turns_extend_prompt_plus_generated_ids_plus_suffix(client: TestClient) -> None:
    """Four turns with thinking, tool calls (one and two at a time) and user messages: each prompt
    is exactly the previous prompt + generated ids + the template's suffix. A re-render would not
    be: Qwen3 drops the earlier thinking once a user message follows."""
    played = _conversation(client)
    _assert_token_identical(client, played)
    # Each turn started from the previous continued prompt (this worker's memo); without it every
    # turn is rebuilt and proven from the handles alone (what another replica does): the same ids.
    memo = client.app.state.render.context.prompt_memo  # type: ignore[attr-defined]
    memo.clear()
    body = {**_first_body(), "messages": _messages_of(client, played[:-1])}
    assert _render(client, body)[:2] == played[-1][0:3:2]
    assert played[0][2] == {"prefix_extends": False, "shared_tokens": 0, "spliced_turns": 0, "reason": "first_turn"}
    # Without the option the same conversation re-renders: thinking of turns 1-2 is gone by turn 3.
    last_body = _first_body()
    last_body.pop(continuation.REQUEST_FIELD)
    ordinary = client.post(
        "/v1/chat/completions/render", json={**last_body, "messages": _messages_of(client, played)}
    ).json()["token_ids"]
    assert ordinary != played[-1][0]
    assert "The user wants a definition" not in _tokenizer(client).decode(ordinary)


def _messages_of(client: TestClient, played: list[Any]) -> list[dict[str, Any]]:
    """The final request's messages, rebuilt by playing the conversation's derenders again."""
    body = _first_body()
    tokenizer = _tokenizer(client)
    for (prompt, generated, _, added), (output, _) in zip(played, TURNS, strict=False):
        generated = [*tokenizer.encode(output, add_special_tokens=False), IM_END]
        body["messages"] += [_sent_back(_derender(client, body, prompt, generated)), *added]
    return body["messages"]


def test_thinking_off_and_a_reply_cut_by_length(client: TestClient) -> None:
    """enable_thinking false: the prompt ends in an empty think block that the template's history
    header lacks; the generation prompt is put back, and proven. A reply cut by length has no
    `<|im_end|>`: the suffix then starts with the template's own."""
    tokenizer = _tokenizer(client)
    body = _first_body(chat_template_kwargs={"enable_thinking": False})
    prompt, _, _ = _render(client, body)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    generated = tokenizer.encode("A prefix is", add_special_tokens=False)  # cut: no end token
    message = _derender(client, body, prompt, generated)
    added = [{"role": "user", "content": "Go on."}]
    body["messages"] += [_sent_back(message), *added]
    next_prompt, report, header = _render(client, body)
    suffix = tokenizer.encode("<|im_end|>" + _suffix(added) + "<think>\n\n</think>\n\n", add_special_tokens=False)
    assert next_prompt == prompt + generated + suffix
    assert report["prefix_extends"] is True
    assert header == f"prefix_extends=true; shared_tokens={len(prompt) + len(generated)}; spliced_turns=1"


def test_edited_or_unknown_replies_fall_back_to_the_ordinary_render(client: TestClient) -> None:
    played = _conversation(client, turns=2)
    messages = _messages_of(client, played[:2])
    ordinary_body = {**_first_body(), "messages": messages}
    ordinary_body.pop(continuation.REQUEST_FIELD)
    ordinary = client.post("/v1/chat/completions/render", json=ordinary_body).json()["token_ids"]

    edited = copy.deepcopy(messages)
    edited[-2]["content"] = "Something else."
    ids, report, _ = _render(client, {**_first_body(), "messages": edited})
    # The first reply is still spliced; the edited last one is not.
    assert (report["prefix_extends"], report["reason"], report["spliced_turns"]) == (False, "message_changed", 1)
    assert ids[: len(played[1][0])] == played[1][0]

    no_handle = copy.deepcopy(messages)
    for message in no_handle:
        message.pop(continuation.MESSAGE_FIELD, None)
    ids, report, _ = _render(client, {**_first_body(), "messages": no_handle})
    assert (ids, report["reason"], report["spliced_turns"]) == (ordinary, "no_handle", 0)

    before = metric(client.get("/metrics").text, "render_continuation_misses_total", cause="message_changed")
    assert before >= 1
    metrics = client.get("/metrics").text
    assert metric(metrics, "render_continuation_hits_total") > 0
    assert metric(metrics, "render_continuation_handles_issued_total") > 0
    assert metric(metrics, "render_continuation_renders_total", prefix_extends="false", reason="no_handle") >= 1


def test_a_tampered_handle_is_a_400(client: TestClient) -> None:
    played = _conversation(client, turns=1)
    messages = _messages_of(client, played[:1])
    handle = messages[2][continuation.MESSAGE_FIELD]
    prefix, key_id, token = handle.split(".")
    flipped = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    for bad in (f"{prefix}.{key_id}.{flipped}", f"{prefix}.{key_id}.!!", "not-a-handle", 12):
        altered = copy.deepcopy(messages)
        altered[2][continuation.MESSAGE_FIELD] = bad
        response = client.post("/v1/chat/completions/render", json={**_first_body(), "messages": altered})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert error["param"] == f"messages.2.{continuation.MESSAGE_FIELD}"


def test_another_replica_through_redis(qwen3_model_dir: Path, client: TestClient) -> None:
    """Derender on replica A, render on replica B (shared Redis and key): token-identical. Ids gone
    from Redis (expired, evicted) and from B's memory: B renders as vLLM would and says why. A
    handle signed under another key (another deployment) is not an error, only not used."""
    with redis_server() as redis, ExitStack() as stack:
        shared = {"preserve_generated_tokens": True, "redis_url": redis.url, "snapshot_key": SECRET}
        a = stack.enter_context(TestClient(create_app(_settings(qwen3_model_dir, **shared))))
        b = stack.enter_context(TestClient(create_app(_settings(qwen3_model_dir, **shared))))
        played = _conversation(b, derender_client=a, turns=3)
        _assert_token_identical(b, played)
        assert redis.client().keys("rs:gen:*")
        assert metric(a.get("/metrics").text, "render_continuation_handles_issued_total") == 3

        body = _first_body()  # a reply B never fetched, whose ids then leave Redis
        prompt, _, _ = _render(a, body)
        generated = [*_tokenizer(a).encode("<think>\nShort.\n</think>\n\nA beginning.", add_special_tokens=False)]
        body["messages"] += [_sent_back(_derender(a, body, prompt, [*generated, IM_END]))]
        body["messages"].append({"role": "user", "content": "More."})
        redis.client().flushall()
        _, report, _ = _render(b, body)
        assert (report["prefix_extends"], report["reason"]) == (False, "not_found")
        assert metric(b.get("/metrics").text, "render_continuation_misses_total", cause="not_found") == 1

        body = {**_first_body(), "messages": _messages_of(client, played[:1])}  # the module app's own key
        _, report, _ = _render(b, body)
        assert (report["prefix_extends"], report["reason"]) == (False, "foreign")


def test_streaming_derender_hands_out_the_handle_on_the_final_chunk(client: TestClient) -> None:
    tokenizer = _tokenizer(client)
    body = _first_body()
    prompt, _, _ = _render(client, body)
    output, added = TURNS[0]
    generated = [*tokenizer.encode(output, add_special_tokens=False), IM_END]
    base = {"chat_request": copy.deepcopy(body), "prompt_token_ids": prompt}
    state, content, reasoning, calls, handle = None, "", "", {}, None
    for start in range(0, len(generated), 5):
        piece = generated[start : start + 5]
        last = start + 5 >= len(generated)
        response = client.post(
            "/v1/chat/completions/derender", json=chunk_body(base, piece, "stop" if last else None, state)
        )
        assert response.status_code == 200, response.text
        data = response.json()
        state = data["stream_state"]
        delta = data["chunk"]["choices"][0]["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning") or ""
        for call in delta.get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"id": call["id"], "type": "function", "function": {}})
            for field in ("name", "arguments"):
                entry["function"][field] = entry["function"].get(field, "") + (call["function"].get(field) or "")
        assert (continuation.MESSAGE_FIELD in delta) == last
        handle = delta.get(continuation.MESSAGE_FIELD, handle)
    message = {"role": "assistant", "content": content, "reasoning": reasoning, "tool_calls": list(calls.values())}
    body["messages"] += [{**message, continuation.MESSAGE_FIELD: handle}, *added]
    next_prompt, report, _ = _render(client, body)
    assert report["prefix_extends"] is True
    assert next_prompt == prompt + generated + tokenizer.encode(_suffix(added), add_special_tokens=False)


def test_off_is_byte_identical(qwen3_model_dir: Path, client: TestClient) -> None:
    """Server option off: the request field and handles are ignored (as vLLM ignores extra fields),
    bodies and headers as before. Option on, request not asking: the same."""
    played = _conversation(client, turns=2)
    messages = _messages_of(client, played[:2])
    plain_messages = copy.deepcopy(messages)
    for message in plain_messages:
        message.pop(continuation.MESSAGE_FIELD, None)
    plain = {**_first_body(), "messages": plain_messages, "request_id": "fixed"}
    plain.pop(continuation.REQUEST_FIELD)
    asking = {**_first_body(), "messages": messages, "request_id": "fixed"}
    with TestClient(create_app(_settings(qwen3_model_dir))) as off:
        expected = off.post("/v1/chat/completions/render", json=plain)
        asked = off.post("/v1/chat/completions/render", json=asking)
        assert asked.content == expected.content
        assert continuation.HEADER.lower() not in {k.lower() for k in asked.headers}
        prompt = expected.json()["token_ids"]
        generated = [*_tokenizer(off).encode(TURNS[0][0], add_special_tokens=False), IM_END]
        message = _derender(off, _first_body(), prompt, generated)
        assert continuation.MESSAGE_FIELD not in message
    not_asked = client.post("/v1/chat/completions/render", json={**plain, "messages": messages})
    assert not_asked.content == expected.content
    message = _derender(client, plain, prompt, generated)
    assert continuation.MESSAGE_FIELD not in message


# -- the splice's proof, on templates written here -----------------------------------------------


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _template(after_reply: Any = None, twice: bool = False) -> Any:
    """A toy chat format: `[role]content[/]`, `[assistant]` as the generation prompt. `twice`: the
    template writes each reply twice; `after_reply(content)`: text it adds after a reply."""

    def render_text(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        text = ""
        for message in messages:
            content = message.get("content") or ""
            if message["role"] == "assistant":
                text += f"[assistant]{content * (2 if twice else 1)}[/]"
                text += after_reply(content) if after_reply else ""
            else:
                text += f"[{message['role']}]{content}[/]"
        return text + ("[assistant]" if generation_prompt else "")

    return render_text


def _toy_turns(render_text: Any) -> tuple[list[dict[str, Any]], continuation.Lookup, list[int], list[int]]:
    """Two turns of the toy format: messages, the lookup, the first prompt and generated ids."""
    first = [{"role": "user", "content": "hi"}]
    prompt = _chars(render_text(first, True))
    generated = _chars("<t>x</t>hello[/]")  # the model's own reply, with thinking and the closing
    messages = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    turn = continuation.Generated(len(prompt), continuation.ids_digest(prompt) or b"", generated)
    return messages, continuation.Lookup({1: turn}), prompt, generated


def _splice(render_text: Any, messages: list[dict[str, Any]], lookup: continuation.Lookup) -> Any:
    ordinary = _chars(render_text(messages, True))
    ids, result = continuation.splice(messages, lookup, ordinary, render_text, _chars, {})
    return ids, result, ordinary


def test_splice_proves_the_toy_format() -> None:
    render_text = _template()
    messages, lookup, prompt, generated = _toy_turns(render_text)
    ids, result, _ = _splice(render_text, messages, lookup)
    # The closing `[/]` is not an added token here, so it is rendered again after the generated ids.
    assert ids == prompt + generated + _chars("[/][user]more[/][assistant]")
    assert result == continuation.Continuation(True, len(prompt) + len(generated), 1)


@pytest.mark.parametrize(
    ("render_text", "reason"),
    [
        (_template(twice=True), continuation.UNPROVEN),  # the reply's text is not in one place
        (_template(after_reply=lambda content: f"({len(content)})"), continuation.UNPROVEN),  # suffix reads it
    ],
)
def test_splice_fails_closed_on_templates_it_cannot_prove(render_text: Any, reason: str) -> None:
    messages, lookup, _, _ = _toy_turns(render_text)
    ids, result, ordinary = _splice(render_text, messages, lookup)
    assert (ids, result.prefix_extends, result.reason) == (ordinary, False, reason)


def test_splice_refuses_a_prompt_the_engine_did_not_see() -> None:
    render_text = _template()
    messages, lookup, _, _ = _toy_turns(render_text)
    messages[0]["content"] = "hello"  # the history was edited since: the first prompt differs
    ids, result, ordinary = _splice(render_text, messages, lookup)
    assert (ids, result.reason, result.shared_tokens) == (ordinary, continuation.PROMPT_MISMATCH, 0)


def test_message_digest_is_of_what_the_client_sends_back() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "reasoning": "why",
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    digest = continuation.message_digest(message)
    same = {**message, "content": "", "tool_calls": [{"id": "b", "function": {"name": "f", "arguments": "{}"}}]}
    assert continuation.message_digest(same) == digest
    assert continuation.message_digest({**message, "reasoning_content": "why", "reasoning": None}) == digest
    for changed in ({"content": "x"}, {"reasoning": "how"}, {"tool_calls": []}):
        assert continuation.message_digest({**message, **changed}) != digest
