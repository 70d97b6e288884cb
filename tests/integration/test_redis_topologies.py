"""Redis as operators run it, with real redis-server processes on loopback: TLS with a client
certificate, Sentinel failing over (the master killed, or `SENTINEL FAILOVER`) while streams are
derendered across two replicas, and a 3-master Cluster (snapshot keys in one slot per stream; the
image cache's MGET split per slot, reassembled in order, following MOVED and ASK).

Replicas are in-process apps (one model load for the module) that share only Redis, as pods do."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from redis.crc import key_slot
from starlette.testclient import TestClient

from render_service.model.loader import Model, load_model
from render_service.multimodal import imagecache
from render_service.multimodal import qwen3_vl as multimodal
from render_service.redis_target import RedisTarget
from render_service.server.app import create_app
from render_service.server.metrics import Metrics
from render_service.settings import Settings
from tests.certs import Pki, make_pki
from tests.helpers import drive_stream, metric
from tests.redis_topologies import Cluster, redis_cluster, sentinel_set, tls_redis, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

SECRET = "topology-secret"
TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
]
CHAT_REQUEST = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Find it."}], "tools": TOOLS}
OUTPUT_TEXT = (
    "<think>\nSearch first, then answer with ümlauts and 中文.\n</think>\n\nSearching.\n<tool_call>\n"
    '{"name": "lookup", "arguments": {"q": "render tier"}}\n</tool_call><|im_end|>'
)


def settings_for(model_dir: Path, **redis: Any) -> Settings:
    return Settings(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=8192,
        snapshot_key=SECRET,
        **redis,
    ).validate()


@pytest.fixture(scope="module")
def model(qwen3_model_dir: Path) -> Model:
    return load_model(settings_for(qwen3_model_dir))


@pytest.fixture(scope="module")
def case(qwen3_model_dir: Path, model: Model) -> dict[str, Any]:
    with TestClient(create_app(settings_for(qwen3_model_dir), model)) as client:
        rendered = client.post("/v1/chat/completions/render", json=CHAT_REQUEST).json()
        output = client.post("/tokenize", json={"prompt": OUTPUT_TEXT}).json()["tokens"]
        batch = client.post(
            "/v1/chat/completions/derender",
            json={
                "chat_request": CHAT_REQUEST,
                "prompt_token_ids": rendered["token_ids"],
                "generate_response": {
                    "request_id": "generate-tokens-chatcmpl-test",
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": output}],
                },
            },
        ).json()
    base = {"model": "tinyqwen3", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered["token_ids"]}
    return {"base": base, "output": output, "expected": batch["choices"][0]["message"]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def replicas(model_dir: Path, model: Model, **redis: Any) -> Iterator[list[TestClient]]:
    """Two replicas sharing only the Redis the options name."""
    with ExitStack() as stack:
        yield [stack.enter_context(TestClient(create_app(settings_for(model_dir, **redis), model))) for _ in range(2)]


def total(clients: list[TestClient], name: str, **labels: str) -> float:
    return sum(metric(client.get("/metrics").text, name, **labels) for client in clients)


def alternate(clients: list[TestClient], case: dict[str, Any], pause: float = 0.0, on_chunk: Any = None) -> Any:
    """One stream, one token per chunk, each chunk on the other replica; every answer a 200."""

    def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
        if on_chunk is not None:
            on_chunk(index, body)
        response = clients[index % len(clients)].post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 200, response.text
        if pause:
            time.sleep(pause)
        return response.json()

    return drive_stream(post, case["base"], case["output"], [1] * len(case["output"]))


def most(case: dict[str, Any], streams: int = 1) -> int:
    """Redis hits expected at least: most chunks (one 50 ms timeout on a loaded machine costs a
    2 s cool-down of replays, so not all of them)."""
    return streams * len(case["output"]) // 2


def assert_matches_batch(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert (got["reasoning"], got["content"]) == (expected["reasoning"], expected["content"])
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]
    ]
    assert got["finish_reason"] == "tool_calls"


# -- TLS ---------------------------------------------------------------------------------------


def test_snapshots_over_tls_with_a_client_certificate(qwen3_model_dir: Path, model: Model, case, pki: Pki) -> None:
    with tls_redis(pki) as server:
        url = f"rediss://127.0.0.1:{server.port}/0"
        options = {
            "redis_url": url,
            "redis_ssl_ca_certs": str(pki.ca),
            "redis_ssl_certfile": str(pki.client_cert),
            "redis_ssl_keyfile": str(pki.client_key),
        }
        with replicas(qwen3_model_dir, model, **options) as clients:
            assert_matches_batch(alternate(clients, case), case["expected"])
            assert total(clients, "render_snapshot_hits_total", tier="redis") >= most(case)
        assert server.client().keys("rs:snap:*")
        # Without a client certificate the server refuses the handshake: every chunk replays, and
        # the stream is still exactly the batch answer.
        without_cert = {"redis_url": url, "redis_ssl_ca_certs": str(pki.ca)}
        with replicas(qwen3_model_dir, model, **without_cert) as clients:
            assert_matches_batch(alternate(clients, case), case["expected"])
            assert total(clients, "render_snapshot_hits_total", tier="redis") == 0
            assert (
                total(clients, "render_redis_errors_total", op="get")
                + total(clients, "render_redis_errors_total", op="set")
                > 0
            )


def _items(count: int) -> list[multimodal.ProcessedImage]:
    """`count` processed images (one real, the others with other digests: the codec checks only the digest)."""
    config = multimodal.VisionConfig(
        model_id="/m",
        image_token_id=7,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=65536,
        max_pixels=16777216,
    )
    import io

    import numpy as np
    from PIL import Image

    rgb = np.random.default_rng(3).integers(0, 256, (200, 300, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buffer, "PNG")
    item = multimodal.ImageProcessor(config)(buffer.getvalue(), tensors=True)
    return [dataclasses.replace(item, mm_hash=f"{index:064x}") for index in range(count)]


def test_image_tier_over_tls_uses_the_fast_paths(pki: Pki) -> None:
    with tls_redis(pki) as server:
        target = RedisTarget(
            url=f"rediss://127.0.0.1:{server.port}/0",
            ssl_ca_certs=str(pki.ca),
            ssl_certfile=str(pki.client_cert),
            ssl_keyfile=str(pki.client_key),
        )

        async def run() -> None:
            tier = imagecache.ImageTier(target, SECRET.encode(), "ns", Metrics())
            assert isinstance(tier._reader, imagecache.FastReader) and tier._reader.ssl_context is not None
            items = _items(3)
            await tier._write([(tier.key(i.mm_hash, True), i) for i in items], 0)
            found = await tier._fetch([i.mm_hash for i in items] + ["f" * 64], tensors=True)
            assert {d: (v.kwargs_json, v.metadata) for d, v in found.items()} == {
                i.mm_hash: (i.kwargs_json, i.metadata) for i in items
            }
            await tier.close()

        asyncio.run(run())
        assert len(server.client().keys("rs:mm:ns:t:*")) == 3


# -- Sentinel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["master killed", "SENTINEL FAILOVER"])
def test_sentinel_failover_during_streams(qwen3_model_dir: Path, model: Model, case, tmp_path: Path, fault) -> None:
    """Streams keep going through the failover (chunks replay while no master answers, never an
    error), and afterwards both replicas find the promoted replica by themselves."""
    with sentinel_set(tmp_path) as redis:
        options = {"redis_sentinel": [f"127.0.0.1:{redis.sentinel.port}"], "redis_sentinel_master": redis.name}
        with replicas(qwen3_model_dir, model, **options) as clients:
            before = alternate(clients, case)
            assert_matches_batch(before, case["expected"])
            assert redis.master.client().keys("rs:snap:*")
            hits = total(clients, "render_snapshot_hits_total", tier="redis")
            assert hits >= most(case)

            def fail_over(index: int, body: dict[str, Any]) -> None:
                if index != 5:
                    return
                if fault == "master killed":
                    redis.master.kill()
                else:
                    redis.sentinel.client().execute_command("SENTINEL FAILOVER", redis.name)

            # 20 ms between chunks: the stream spans the failover (about 1-2 s) and the cool-down.
            during = alternate(clients, case, pause=0.02, on_chunk=fail_over)
            assert_matches_batch(during, case["expected"])
            wait_until(lambda: redis.master_port() == redis.replica.port, 20, "the promoted replica")
            time.sleep(2.2)  # past the store's cool-down after the errors of the failover

            replays = total(clients, "render_stream_replays_total")
            after = alternate(clients, case)
            assert_matches_batch(after, case["expected"])
            assert total(clients, "render_snapshot_hits_total", tier="redis") - hits >= most(case)
            assert total(clients, "render_stream_replays_total") - replays <= most(case)
            assert redis.replica.client().keys(f"rs:snap:*{{{after['state']['rs_sid']}}}:*")


def test_image_tier_follows_a_sentinel_failover(tmp_path: Path) -> None:
    with sentinel_set(tmp_path) as redis:
        target = RedisTarget(sentinels=(("127.0.0.1", redis.sentinel.port),), sentinel_master=redis.name)

        async def run() -> None:
            tier = imagecache.ImageTier(target, SECRET.encode(), "ns", Metrics(), cooldown=0.1)
            first, second = _items(2)
            await tier._write([(tier.key(first.mm_hash, True), first)], 0)
            assert first.mm_hash in await tier._fetch([first.mm_hash], tensors=True)
            redis.master.client().execute_command("WAIT", 1, 2000)  # on the replica before it is promoted
            redis.sentinel.client().execute_command("SENTINEL FAILOVER", redis.name)
            wait_until(lambda: redis.master_port() == redis.replica.port, 20, "the promoted replica")
            key = tier.key(second.mm_hash, True)
            deadline = time.monotonic() + 10
            while not redis.replica.client().exists(key):  # the old master refuses writes now (READONLY)
                assert time.monotonic() < deadline, "writes never reached the promoted replica"
                await tier._write([(key, second)], 0)
                await asyncio.sleep(0.15)
            found = await tier._fetch([first.mm_hash, second.mm_hash], tensors=True)
            assert set(found) == {first.mm_hash, second.mm_hash}
            await tier.close()

        asyncio.run(run())


# -- Cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def test_snapshots_in_a_cluster_keep_each_stream_in_one_slot(
    qwen3_model_dir: Path, model: Model, case, cluster: Cluster
) -> None:
    options = {"redis_url": cluster.seed_url, "redis_cluster": True}
    with replicas(qwen3_model_dir, model, **options) as clients:
        streams = []
        for request in range(4):
            base = {**case["base"], "chat_request": {**CHAT_REQUEST, "user": f"u{request}"}}
            got = alternate(clients, {**case, "base": base})
            assert_matches_batch(got, case["expected"])
            streams.append(got["state"]["rs_sid"])
        assert total(clients, "render_snapshot_hits_total", tier="redis") >= most(case, 4)

        # Resharding mid-stream: the stream's slot (with its snapshot) moves to another node; redis-py
        # follows the MOVED, and the stream keeps resuming from Redis (the last chunks, at least:
        # 100 ms apart, they come after any cool-down a slow slot-map refresh may have caused).
        seen: dict[str, float] = {}

        def reshard(index: int, body: dict[str, Any]) -> None:
            if index == 5:
                slot = key_slot(body["stream_state"]["rs_sid"].encode())
                keys = cluster.node_for_slot(slot).client().execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
                assert keys, "the stream's snapshot is in its slot"
                _migrate_slot(cluster, slot, [k if isinstance(k, str) else k.decode() for k in keys], finish=True)
            if index == len(case["output"]) - 10:
                seen["hits"] = total(clients, "render_snapshot_hits_total", tier="redis")

        assert_matches_batch(alternate(clients, case, pause=0.1, on_chunk=reshard), case["expected"])
        assert total(clients, "render_snapshot_hits_total", tier="redis") - seen["hits"] >= 5
    for sid in streams:
        keys = [key.decode() for node in cluster.nodes for key in node.client().keys(f"rs:snap:*{{{sid}}}:*")]
        assert keys, sid
        for key in keys:  # the hash tag: a stream's keys hash like its id, and live on that slot's node
            assert key_slot(key.encode()) == key_slot(sid.encode())
            assert cluster.node_for_key(key).client().exists(key)


def _migrate_slot(cluster: Cluster, slot: int, keys: list[str], finish: bool) -> None:
    """Move `slot`'s `keys` to another master; `finish`: hand the slot over (then its old node
    answers MOVED), else leave it migrating (then ASK for the keys already moved)."""
    source = cluster.node_for_slot(slot)
    target = next(node for node in cluster.nodes if node is not source)
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    target.client().execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source.client().execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    if keys:
        source.client().execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    if finish:
        for node in cluster.nodes:
            node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)


def test_image_tier_in_a_cluster_splits_mget_per_slot_and_follows_moved_and_ask(cluster: Cluster) -> None:
    target = RedisTarget(url=cluster.seed_url, cluster=True)

    async def run() -> None:
        tier = imagecache.ImageTier(target, SECRET.encode(), "ns", Metrics())
        assert isinstance(tier._reader, imagecache.ClusterReader)
        items = _items(12)
        keys = [tier.key(item.mm_hash, True) for item in items]
        await tier._write(list(zip(keys, items, strict=True)), 0)
        owners = {cluster.node_for_key(key).port for key in keys}
        assert len(owners) >= 2, "12 keys on one node of 3: the test would prove nothing"
        for key in keys:
            assert cluster.node_for_key(key).client().exists(key), key
        # One MGET over every node, misses in between, back in the asked order.
        asked = [items[0].mm_hash, "e" * 64, *(item.mm_hash for item in items[1:]), "d" * 64]
        reader = tier._reader
        assert reader is not None
        values = await reader.mget([tier.key(digest, True) for digest in asked], 1.0)
        expected = {item.mm_hash: tier.codec.encode(tier.key(item.mm_hash, True), item) for item in items}
        assert [None if v is None else bytes(v) for v in values] == [expected.get(d) for d in asked]

        # MOVED: the slot of keys[0] now belongs to another node; the slot map is stale.
        moved_slot = key_slot(keys[0].encode())
        _migrate_slot(cluster, moved_slot, [keys[0]], finish=True)
        found = await tier._fetch([items[0].mm_hash, items[1].mm_hash], tensors=True)
        assert set(found) == {items[0].mm_hash, items[1].mm_hash}
        assert tier._slots is not None  # and the slot map was learnt again
        owner = tier._slots._cluster.nodes_manager.get_node_from_slot(moved_slot)
        assert int(owner.port) == cluster.node_for_slot(moved_slot).port
        # ASK: the slot of keys[2] is being migrated and its key already moved.
        _migrate_slot(cluster, key_slot(keys[2].encode()), [keys[2]], finish=False)
        found = await tier._fetch([items[2].mm_hash, items[3].mm_hash], tensors=True)
        assert set(found) == {items[2].mm_hash, items[3].mm_hash}
        # A write with a stale map after another slot moved goes where the slot now is.
        later = dataclasses.replace(items[0], mm_hash="c" * 64)
        later_key = tier.key(later.mm_hash, True)
        _migrate_slot(cluster, key_slot(later_key.encode()), [], finish=True)
        await tier._write([(later_key, later)], 0)
        assert cluster.node_for_key(later_key).client().exists(later_key)
        exported = generate_latest(tier.metrics.registry).decode()
        for op in ("get", "set"):
            assert metric(exported, "render_mm_cache_redis_errors_total", op=op) == 0, op
        await tier.close()

    asyncio.run(run())
