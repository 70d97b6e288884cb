"""Derender, batch and streaming: streaming over any chunking equals batch, snapshots are an
optimisation only (replay is always correct), compact mode, retries and tampering."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import chunk_body, drive_stream, metric

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]
CHAT_REQUEST = {
    "model": "tinyqwen3",
    "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
    "tools": TOOLS,
}
OUTPUT_TEXT = (
    "<think>\nThe user wants weather. 天气 🌦️ data.\n</think>\n\nLet me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>'
)


def make_app(model_dir: Path, **overrides: Any):
    values = dict(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=16384,
    )
    values.update(overrides)
    return create_app(Settings(**values).validate())


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    with TestClient(make_app(qwen3_model_dir)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def case(client: TestClient) -> dict[str, Any]:
    rendered = client.post("/v1/chat/completions/render", json=CHAT_REQUEST).json()
    output = client.post("/tokenize", json={"prompt": OUTPUT_TEXT, "add_special_tokens": False}).json()["tokens"]
    base = {
        "model": "tinyqwen3",
        "chat_request": CHAT_REQUEST,
        "prompt_token_ids": rendered["token_ids"],
        "prompt_tokens": len(rendered["token_ids"]),
    }
    return {"base": base, "output": output, "prompt": rendered["token_ids"]}


def batch(client: TestClient, case: dict[str, Any]) -> dict[str, Any]:
    body = {
        **case["base"],
        "generate_response": {
            "request_id": "generate-tokens-chatcmpl-test",
            "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": None, "token_ids": case["output"]}],
        },
    }
    response = client.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(client: TestClient, case: dict[str, Any], lens: list[int]) -> dict[str, Any]:
    def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    return drive_stream(post, case["base"], case["output"], lens)


def test_batch_splits_reasoning_content_and_tool_calls(client: TestClient, case: dict[str, Any]) -> None:
    result = batch(client, case)
    choice = result["choices"][0]
    message = choice["message"]
    assert message["reasoning"] == "\nThe user wants weather. 天气 🌦️ data.\n"
    assert message["content"] == "\n\nLet me check.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert choice["finish_reason"] == "tool_calls"
    assert result["usage"]["completion_tokens"] == len(case["output"])
    ids = [c["id"] for c in message["tool_calls"]]
    assert ids == [c["id"] for c in batch(client, case)["choices"][0]["message"]["tool_calls"]]  # deterministic


def test_stream_one_token_per_chunk_equals_batch(client: TestClient, case: dict[str, Any]) -> None:
    expected = batch(client, case)["choices"][0]["message"]
    got = stream(client, case, [1] * len(case["output"]))
    assert got["reasoning"] == expected["reasoning"]
    assert got["content"] == expected["content"]
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]
    ]
    assert got["finish_reason"] == "tool_calls"
    state = got["state"]
    assert state["output_token_ids"] == case["output"] and state["tools_streamed"] is True
    assert state["last_tool_call_ids"] == [c["id"] for c in expected["tool_calls"]]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000))
def test_stream_any_chunking_equals_batch(client: TestClient, case: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    lens, left = [], len(case["output"])
    while left:
        lens.append(min(left, rng.randint(1, 9)))
        left -= lens[-1]
    expected = batch(client, case)["choices"][0]["message"]
    got = stream(client, case, lens)
    assert (got["reasoning"], got["content"]) == (expected["reasoning"], expected["content"])
    assert [(c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]
    ]


def test_snapshots_hit_and_replay_is_equivalent(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    """Half a stream on one app, the rest on another (no shared store): the second replays once."""
    lens = [1] * len(case["output"])
    with TestClient(make_app(qwen3_model_dir)) as first, TestClient(make_app(qwen3_model_dir)) as second:
        expected = stream(first, case, lens)
        half = len(lens) // 2

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            target = first if index < half else second
            return target.post("/v1/chat/completions/derender", json=body).json()

        got = drive_stream(post, case["base"], case["output"], lens)
        assert got["content"] == expected["content"] and got["reasoning"] == expected["reasoning"]
        assert got["tool_calls"] == expected["tool_calls"]
        text = second.get("/metrics").text
        assert metric(text, "render_stream_replays_total") == 1.0
        assert metric(text, "render_stream_replayed_tokens_total") == half
        assert metric(text, "render_snapshot_hits_total", tier="local") == len(lens) - half - 1


def test_vllm_state_without_our_keys_is_continued(client: TestClient, case: dict[str, Any]) -> None:
    """A state produced by vLLM (no rs_* keys) continues correctly, by replay."""
    lens = [3] * (len(case["output"]) // 3) + ([len(case["output"]) % 3] if len(case["output"]) % 3 else [])
    expected = stream(client, case, lens)

    def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
        if body["stream_state"] is not None:
            body["stream_state"] = {k: v for k, v in body["stream_state"].items() if not k.startswith("rs_")}
        return client.post("/v1/chat/completions/derender", json=body).json()

    got = drive_stream(post, case["base"], case["output"], lens)
    assert (got["content"], got["reasoning"], got["tool_calls"]) == (
        expected["content"],
        expected["reasoning"],
        expected["tool_calls"],
    )


def test_retried_chunk_gives_the_same_answer(client: TestClient, case: dict[str, Any]) -> None:
    state = None
    for ids in ([case["output"][0]], case["output"][1:5]):
        body = chunk_body(case["base"], ids, None, state)
        first = client.post("/v1/chat/completions/derender", json=body).json()
        again = client.post("/v1/chat/completions/derender", json=body).json()
        for response in (first, again):
            response["chunk"].pop("created")
        assert first["chunk"] == again["chunk"]
        assert {k: v for k, v in first["stream_state"].items() if k != "rs_sid"} == {
            k: v for k, v in again["stream_state"].items() if k != "rs_sid"
        }
        state = first["stream_state"]


def test_tampered_snapshot_is_rejected_and_replayed(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        store = app_client.app.state.render.store
        state = None
        output = case["output"]
        for index in range(6):
            body = chunk_body(case["base"], [output[index]], None, state)
            state = app_client.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
        for key in store.local.keys():
            blob = bytearray(store.local.get(key))
            blob[-1] ^= 0x01
            store.local.put(key, bytes(blob))
        body = chunk_body(case["base"], [output[6]], None, state)
        response = app_client.post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 200
        text = app_client.get("/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="bad_signature") == 1.0
        assert metric(text, "render_stream_replays_total") == 1.0


def _half_stream(app_client: TestClient, case: dict[str, Any], count: int = 8) -> tuple[dict[str, Any], list[Any]]:
    """`count` one-token chunks; the echoed state after them and every chunk's answer."""
    state, answers = None, []
    for index in range(count):
        body = chunk_body(case["base"], [case["output"][index]], None, state)
        answer = app_client.post("/v1/chat/completions/derender", json=body).json()
        answers.append(answer)
        state = answer["stream_state"]
    assert state is not None
    return state, answers


def _next_chunk(
    app_client: TestClient, case: dict[str, Any], state: dict[str, Any], index: int = 8, **base: Any
) -> Any:
    body = chunk_body({**case["base"], **base}, [case["output"][index]], None, state)
    return app_client.post("/v1/chat/completions/derender", json=body)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda s: s["output_token_ids"].__setitem__(3, s["output_token_ids"][2]), id="one-id-changed"),
        pytest.param(lambda s: s.update(output_chunk_lens=[2, *s["output_chunk_lens"][2:]]), id="lens-regrouped"),
        pytest.param(lambda s: s["output_token_ids"].reverse(), id="ids-reordered"),
    ],
)
def test_echo_differing_from_the_snapshot_is_replayed(qwen3_model_dir: Path, case: dict[str, Any], tamper: Any) -> None:
    """A full-mode echo is only trusted when it is exactly what the snapshot was made for: any
    other (valid) echo is the truth, replayed, and echoed back as sent."""
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        state, _ = _half_stream(app_client, case)
        tampered = {**state, "output_token_ids": list(state["output_token_ids"])}
        tamper(tampered)
        response = _next_chunk(app_client, case, tampered)
        assert response.status_code == 200, response.text
        echoed = response.json()["stream_state"]
        assert echoed["output_token_ids"] == [*tampered["output_token_ids"], case["output"][8]]
        assert echoed["output_chunk_lens"] == [*tampered["output_chunk_lens"], 1]
        text = app_client.get("/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="mismatch") == 1.0
        assert metric(text, "render_stream_replays_total") == 1.0


def test_echo_with_lax_ints_still_resumes(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    """Ids sent back as 5.0 or "5" (pydantic's lax ints, which vLLM accepts) are the same echo
    once coerced: the snapshot is used, and the state goes back as plain ints."""
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        state, _ = _half_stream(app_client, case)
        lax = {**state, "output_token_ids": [float(i) for i in state["output_token_ids"]]}
        lax["output_chunk_lens"] = [str(n) for n in state["output_chunk_lens"]]
        response = _next_chunk(app_client, case, lax)
        assert response.status_code == 200, response.text
        echoed = response.json()["stream_state"]
        assert echoed["output_token_ids"] == case["output"][:9]
        assert all(type(i) is int for i in echoed["output_token_ids"] + echoed["output_chunk_lens"])
        text = app_client.get("/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="mismatch") == 0.0
        assert metric(text, "render_stream_replays_total") == 0.0


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda s: s["output_token_ids"].__setitem__(0, -3), "token id -3 is out of the vocabulary"),
        (lambda s: s["output_token_ids"].__setitem__(0, 10**9), "out of the vocabulary"),
        (lambda s: s["output_token_ids"].__setitem__(2, "x"), "valid integer"),
        (lambda s: s["output_token_ids"].__setitem__(0, 2**70), "as an integer"),
        (lambda s: s["output_chunk_lens"].__setitem__(0, 0), "greater than 0"),
        (lambda s: s["output_chunk_lens"].append(1), "must sum"),
        (lambda s: s["output_token_ids"].__setitem__(0, True), None),
        (lambda s: s.update(output_token_ids={"0": 1}), "valid list"),
    ],
)
def test_invalid_echo_is_refused_although_a_snapshot_exists(
    qwen3_model_dir: Path, case: dict[str, Any], tamper: Any, message: str | None
) -> None:
    """The echo checks skipped for a vouched echo still refuse a tampered prefix, exactly as
    without a snapshot (the same status and error)."""
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        state, _ = _half_stream(app_client, case)
        bad = {**state, "output_token_ids": list(state["output_token_ids"])}
        bad["output_chunk_lens"] = list(state["output_chunk_lens"])
        tamper(bad)
        with_snapshot = _next_chunk(app_client, case, bad)
        without = _next_chunk(app_client, case, {k: v for k, v in bad.items() if not k.startswith("rs_")})
        assert with_snapshot.status_code == without.status_code
        if message is not None:
            assert with_snapshot.status_code == 400
            # The same errors (the state's own keys differ, so its summary in the listing may).
            for response in (with_snapshot, without):
                assert message in response.json()["error"]["message"]
            errors = [with_snapshot.json()["error"]["message"], without.json()["error"]["message"]]
            assert errors[0].count("'type'") == errors[1].count("'type'")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b["chat_request"].update(messages="hi"), "valid list"),
        (lambda b: b["chat_request"].update(stop=["x"]), "stop strings are not supported"),
        (lambda b: b.update(prompt_token_ids=[*b["prompt_token_ids"], -1]), "greater than or equal to 0"),
        (lambda b: b.update(prompt_token_ids=[*b["prompt_token_ids"], 10**8]), "out of the vocabulary"),
        (lambda b: b.pop("chat_request"), "chat_request is required"),
    ],
)
def test_request_changed_after_the_snapshot_is_checked_in_full(
    qwen3_model_dir: Path, case: dict[str, Any], change: Any, message: str
) -> None:
    """The chat request and prompt ids a snapshot vouches for are resent with every full-mode
    chunk and not checked again; a changed one (here, an invalid one) is checked in full."""
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        state, _ = _half_stream(app_client, case)
        body = chunk_body(case["base"], [case["output"][8]], None, state)
        body["chat_request"] = dict(body["chat_request"])
        change(body)
        response = app_client.post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 400, response.text
        assert message in response.json()["error"]["message"]


def test_vouch_covers_the_echo_and_the_request_as_sent(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    """What the snapshot vouches for, chunk by chunk: nothing on the first chunk, then the echo
    and the request while they are resent as answered; a changed request, only the echo."""
    import asyncio

    from render_service.api.derender import Vouched
    from render_service.derender import pipeline

    with TestClient(make_app(qwen3_model_dir)) as app_client:
        ctx = app_client.app.state.render.derender

        def vouched(body: dict[str, Any]) -> Vouched:
            return asyncio.run(pipeline.vouch(ctx, json.loads(json.dumps(body)))).vouched

        first = chunk_body(case["base"], [case["output"][0]], None, None)
        assert vouched(first) == Vouched.NOTHING
        state, _ = _half_stream(app_client, case, 3)
        body = chunk_body(case["base"], [case["output"][3]], None, state)
        assert vouched(body) == Vouched.ECHO | Vouched.REQUEST
        assert vouched({**body, "chat_request": {**CHAT_REQUEST, "max_tokens": 5}}) == Vouched.ECHO
        assert vouched({**body, "prompt_token_ids": body["prompt_token_ids"][:-1]}) == Vouched.ECHO
        lax = {**state, "output_token_ids": [float(i) for i in state["output_token_ids"]]}
        assert vouched({**body, "stream_state": lax}) == Vouched.NOTHING
        assert vouched({**body, "stream": "true"}) == Vouched.NOTHING


def test_snapshot_size_does_not_grow_with_the_stream(client: TestClient, case: dict[str, Any]) -> None:
    """Per-chunk work is O(delta): the resumed state is bounded, whatever the stream length."""
    long_reasoning = client.post(
        "/tokenize", json={"prompt": "<think>" + "step by step, " * 800, "add_special_tokens": False}
    ).json()["tokens"]
    store = client.app.state.render.store
    sizes = []
    state = None
    for index, token in enumerate(long_reasoning):
        body = chunk_body(case["base"], [token], None, state)
        state = client.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
        if index in (20, len(long_reasoning) - 1):
            sizes.append(
                len(
                    store.local.get(
                        f"rs:snap:{client.app.state.render.fingerprint['fingerprint'][:16]}:"
                        f"{{{state['rs_sid']}}}:{state['rs_pos']}"
                    )
                )
            )
    assert len(long_reasoning) > 1000
    assert sizes[1] <= sizes[0] * 1.5


def test_compact_mode(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    with TestClient(make_app(qwen3_model_dir, stream_state_mode="compact")) as compact:
        lens = [2] * (len(case["output"]) // 2) + [1] * (len(case["output"]) % 2)
        state = None
        content = []
        start = 0
        for index, length in enumerate(lens):
            ids = case["output"][start : start + length]
            start += length
            body = chunk_body(case["base"], ids, "stop" if start >= len(case["output"]) else None, state)
            if index > 0:  # after the first chunk the client sends neither prompt ids nor the chat request
                body.pop("prompt_token_ids")
                body.pop("chat_request")
            response = compact.post("/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            state = response.json()["stream_state"]
            assert set(state) == {"rs_sid", "rs_pos", "rs_fp"}
            content.append(response.json()["chunk"]["choices"][0]["delta"].get("content") or "")
        assert "".join(content) == "\n\nLet me check.\n"
        lost = dict(state, rs_sid="0" * 32)
        body = chunk_body(case["base"], [case["output"][0]], None, lost)
        response = compact.post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "stream_state_expired"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b["chat_request"].update(stop=["x"]), "stop strings are not supported"),
        (lambda b: b.pop("chat_request"), "chat_request is required"),
        (lambda b: b.pop("prompt_token_ids"), "prompt_token_ids is required"),
        (
            lambda b: b["generate_chunk"]["choices"].append(dict(b["generate_chunk"]["choices"][0], index=1)),
            "at most one choice",
        ),
        (lambda b: b.update(stream_state={"output_token_ids": [1, 2], "output_chunk_lens": [1]}), "must sum"),
        (lambda b: b.update(stream_state={"prev_tokens": ["a"] * 1025}), "exceeds maximum"),
        (lambda b: b["generate_chunk"]["choices"][0].update(token_ids=[10**8]), "out of the vocabulary"),
    ],
)
def test_stream_errors_are_400(client: TestClient, case: dict[str, Any], mutate: Any, message: str) -> None:
    body = chunk_body(case["base"], case["output"][:2], None, None)
    body["chat_request"] = dict(body["chat_request"])
    mutate(body)
    response = client.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_plain_and_completion_streams_detokenize_multibyte(qwen3_model_dir: Path) -> None:
    with TestClient(
        make_app(qwen3_model_dir, reasoning_parser=None, tool_call_parser=None, enable_auto_tool_choice=False)
    ) as plain:
        ids = plain.post("/tokenize", json={"prompt": "naïve 天气 🌦️ ok", "add_special_tokens": False}).json()["tokens"]
        for path, field in (("/v1/chat/completions/derender", "delta"), ("/v1/completions/derender", "text")):
            state, pieces = None, []
            for index, token in enumerate(ids):
                body = chunk_body({"model": "tinyqwen3"}, [token], "length" if index == len(ids) - 1 else None, state)
                out = plain.post(path, json=body).json()
                state = out["stream_state"]
                choice = out["chunk"]["choices"][0]
                pieces.append((choice["delta"].get("content") if field == "delta" else choice["text"]) or "")
            assert "".join(pieces) == "naïve 天气 🌦️ ok"
            assert len(state["prev_tokens"]) < 8  # the window stays bounded


def test_snapshot_from_another_fingerprint_is_never_used(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    """Same stream id and position, but stored by a replica with another configuration: replayed."""
    with TestClient(make_app(qwen3_model_dir)) as app_client:
        render_state = app_client.app.state.render
        state = None
        for index in range(4):
            body = chunk_body(case["base"], [case["output"][index]], None, state)
            state = app_client.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
        key = next(k for k in render_state.store.local.keys() if k.endswith(f":{state['rs_pos']}"))
        snapshot = render_state.store.codec.decode(render_state.store.local.get(key))
        snapshot["fp"] = "0" * 32  # validly signed, but made under another fingerprint
        render_state.store.local.put(key, render_state.store.codec.encode(snapshot))
        body = chunk_body(case["base"], [case["output"][4]], None, state)
        assert app_client.post("/v1/chat/completions/derender", json=body).status_code == 200
        text = app_client.get("/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="mismatch") == 1.0
        assert metric(text, "render_stream_replays_total") == 1.0
