"""Held text beside the snapshot (`derender/segments.py`) with a real redis-server: a stream
that holds a long call resumes exactly on another replica, each replica fetching only the bytes
it lacks; a truncated, tampered or evicted segment is refused as a missing snapshot is (full
mode replays, compact mode answers 409)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from render_service.derender.snapshots import LocalStore, RedisStore, SnapshotCodec, SnapshotStore
from render_service.parsers.held import HeldText, decode_hook, encode_hook, load_with
from render_service.server.app import create_app
from render_service.server.metrics import Metrics
from render_service.settings import Settings
from tests.helpers import RedisServer, chunk_body, drive_stream, metric, redis_server

pytestmark = pytest.mark.timeout(300)


class _State(msgspec.Struct, array_like=True, tag="test/1"):
    held: HeldText = msgspec.field(default_factory=HeldText)


def _store(redis: RedisServer | None, metrics: Metrics | None = None, **local: Any) -> SnapshotStore:
    metrics = metrics or Metrics()
    return SnapshotStore(
        SnapshotCodec(b"k" * 32),
        metrics,
        local=LocalStore(**local),
        redis=RedisStore(redis.url, metrics, timeout=1.0) if redis is not None else None,
        write_wait=1.0,
    )


async def _put(store: SnapshotStore, state: _State, position: int) -> None:
    writer = store.segment_writer("f" * 16, "s", position)
    snapshot = {"state": msgspec.to_builtins(state, enc_hook=encode_hook(writer))}
    await store.put(f"snap:{position}", snapshot, held=writer)
    assert store.redis is not None
    await store.redis.flush()


async def _get(store: SnapshotStore, position: int) -> _State | None:
    snapshot = await store.get(f"snap:{position}")
    if snapshot is None:
        return None
    stored = snapshot.get("held") or []
    return load_with(stored, lambda: msgspec.convert(snapshot["state"], _State, dec_hook=decode_hook))


async def _close(*stores: SnapshotStore) -> None:
    for store in stores:
        await store.close()


def test_a_stream_alternating_between_replicas_fetches_only_what_each_lacks() -> None:
    fetched: list[tuple[int, int]] = []

    async def run(redis: RedisServer) -> None:
        a, b = _store(redis), _store(redis)
        for store in (a, b):
            assert store.redis is not None
            original = store.redis.get_range

            async def get_range(key: str, start: int, end: int, required: bool = False, _get: Any = original) -> Any:
                fetched.append((start, end))
                return await _get(key, start, end, required)

            store.redis.get_range = get_range  # type: ignore[method-assign]
        text = "前" + "x" * 700
        await _put(a, _State(HeldText(text)), 0)
        for position in range(1, 41):
            store = (a, b)[position % 2]
            state = await _get(store, position - 1)
            assert state is not None and state.held.text() == text
            piece = f" {position}é"
            state.held.append(piece)
            text += piece
            await _put(store, state, position)
        final = await _get(a, 40)
        assert final is not None and final.held.text() == text
        await _close(a, b)

    with redis_server() as redis:
        asyncio.run(run(redis))
    assert fetched[0][0] == 0  # b had no copy: the whole segment once ...
    assert all(start > 0 and end - start < 16 for start, end in fetched[1:])  # ... then one chunk's bytes


@pytest.mark.parametrize("damage", ["tamper", "truncate", "evict"])
def test_a_damaged_segment_makes_the_snapshot_unusable(damage: str) -> None:
    metrics = Metrics()

    async def run(redis: RedisServer) -> None:
        writer_store, reader = _store(redis), _store(redis, metrics)
        await _put(writer_store, _State(HeldText("y" * 2000)), 1)
        client = redis.client()
        (key,) = client.keys("rs:held:*")
        if damage == "tamper":
            client.setrange(key, 100, b"z")
        elif damage == "truncate":
            client.set(key, client.getrange(key, 0, 1000))
        else:
            client.delete(key)
        assert await _get(reader, 1) is None
        # The process that wrote it still has its own copy, which the digest vouches for.
        state = await _get(writer_store, 1)
        assert state is not None and state.held.text() == "y" * 2000
        await _close(writer_store, reader)

    with redis_server() as redis:
        asyncio.run(run(redis))
    assert metric(_metrics_text(metrics), "render_snapshot_rejected_total", reason="held_text") == 1.0


def test_appends_that_missed_redis_are_made_good_by_the_next_write() -> None:
    """A write that fails (Redis paused past the timeout) or is skipped (the cool-down after it)
    leaves a gap in Redis's copy; the next write sends the whole segment, so another replica
    can resume again."""

    async def run(redis: RedisServer) -> None:
        metrics = Metrics()
        writer_store = SnapshotStore(
            SnapshotCodec(b"k" * 32),
            metrics,
            local=LocalStore(),
            redis=RedisStore(redis.url, metrics, timeout=0.05, cooldown=0.2),
            write_wait=1.0,
        )
        text = "q" * 700
        await _put(writer_store, _State(HeldText(text)), 0)
        redis.client().execute_command("CLIENT", "PAUSE", "600", "WRITE")
        for position in (1, 2):  # the first write times out, the second is skipped (cool-down)
            state = await _get(writer_store, position - 1)
            assert state is not None
            state.held.append(f"<{position}>")
            text += f"<{position}>"
            await _put(writer_store, state, position)
        await asyncio.sleep(0.8)  # the pause and the cool-down are over
        state = await _get(writer_store, 2)
        assert state is not None
        state.held.append("<3>")
        text += "<3>"
        await _put(writer_store, state, 3)
        reader = _store(redis)
        resumed = await _get(reader, 3)
        assert resumed is not None and resumed.held.text() == text
        await _close(writer_store, reader)

    with redis_server() as redis:
        asyncio.run(run(redis))


def test_a_segment_evicted_from_this_process_without_redis_is_a_miss() -> None:
    async def run() -> None:
        store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore(max_segment_bytes=4096))
        writer = store.segment_writer("f" * 16, "s", 1)
        snapshot = {"state": msgspec.to_builtins(_State(HeldText("w" * 1000)), enc_hook=encode_hook(writer))}
        await store.put("snap:1", snapshot, held=writer)
        assert await store.get("snap:1") is not None
        for n in range(2, 6):  # other streams' held text pushes it out
            other = store.segment_writer("f" * 16, f"t{n}", 1)
            msgspec.to_builtins(_State(HeldText("v" * 1500)), enc_hook=encode_hook(other))
            await store.put(f"other:{n}", {"state": []}, held=other)
        assert store.local is not None and store.local.segments.bytes <= 4096
        assert await store.get("snap:1") is None

    asyncio.run(run())


def _metrics_text(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


# -- two app instances over HTTP, DeepSeek V3.2 DSML tool calls ---------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "create_ticket",
            "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}}},
        },
    }
]
CHAT_REQUEST = {"model": "tinydeepseek", "messages": [{"role": "user", "content": "File it."}], "tools": TOOLS}
BODY = "The payment service retried every settlement, ünïcödé 中文 included; " * 30
OUTPUT_TEXT = (
    'Filing it.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="create_ticket">\n'
    '<｜DSML｜parameter name="title" string="true">Retry storm</｜DSML｜parameter>\n'
    f'<｜DSML｜parameter name="body" string="true">{BODY}</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>"
)


@pytest.fixture(scope="module")
def dsml_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.parsers.families import deepseek

    return deepseek.build(tmp_path_factory.mktemp("dsml"))


def _app(model_dir: Path, redis_url: str, mode: str) -> Any:
    settings = Settings(
        model=str(model_dir),
        served_model_name=["tinydeepseek"],
        tool_call_parser="deepseek_v32",
        enable_auto_tool_choice=True,
        max_model_len=16384,
        stream_state_mode=mode,
        redis_url=redis_url,
        snapshot_key="held-text-test",
    )
    return create_app(settings.validate())


@pytest.mark.parametrize("mode", ["full", "compact"])
def test_two_apps_share_a_stream_holding_a_long_call(dsml_model_dir: Path, mode: str) -> None:
    with (
        redis_server() as redis,
        TestClient(_app(dsml_model_dir, redis.url, mode)) as a,
        TestClient(_app(dsml_model_dir, redis.url, mode)) as b,
    ):
        rendered = a.post("/v1/chat/completions/render", json=CHAT_REQUEST).json()
        output = a.post("/tokenize", json={"prompt": OUTPUT_TEXT, "add_special_tokens": False}).json()["tokens"]
        base = {"model": "tinydeepseek", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered["token_ids"]}
        batch = a.post(
            "/v1/chat/completions/derender",
            json={
                **base,
                "generate_response": {
                    "request_id": "generate-tokens-chatcmpl-test",
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": output}],
                },
            },
        ).json()["choices"][0]["message"]
        assert batch["tool_calls"][0]["function"]["arguments"].endswith('ünïcödé 中文 included; "}')

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            if mode == "compact" and index > 0:
                body.pop("prompt_token_ids")
                body.pop("chat_request")
            response = (a, b)[index % 2].post("/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, base, output, [1] * len(output))
        assert [(c["name"], c["arguments"]) for c in got["tool_calls"]] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in batch["tool_calls"]
        ]
        assert got["finish_reason"] == "tool_calls"
        texts = [client.get("/metrics").text for client in (a, b)]
        assert sum(metric(t, "render_stream_replays_total") for t in texts) == 0
        assert sum(metric(t, "render_snapshot_rejected_total", reason="held_text") for t in texts) == 0
        assert redis.client().keys("rs:held:*")  # the body was held in a segment, not in the snapshots

        # Mid-call, the segment is lost: the other replica cannot continue from its snapshot.
        held_until = OUTPUT_TEXT.index("</｜DSML｜parameter>\n</｜DSML｜invoke>")
        cut = len(a.post("/tokenize", json={"prompt": OUTPUT_TEXT[:held_until]}).json()["tokens"]) - 5
        state = None
        for index in range(cut):
            state = post(index, chunk_body(base, output[index : index + 1], None, state))["stream_state"]
        for key in redis.client().keys("rs:held:*"):
            redis.client().delete(key)
        body = chunk_body(base, output[cut : cut + 1], None, state)
        if mode == "compact":
            body.pop("prompt_token_ids")
            body.pop("chat_request")
        # Each replica holds its own copy of the bytes it wrote; the replica that did not write
        # the last chunk lacks the newest and must fetch them.
        other = (a, b)[cut % 2]
        response = other.post("/v1/chat/completions/derender", json=body)
        text = other.get("/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="held_text") >= 1
        if mode == "compact":
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "stream_state_expired"
        else:  # the echoed state is the truth: one replay
            assert response.status_code == 200, response.text
            assert metric(text, "render_stream_replays_total") == 1.0
