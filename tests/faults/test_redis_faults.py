"""Redis faults under a live stream, with a real redis-server behind a switchable proxy: slow, silent,
full (maxmemory + noeviction), speaking garbage, or handing back snapshots that are not the
stream's own. Every stream's answer must equal the batch (no-Redis) answer, the added latency must
stay bounded, and the metrics and logs must say what happened."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import exceptions as redis_exceptions

from render_service.derender.snapshots import SnapshotCodec
from tests.faults.servers import FaultProxy, fake_redis, service_process
from tests.helpers import chunk_body, drive_stream, metric, redis_server

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
SNAPSHOT_KEY = "faults-secret"
FLAGS = (
    "--served-model-name",
    "tinyqwen3",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "hermes",
    "--enable-auto-tool-choice",
    "--max-model-len",
    "8192",
    "--snapshot-key",
    SNAPSHOT_KEY,
    "--workers",
    "1",
)
COOLDOWN = 2.0  # RedisStore's skip after a failure
GET_TIMEOUT = 0.05  # RedisStore's get timeout; a write is awaited at most 5 ms

pytestmark = [pytest.mark.timeout(300), pytest.mark.redis]


class Cluster:
    """Two replicas sharing one Redis through a FaultProxy; streams alternate between them."""

    def __init__(self, redis: Any, proxy: FaultProxy, urls: list[str], logs: list[Any], case: dict[str, Any]) -> None:
        self.redis, self.proxy, self.urls, self.logs, self.case = redis, proxy, urls, logs, case
        self.http = httpx.Client(timeout=30)

    def metrics(self) -> list[str]:
        return [self.http.get(f"{url}/metrics").text for url in self.urls]

    def total(self, name: str, **labels: str) -> float:
        return sum(metric(text, name, **labels) for text in self.metrics())

    def stream(self) -> tuple[dict[str, Any], list[float]]:
        latencies: list[float] = []

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            start = time.perf_counter()
            response = self.http.post(f"{self.urls[index % 2]}/v1/chat/completions/derender", json=body)
            latencies.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, self.case["base"], self.case["output"], [1] * len(self.case["output"]))
        return got, latencies

    def settle(self) -> None:
        """Back to a healthy Redis, and past every replica's cool-down."""
        self.proxy.reset()
        time.sleep(COOLDOWN + 0.3)


def report(fault: str, latencies: list[float], baseline: float | None = None) -> None:
    """With RENDER_FAULTS_REPORT=FILE, record the chunk latencies each fault produced (README table)."""
    path = os.environ.get("RENDER_FAULTS_REPORT")
    if path:
        with open(path, "a") as handle:
            handle.write(
                json.dumps(
                    {
                        "fault": fault,
                        "chunks": len(latencies),
                        "median_ms": statistics.median(latencies) * 1e3,
                        "max_ms": max(latencies) * 1e3,
                        "baseline_median_ms": (baseline * 1e3 if baseline is not None else None),
                    }
                )
                + "\n"
            )


def assert_matches_batch(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got["reasoning"] == expected["reasoning"]
    assert got["content"] == expected["content"]
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]
    ]
    assert got["finish_reason"] == "tool_calls"


@pytest.fixture(scope="module")
def cluster(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("logs")
    with (
        redis_server() as redis,
        FaultProxy(redis.port) as proxy,
        service_process(qwen3_model_dir, logs / "a.log", *FLAGS, "--redis-url", proxy.url) as a,
        service_process(qwen3_model_dir, logs / "b.log", *FLAGS, "--redis-url", proxy.url) as b,
        httpx.Client(timeout=30) as http,
    ):
        rendered = http.post(f"{a.url}/v1/chat/completions/render", json=CHAT_REQUEST).json()
        output = http.post(f"{a.url}/tokenize", json={"prompt": OUTPUT_TEXT}).json()["tokens"]
        batch = http.post(
            f"{a.url}/v1/chat/completions/derender",
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
        case = {"base": base, "output": output, "expected": batch["choices"][0]["message"]}
        cluster = Cluster(redis, proxy, [a.url, b.url], [a, b], case)
        # Warm both replicas (template, tokenizer, Redis connections) so the baseline is a fair one.
        cluster.stream()
        yield cluster
        cluster.http.close()


@pytest.fixture(scope="module")
def baseline(cluster: Cluster) -> float:
    """Median chunk latency with a healthy Redis (every chunk after the first resumes from Redis)."""
    hits = cluster.total("render_snapshot_hits_total", tier="redis")
    got, latencies = cluster.stream()
    assert_matches_batch(got, cluster.case["expected"])
    assert cluster.total("render_snapshot_hits_total", tier="redis") - hits >= len(latencies) - 2
    report("healthy Redis", latencies)
    return statistics.median(latencies)


def test_redis_slower_than_usual_is_still_used(cluster: Cluster, baseline: float) -> None:
    cluster.proxy.delay = 0.01  # 10 ms: slow, but inside the 50 ms budget
    try:
        hits = cluster.total("render_snapshot_hits_total", tier="redis")
        got, latencies = cluster.stream()
        assert_matches_batch(got, cluster.case["expected"])
        assert cluster.total("render_snapshot_hits_total", tier="redis") - hits >= len(latencies) // 2
        assert statistics.median(latencies) < baseline + 0.25
        report("Redis +10 ms per reply", latencies, baseline)
    finally:
        cluster.settle()


@pytest.mark.parametrize("fault", ["slow (1 s per reply)", "silent (never answers)"])
def test_redis_past_its_timeout_adds_bounded_latency(cluster: Cluster, baseline: float, fault: str) -> None:
    errors = cluster.total("render_redis_errors_total", op="get") + cluster.total("render_redis_errors_total", op="set")
    replays = cluster.total("render_stream_replays_total")
    if fault.startswith("slow"):
        cluster.proxy.delay = 1.0
    else:
        cluster.proxy.blackhole = True
    try:
        got, latencies = cluster.stream()
        assert_matches_batch(got, cluster.case["expected"])
        assert (
            cluster.total("render_redis_errors_total", op="get") + cluster.total("render_redis_errors_total", op="set")
            > errors
        )
        assert cluster.total("render_stream_replays_total") > replays
        # A chunk waits at most the get timeout (then the replica skips Redis for 2 s): the worst
        # chunk stays far below the fault's own delay, whatever the machine's noise.
        assert max(latencies) < 0.6, max(latencies)
        assert statistics.median(latencies) < baseline + 0.25
        assert any("using replay" in log.log_text() for log in cluster.logs)
        report(f"Redis {fault}", latencies, baseline)
    finally:
        cluster.settle()
    # Healthy again: the replicas go back to Redis once their cool-down is over.
    hits = cluster.total("render_snapshot_hits_total", tier="redis")
    got, _ = cluster.stream()
    assert_matches_batch(got, cluster.case["expected"])
    assert cluster.total("render_snapshot_hits_total", tier="redis") > hits


def test_redis_dropping_connections_mid_stream(cluster: Cluster) -> None:
    state = None
    output = cluster.case["output"]
    content = []
    for index, token in enumerate(output):
        if index % 7 == 3:
            cluster.proxy.drop_connections()
        last = index == len(output) - 1
        body = chunk_body(cluster.case["base"], [token], "stop" if last else None, state)
        response = cluster.http.post(f"{cluster.urls[index % 2]}/v1/chat/completions/derender", json=body)
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
        content.append(response.json()["chunk"]["choices"][0]["delta"])
    cluster.settle()
    got, _ = cluster.stream()
    assert_matches_batch(got, cluster.case["expected"])


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"-ERR who are you\r\n", b"$12\r\nnot-a-snapsh\r\n", b"\x00\xff" * 64],
)
def test_redis_answering_garbage(cluster: Cluster, reply: bytes) -> None:
    before = {name: cluster.total(name) for name in ("render_stream_replays_total",)}
    rejected = sum(cluster.total("render_snapshot_rejected_total", reason=r) for r in ("malformed", "bad_signature"))
    errors = cluster.total("render_redis_errors_total", op="get") + cluster.total("render_redis_errors_total", op="set")
    cluster.proxy.garbage = reply
    cluster.proxy.drop_connections()
    try:
        got, latencies = cluster.stream()
        assert_matches_batch(got, cluster.case["expected"])
        assert cluster.total("render_stream_replays_total") > before["render_stream_replays_total"]
        now_rejected = sum(
            cluster.total("render_snapshot_rejected_total", reason=r) for r in ("malformed", "bad_signature")
        )
        now_errors = cluster.total("render_redis_errors_total", op="get") + cluster.total(
            "render_redis_errors_total", op="set"
        )
        # Either the client refuses the reply (an error) or the codec refuses the value (a rejection).
        assert now_errors > errors or now_rejected > rejected
        assert max(latencies) < 0.6, max(latencies)
        report(f"Redis answering {reply[:16]!r}", latencies)
    finally:
        cluster.settle()


def test_fake_redis_at_start(qwen3_model_dir: Path, tmp_path: Path) -> None:
    """A replica pointed at something that is not Redis starts, serves, and counts the errors."""
    with (
        fake_redis(b"SSH-2.0-OpenSSH_9.6\r\n") as url,
        service_process(qwen3_model_dir, tmp_path / "s.log", *FLAGS, "--redis-url", url) as service,
        httpx.Client(timeout=30) as http,
    ):
        rendered = http.post(f"{service.url}/v1/chat/completions/render", json=CHAT_REQUEST)
        assert rendered.status_code == 200
        output = http.post(f"{service.url}/tokenize", json={"prompt": OUTPUT_TEXT}).json()["tokens"]
        base = {"model": "tinyqwen3", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered.json()["token_ids"]}

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            # A new connection per chunk, and every chunk's snapshot dropped: each one must reach Redis.
            response = http.post(f"{service.url}/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, base, output, [len(output) // 2, len(output) - len(output) // 2])
        assert got["finish_reason"] == "tool_calls" and got["tool_calls"][0]["name"] == "lookup"
        assert metric(http.get(f"{service.url}/metrics").text, "render_redis_errors_total", op="set") >= 1


def test_redis_full_noeviction(cluster: Cluster) -> None:
    client = cluster.redis.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used + (1 << 20)))
    try:
        filler = b"x" * 4096
        with pytest.raises(redis_exceptions.OutOfMemoryError):
            for index in range(10_000):
                client.set(f"filler:{index}", filler)
        errors = cluster.total("render_redis_errors_total", op="set")
        replays = cluster.total("render_stream_replays_total")
        got, latencies = cluster.stream()
        assert_matches_batch(got, cluster.case["expected"])
        assert cluster.total("render_redis_errors_total", op="set") > errors  # OOM command not allowed
        assert cluster.total("render_stream_replays_total") > replays
        assert max(latencies) < 0.6, max(latencies)
        report("Redis full (maxmemory, noeviction)", latencies)
    finally:
        client.config_set("maxmemory", "0")
        for key in client.scan_iter("filler:*", count=1000):
            client.delete(key)
        cluster.settle()


def _stream_prefix(cluster: Cluster, tokens: int) -> tuple[dict[str, Any], list[bytes]]:
    """Drive the first chunks on replica A; return the last stream_state and each chunk's Redis value,
    captured as it was written (as someone with access to Redis could)."""
    client = cluster.redis.client()
    state = None
    values = []
    for index in range(tokens):
        body = chunk_body(cluster.case["base"], [cluster.case["output"][index]], None, state)
        response = cluster.http.post(f"{cluster.urls[0]}/v1/chat/completions/derender", json=body)
        assert response.status_code == 200
        state = response.json()["stream_state"]
        values.append(_wait_for_value(client, f"rs:snap:*:{{{state['rs_sid']}}}:{state['rs_pos']}"))
    return state, values


def _wait_for_value(client: Any, pattern: str) -> bytes:
    deadline = time.monotonic() + 5  # writes are asynchronous
    while time.monotonic() < deadline:
        for key in client.keys(pattern):
            if (value := client.get(key)) is not None:
                return value
        time.sleep(0.005)
    raise AssertionError(f"no Redis value for {pattern}")


@pytest.mark.parametrize(
    "forgery", ["older snapshot of the same stream", "snapshot of another stream", "snapshot from another fingerprint"]
)
def test_a_snapshot_that_is_not_this_chunks_is_rejected(cluster: Cluster, forgery: str) -> None:
    client = cluster.redis.client()
    state, values = _stream_prefix(cluster, 6)
    key = client.keys(f"rs:snap:*:{{{state['rs_sid']}}}:{state['rs_pos']}")[0]
    if forgery == "older snapshot of the same stream":
        value = values[2]  # genuine and signed, but for an earlier position
    elif forgery == "snapshot of another stream":
        _, other = _stream_prefix(cluster, 6)
        value = other[-1]  # genuine, same position, another stream
    else:
        codec = SnapshotCodec(SNAPSHOT_KEY.encode())
        snapshot = codec.decode(values[-1])
        snapshot["fp"] = "0" * 32  # validly signed with the shared key, but made under another configuration
        value = codec.encode(snapshot)
    client.set(key, value)
    rejected = cluster.total("render_snapshot_rejected_total", reason="mismatch")
    replays = cluster.total("render_stream_replays_total")
    # The next chunk goes to replica B, which has no local copy: it must read (and refuse) the forgery.
    output = cluster.case["output"]
    for index in range(6, len(output)):
        last = index == len(output) - 1
        body = chunk_body(cluster.case["base"], [output[index]], "stop" if last else None, state)
        response = cluster.http.post(
            f"{cluster.urls[1 if index == 6 else index % 2]}/v1/chat/completions/derender", json=body
        )
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
        if index == 6:
            assert cluster.total("render_snapshot_rejected_total", reason="mismatch") == rejected + 1
            assert cluster.total("render_stream_replays_total") == replays + 1
    # The whole stream, re-driven through the same replicas, still equals the batch answer.
    got, _ = cluster.stream()
    assert_matches_batch(got, cluster.case["expected"])
