"""The full-mode echo read as bytes (derender/echo.py): taken only when the echoed arrays are
byte for byte what this service sent, and otherwise the body is parsed whole, with the same
answers and the same errors either way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from render_service.derender import echo, pipeline
from tests.derender.test_derender import make_app
from tests.helpers import chunk_body, metric

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT_REQUEST = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
OUTPUT_TEXT = (
    "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
)
PATH = "/v1/chat/completions/derender"
HEADERS = {"content-type": "application/json"}
DEPTH = 10


# -- the byte-level pieces ----------------------------------------------------------------------


def test_split_body_cuts_out_the_echo_and_keeps_the_rest() -> None:
    state = {"prev_tokens": ["a]"], "output_token_ids": [5, 6, 7], "output_chunk_lens": [1, 2], "rs_sid": "s"}
    body = {"stream": True, "stream_state": state, "prompt_token_ids": [1, 2]}
    split = echo.split_body(orjson.dumps(body))
    assert split is not None
    assert split.ids == b"[5,6,7]" and split.lens == b"[1,2]"
    rest = {k: v for k, v in split.body["stream_state"].items() if k not in ("output_token_ids", "output_chunk_lens")}
    assert rest == {"prev_tokens": ["a]"], "rs_sid": "s"}
    assert split.body["prompt_token_ids"] == [1, 2]


@pytest.mark.parametrize(
    "raw",
    [
        # written with spaces (json.dumps' default separators)
        json.dumps({"stream_state": {"output_token_ids": [5], "output_chunk_lens": [1]}}).encode(),
        # the pattern only elsewhere (a tool schema's property), the state's own with a space
        b'{"x":{"output_token_ids":[1],"output_chunk_lens":[1]},'
        b'"stream_state":{"output_token_ids": [5],"output_chunk_lens": [1]}}',
        # a later duplicate key overrides the compact one (JSON parsers keep the last)
        b'{"stream_state":{"output_token_ids":[5],"output_chunk_lens":[1],"output_token_ids":[6]}}',
        # not a flat array
        b'{"stream_state":{"output_token_ids":[[5]],"output_chunk_lens":[1]}}',
        b'{"stream_state":{"output_token_ids":null,"output_chunk_lens":[1]}}',
        # not JSON, and not an object
        b'{"stream_state":{"output_token_ids":[5],"output_chunk_lens":[1]}',
        b'[{"output_token_ids":[5],"output_chunk_lens":[1]}]',
        b'{"stream_state":{"output_chunk_lens":[1]}}',
    ],
    ids=["spaces", "elsewhere", "duplicate", "nested", "null", "truncated", "array", "missing"],
)
def test_split_body_gives_way_where_it_would_not_be_exact(raw: bytes) -> None:
    assert echo.split_body(raw) is None


def test_echoed_array_splices_the_delta_in() -> None:
    ids = echo.EchoedArray(b"[5,6]", 2)
    lens = echo.EchoedArray(b"[2]")
    assert len(ids) == 2 and len(lens) == 1
    ids.extend([7, 8])
    lens.append(2)
    assert len(ids) == 4
    state = {"output_token_ids": ids, "output_chunk_lens": lens, "role_sent": True}
    echo.seal(state)
    assert orjson.loads(orjson.dumps(state)) == {
        "output_token_ids": [5, 6, 7, 8],
        "output_chunk_lens": [2, 2],
        "role_sent": True,
    }
    empty = echo.EchoedArray(b"[]")
    assert len(empty) == 0
    empty.extend([3])
    assert orjson.dumps(empty.wire()) == b"[3]"
    assert orjson.dumps(echo.EchoedArray(b"[4]").wire()) == b"[4]"


def test_digest_of_bytes_equals_digest_of_lists() -> None:
    """The digest a snapshot keeps (of lists) is the digest of the bytes the client echoes."""
    by_lists = echo.EchoDigest.of([5, 6, 7], [1, 2])
    assert by_lists is not None
    by_lists.extend([8])
    assert echo.EchoDigest(b"[5,6,7,8]", b"[1,2,1]").digest() == by_lists.digest()


# -- through the route ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app_client(qwen3_model_dir: Path) -> Iterator[TestClient]:
    with TestClient(make_app(qwen3_model_dir)) as client:
        yield client


@pytest.fixture(scope="module")
def case(app_client: TestClient) -> dict[str, Any]:
    rendered = app_client.post("/v1/chat/completions/render", json=CHAT_REQUEST).json()
    output = app_client.post("/tokenize", json={"prompt": OUTPUT_TEXT, "add_special_tokens": False}).json()["tokens"]
    base = {"model": "tinyqwen3", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered["token_ids"]}
    return {"base": base, "output": output}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each chunk read as bytes, whether the snapshot vouched for the echo (fast path)."""
    seen: list[bool] = []
    original = pipeline.vouch_raw

    async def spy(ctx: Any, raw: echo.RawEcho) -> pipeline.Vouch:
        vouch = await original(ctx, raw)
        seen.append(vouch.from_bytes)
        return vouch

    monkeypatch.setattr(pipeline, "vouch_raw", spy)
    return seen


def _stream_to_depth(client: TestClient, case: dict[str, Any]) -> dict[str, Any]:
    state = None
    for index in range(DEPTH):
        body = chunk_body(case["base"], [case["output"][index]], None, state)
        state = client.post(PATH, content=orjson.dumps(body), headers=HEADERS).json()["stream_state"]
    assert state is not None
    return state


def _without_time(answer: dict[str, Any]) -> dict[str, Any]:
    answer["chunk"].pop("created")
    return answer


def _post(client: TestClient, raw: bytes) -> Any:
    return client.post(PATH, content=raw, headers=HEADERS)


def _counters(client: TestClient) -> tuple[float, float, float]:
    text = client.get("/metrics").text
    return (
        metric(text, "render_snapshot_hits_total", tier="local"),
        metric(text, "render_snapshot_rejected_total", reason="mismatch"),
        metric(text, "render_stream_replays_total"),
    )


def test_exact_echo_is_not_decoded_and_answers_as_a_whole_parse(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    """The same chunk (a retry: the snapshot is still there), sent compactly (read as bytes),
    with spaces (parsed whole) and with its keys in another order (read as bytes): the same
    answer, resumed from the snapshot each time."""
    state = _stream_to_depth(app_client, case)
    reads.clear()
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, state)
    hits, mismatches, replays = _counters(app_client)
    compact = _post(app_client, orjson.dumps(body))
    spaced = _post(app_client, json.dumps(body).encode())
    reordered_state = dict(reversed(list(state.items())))
    reordered = _post(app_client, orjson.dumps(dict(reversed(list({**body, "stream_state": reordered_state}.items())))))
    assert reads == [True, True]  # with spaces, the echo is not even cut out
    answers = [_without_time(r.json()) for r in (compact, spaced, reordered)]
    assert answers[0] == answers[1] == answers[2]
    echoed = answers[0]["stream_state"]
    assert echoed["output_token_ids"] == case["output"][: DEPTH + 1]
    assert echoed["output_chunk_lens"] == [1] * (DEPTH + 1)
    # The echo goes back as compact JSON (the form the next chunk can be read in as bytes).
    assert b'"output_token_ids":[' in compact.content and b'"output_chunk_lens":[' in compact.content
    assert _counters(app_client) == (hits + 3, mismatches, replays)


def test_a_stream_read_as_bytes_equals_one_parsed_whole(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    """Every chunk of one stream sent compactly and of another with spaces: the same deltas."""

    def run(dumps: Any) -> list[Any]:
        state, deltas = None, []
        for index, token in enumerate(case["output"]):
            finish = "stop" if index == len(case["output"]) - 1 else None
            answer = _post(app_client, dumps(chunk_body(case["base"], [token], finish, state))).json()
            state = answer["stream_state"]
            deltas.append(answer["chunk"]["choices"])
        return deltas

    reads.clear()
    by_bytes = run(orjson.dumps)
    assert reads.count(True) == len(case["output"]) - 1  # every chunk but the first
    reads.clear()
    assert run(lambda b: json.dumps(b).encode()) == by_bytes
    assert reads == []  # with spaces, the echo is never cut out


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda s: s["output_token_ids"].__setitem__(0, s["output_token_ids"][1]), id="prefix"),
        pytest.param(lambda s: s["output_token_ids"].__setitem__(-1, s["output_token_ids"][0]), id="suffix"),
        pytest.param(lambda s: s.update(output_chunk_lens=[2, *s["output_chunk_lens"][2:]]), id="lens"),
    ],
)
def test_tampered_echo_is_replayed_as_sent(
    app_client: TestClient, case: dict[str, Any], reads: list[bool], tamper: Any
) -> None:
    """Echoed bytes that differ from what was sent are parsed whole, the snapshot refused as a
    mismatch, and the echo (the truth) replayed and sent back as received."""
    state = _stream_to_depth(app_client, case)
    tampered = {**state, "output_token_ids": list(state["output_token_ids"])}
    tamper(tampered)
    reads.clear()
    _, mismatches, replays = _counters(app_client)
    response = _post(app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, tampered)))
    assert response.status_code == 200, response.text
    assert reads == [False]
    echoed = response.json()["stream_state"]
    assert echoed["output_token_ids"] == [*tampered["output_token_ids"], case["output"][DEPTH]]
    assert echoed["output_chunk_lens"] == [*tampered["output_chunk_lens"], 1]
    _, mismatches_after, replays_after = _counters(app_client)
    assert (mismatches_after, replays_after) == (mismatches + 1, replays + 1)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda s: s["output_token_ids"].__setitem__(-1, -3), "token id -3 is out of the vocabulary"),
        (lambda s: s["output_token_ids"].__setitem__(0, 10**9), "out of the vocabulary"),
        (lambda s: s["output_chunk_lens"].append(1), "must sum"),
    ],
)
def test_invalid_echo_is_refused_as_by_a_whole_parse(
    app_client: TestClient, case: dict[str, Any], reads: list[bool], tamper: Any, message: str
) -> None:
    state = _stream_to_depth(app_client, case)
    bad = {**state, "output_token_ids": list(state["output_token_ids"])}
    bad["output_chunk_lens"] = list(state["output_chunk_lens"])
    tamper(bad)
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, bad)
    reads.clear()
    compact = _post(app_client, orjson.dumps(body))
    spaced = _post(app_client, json.dumps(body).encode())
    assert reads == [False]
    assert compact.status_code == spaced.status_code == 400
    assert message in compact.json()["error"]["message"]
    assert compact.json() == spaced.json()


def test_duplicate_echo_key_is_read_as_a_whole_parse(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    """A later duplicate of the echoed key wins, as in any JSON parser: the body is parsed whole."""
    state = _stream_to_depth(app_client, case)
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, state)
    raw = orjson.dumps(body)
    shorter = orjson.dumps(state["output_token_ids"][:-1])
    duplicated = raw.replace(b'"output_chunk_lens":', b'"output_token_ids":' + shorter + b',"output_chunk_lens":', 1)
    reads.clear()
    response = _post(app_client, duplicated)
    assert reads == []  # the cut-out key is not the one that counts: never read as bytes
    # the effective ids are one short of the chunk lengths: refused exactly as a whole parse does
    assert response.status_code == 400
    assert "must sum" in response.json()["error"]["message"]
    assert response.json() == _post(app_client, json.dumps(json.loads(duplicated)).encode()).json()


def test_invalid_chunk_with_an_exact_echo_gets_the_errors_of_a_whole_parse(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    state = _stream_to_depth(app_client, case)
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, state)
    body["generate_chunk"]["choices"][0]["index"] = "first"
    reads.clear()
    compact = _post(app_client, orjson.dumps(body))
    assert reads == [True]  # vouched for, then the validation error sends it to a whole parse
    spaced = _post(app_client, json.dumps(body).encode())
    assert compact.status_code == spaced.status_code == 400
    assert compact.json() == spaced.json()
    assert "output_token_ids" not in compact.json()["error"]["message"]


def test_wrong_position_or_stream_id_falls_back(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    """`rs_pos` names the snapshot the bytes are checked against; a wrong one (or an unknown
    stream id) is read whole, and the echo's own length finds the snapshot again."""
    state = _stream_to_depth(app_client, case)
    hits, mismatches, replays = _counters(app_client)
    reads.clear()
    moved = _post(
        app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, {**state, "rs_pos": 3}))
    )
    assert moved.status_code == 200, moved.text
    assert reads == [False]
    assert moved.json()["stream_state"]["rs_pos"] == DEPTH + 1
    assert _counters(app_client) == (hits + 1, mismatches, replays)
    foreign = _post(
        app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, {**state, "rs_sid": "0" * 32}))
    )
    assert foreign.status_code == 200
    assert foreign.json()["stream_state"]["output_token_ids"] == case["output"][: DEPTH + 1]
    assert _counters(app_client)[2] == replays + 1  # no snapshot for that id: replayed


def test_fingerprint_mismatch_is_a_409_without_a_lookup(
    app_client: TestClient, case: dict[str, Any], reads: list[bool]
) -> None:
    state = _stream_to_depth(app_client, case)
    reads.clear()
    hits = _counters(app_client)[0]
    stale = {**state, "rs_fp": "0" * 16}
    response = _post(app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, stale)))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "fingerprint_mismatch"
    assert reads == []
    assert _counters(app_client)[0] == hits


def test_compact_mode_never_reads_bytes(qwen3_model_dir: Path, case: dict[str, Any], reads: list[bool]) -> None:
    with TestClient(make_app(qwen3_model_dir, stream_state_mode="compact")) as compact:
        state = None
        for index in range(3):
            body = chunk_body(case["base"], [case["output"][index]], None, state)
            response = compact.post(PATH, content=orjson.dumps(body), headers=HEADERS)
            assert response.status_code == 200, response.text
            state = response.json()["stream_state"]
    assert reads == []


# -- what this process sent, kept per stream (`echo.SentCache`) ---------------------------------


@pytest.fixture
def splits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """For each body read as bytes: (the echo was found equal to the kept bytes, the request
    fields were cut out as the kept bytes)."""
    seen: list[tuple[bool, bool]] = []
    original = echo.split_body

    def spy(raw: bytes, cache: echo.SentCache | None = None) -> echo.RawEcho | None:
        split = original(raw, cache)
        if split is not None:
            seen.append((split.sent is not None, split.request is not None))
        return split

    monkeypatch.setattr(echo, "split_body", spy)
    return seen


def _kept_request_intact(client: TestClient) -> None:
    """Every kept request's values are still what its bytes decode to (nothing changed them)."""
    cache = client.app.state.render.derender.sent  # type: ignore[attr-defined]
    assert cache is not None and len(cache) > 0
    for kept in cache._streams.values():
        for sent in kept:
            if sent.request is not None:
                assert sent.request.prompt_value == orjson.loads(sent.request.prompt)
                assert sent.request.chat_value == orjson.loads(sent.request.chat)


def test_stream_after_its_first_chunks_is_checked_against_the_kept_bytes(
    app_client: TestClient, case: dict[str, Any], reads: list[bool], splits: list[tuple[bool, bool]]
) -> None:
    """From the second chunk on the echo is what was kept (memcmp, no hashing); from the third,
    the resent prompt ids and chat request too (the second chunk is the first whose request a
    snapshot vouched for). Every answer is the one a whole parse gives."""
    state = None
    for index in range(DEPTH):
        body = chunk_body(case["base"], [case["output"][index]], None, state)
        fast = _post(app_client, orjson.dumps(body))
        whole = _post(app_client, json.dumps(body).encode())  # a retry, parsed whole
        if index == 0:  # (a first chunk starts a stream: each of the two is given its own id)
            assert _without_time(fast.json())["chunk"] == _without_time(whole.json())["chunk"]
        else:
            assert _without_time(fast.json()) == _without_time(whole.json())
        state = fast.json()["stream_state"]
    fast_reads = splits[: DEPTH - 1]
    assert fast_reads[0] == (True, False)
    assert fast_reads[1:] == [(True, True)] * (DEPTH - 2)
    assert reads == [True] * (DEPTH - 1)
    _kept_request_intact(app_client)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda s: s["output_token_ids"].__setitem__(0, s["output_token_ids"][1]), id="first-id"),
        pytest.param(lambda s: s["output_token_ids"].__setitem__(-1, s["output_token_ids"][0]), id="last-id"),
        pytest.param(lambda s: s["output_token_ids"].append(s["output_token_ids"][0]), id="longer"),
        pytest.param(lambda s: s["output_token_ids"].pop(), id="shorter"),
        pytest.param(lambda s: s.update(output_chunk_lens=[2, *s["output_chunk_lens"][2:]]), id="lens"),
    ],
)
def test_altered_echo_after_a_kept_hit_is_refused_or_replayed_as_by_a_whole_parse(
    app_client: TestClient, case: dict[str, Any], reads: list[bool], splits: list[tuple[bool, bool]], tamper: Any
) -> None:
    """After chunks whose echo matched the kept bytes, an echo that differs from them in one id,
    in length or in its chunk lengths is no kept hit: it is compared by digest (and refused as a
    mismatch, then replayed as sent) or refused by validation, exactly as when parsed whole."""
    state = _stream_to_depth(app_client, case)
    assert splits[-1] == (True, True)  # the stream was read against the kept bytes
    altered = {**state, "output_token_ids": list(state["output_token_ids"])}
    tamper(altered)
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, altered)
    splits.clear()
    reads.clear()
    _, mismatches, replays = _counters(app_client)
    fast = _post(app_client, orjson.dumps(body))
    assert [hit for hit, _ in splits] in ([], [False])  # never taken as the kept echo
    assert reads in ([], [False])  # never vouched for
    whole = _post(app_client, json.dumps(body).encode())
    assert fast.status_code == whole.status_code
    if fast.status_code == 200:
        # the same answer, each replay starting a stream of its own (a new id)
        answers = [_without_time(r.json()) for r in (fast, whole)]
        assert answers[0]["stream_state"].pop("rs_sid") != answers[1]["stream_state"].pop("rs_sid")
        assert answers[0] == answers[1]
        echoed = fast.json()["stream_state"]
        assert echoed["output_token_ids"] == [*altered["output_token_ids"], case["output"][DEPTH]]
        _, mismatches_after, replays_after = _counters(app_client)
        assert mismatches_after > mismatches and replays_after == replays + 2
    else:
        assert fast.json() == whole.json()
    # the stream as sent still continues from the kept bytes
    splits.clear()
    ok = _post(app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, state)))
    assert ok.status_code == 200 and splits == [(True, True)]


def test_changed_request_after_a_kept_hit_is_parsed_and_checked(
    app_client: TestClient, case: dict[str, Any], reads: list[bool], splits: list[tuple[bool, bool]]
) -> None:
    """Request fields that differ from the kept bytes are parsed and validated in full; a changed
    request then changed back is cut out as the kept bytes, but, the snapshot vouching for the
    other request, validated in full on fresh copies: the kept values stay as they were. An
    invalid changed request is refused as by a whole parse."""
    state = _stream_to_depth(app_client, case)
    # another valid request (the conversation's user turn reworded): parsed, validated, answered
    other_request = {**CHAT_REQUEST, "messages": [{"role": "user", "content": "Weather in Lyon?"}]}
    other = chunk_body({**case["base"], "chat_request": other_request}, [case["output"][DEPTH]], None, state)
    splits.clear()
    reads.clear()
    answer = _post(app_client, orjson.dumps(other))
    assert answer.status_code == 200, answer.text
    assert splits == [(True, False)] and reads == [True]
    # back to the kept request, which the new snapshot does not vouch for (it vouches for the other)
    back = chunk_body(case["base"], [case["output"][DEPTH + 1]], None, answer.json()["stream_state"])
    splits.clear()
    fast = _post(app_client, orjson.dumps(back))
    assert splits == [(True, True)]
    whole = _post(app_client, json.dumps(back).encode())
    assert fast.status_code == 200
    assert _without_time(fast.json()) == _without_time(whole.json())
    _kept_request_intact(app_client)

    # invalid request fields (a retry of the chunk at DEPTH): refused exactly as by a whole parse
    bad = chunk_body(
        {**case["base"], "chat_request": {**CHAT_REQUEST, "n": "many"}}, [case["output"][DEPTH]], None, state
    )
    fast = _post(app_client, orjson.dumps(bad))
    whole = _post(app_client, json.dumps(bad).encode())
    assert fast.status_code == whole.status_code == 400
    assert fast.json() == whole.json()
    bad_prompt = chunk_body({**case["base"], "prompt_token_ids": [-1]}, [case["output"][DEPTH]], None, state)
    fast = _post(app_client, orjson.dumps(bad_prompt))
    assert fast.status_code == 400 and fast.json() == _post(app_client, json.dumps(bad_prompt).encode()).json()
    _kept_request_intact(app_client)


def test_invalid_chunk_after_kept_hits_leaves_the_kept_request_as_it_was(
    app_client: TestClient, case: dict[str, Any], splits: list[tuple[bool, bool]]
) -> None:
    """A chunk whose request fields were the kept bytes but which fails validation elsewhere is
    validated whole (filling in the request's defaults): the errors are a whole parse's, the
    kept values never change, and the stream goes on (read as before, then kept again)."""
    state = _stream_to_depth(app_client, case)
    assert splits[-1] == (True, True)
    body = chunk_body(case["base"], [case["output"][DEPTH]], None, state)
    body["generate_chunk"]["choices"][0]["index"] = "first"
    fast = _post(app_client, orjson.dumps(body))
    assert fast.status_code == 400
    assert fast.json() == _post(app_client, json.dumps(body).encode()).json()
    _kept_request_intact(app_client)
    splits.clear()
    state = _post(app_client, orjson.dumps(chunk_body(case["base"], [case["output"][DEPTH]], None, state))).json()
    state = state["stream_state"]
    nxt = chunk_body(case["base"], [case["output"][DEPTH + 1]], None, state)
    fast = _post(app_client, orjson.dumps(nxt))
    assert splits[-1] == (True, True)  # kept again
    assert _without_time(fast.json()) == _without_time(_post(app_client, json.dumps(nxt).encode()).json())
    _kept_request_intact(app_client)


def test_kept_request_bytes_must_be_the_keys_values(case: dict[str, Any]) -> None:
    """The kept request bytes cut out only where they are the top-level values: found inside
    another key, or overridden by a later duplicate, the body is parsed whole."""
    cache = echo.SentCache()
    prompt, chat = b"[1,2,3]", orjson.dumps(CHAT_REQUEST)
    kept = echo.KeptRequest(prompt, chat, [1, 2, 3], CHAT_REQUEST, b"d" * 16)
    digest = echo.EchoDigest(b"[5,6]", b"[2]")
    cache.put(echo.Sent("s1", 2, b"[5,6]", b"[2]", digest, digest.digest(), kept))
    state = b'"stream_state":{"output_token_ids":[5,6],"output_chunk_lens":[2],"rs_sid":"s1","rs_pos":2}'
    good = b'{"stream":true,' + state + b',"prompt_token_ids":[1,2,3],"chat_request":' + chat + b"}"
    split = echo.split_body(good, cache)
    assert split is not None and split.sent is not None and split.request is kept
    assert split.body["chat_request"] is CHAT_REQUEST and split.body["prompt_token_ids"] == [1, 2, 3]
    # the same bytes, but the prompt ids overridden by a later key: parsed whole
    duplicate = good[:-1] + b',"prompt_token_ids":[9]}'
    assert echo.split_body(duplicate, cache) is None
    # the prompt ids differ (a longer list starting with the kept bytes' digits): not cut out
    longer = good.replace(b"[1,2,3]", b"[1,2,3,4]")
    split = echo.split_body(longer, cache)
    assert split is not None and split.request is None and split.body["prompt_token_ids"] == [1, 2, 3, 4]
    # the kept bytes only inside another object: not cut out
    nested = b'{"stream":true,' + state + b',"x":{"prompt_token_ids":[1,2,3],"chat_request":' + chat + b"}}"
    split = echo.split_body(nested, cache)
    assert split is None or split.request is None
    # the echo equal to the kept bytes but the stream id another: the bytes are still exact
    # (compared by digest later: `sent` is a hint that `vouch_raw` checks against the body)
    other = good.replace(b'"rs_sid":"s1"', b'"rs_sid":"s2"')
    split = echo.split_body(other, cache)
    assert split is not None and split.sent is None and split.ids == b"[5,6]"


def test_sent_cache_keeps_two_per_stream_within_its_bound() -> None:
    digest = echo.EchoDigest(b"[]", b"[]")
    cache = echo.SentCache(max_bytes=4096)
    for position in range(1, 5):
        ids = orjson.dumps(list(range(position)))
        cache.put(echo.Sent("s", position, ids, b"[1]", digest, b"", None))
    assert [sent.position for sent in cache.candidates("s")] == [4, 3]
    cache.put(echo.Sent("t", 1, b"[" + b"1," * 3000 + b"1]", b"[1]", digest, b"", None))  # past the bound alone
    assert cache.candidates("t") == ()
    for n in range(40):
        cache.put(echo.Sent(f"u{n}", 1, b"[" + b"7," * 30 + b"7]", b"[1]", digest, b"", None))
    assert cache.candidates("s") == ()  # the least recently used stream went first
    assert len(cache.candidates("u39")) == 1
    twin = digest.copy()
    twin.extend([5])
    assert twin.digest() != digest.digest() == echo.EchoDigest(b"[]", b"[]").digest()
