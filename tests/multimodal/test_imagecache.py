"""imagecache: the Redis tier of the processed-image cache. The codec on its own, then real service
processes sharing a real redis-server: a repeated image processed by one replica is a Redis hit on
another (no local processing, byte-identical response), hashes-only and tensors entries stay apart,
tampered, foreign and moved entries are misses, other processor bounds never share, the flag off
talks to no Redis, and a Redis killed mid-way still gives correct 200s."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from render_service.model.example import build_example_model
from render_service.multimodal import imagecache, media
from render_service.multimodal import qwen3_vl as multimodal
from tests.helpers import metric, redis_server, service

SECRET = "imagecache-test-secret"
CONFIG = multimodal.VisionConfig(
    model_id="/m",
    image_token_id=7,
    patch_size=16,
    merge_size=2,
    temporal_patch_size=2,
    min_pixels=65536,
    max_pixels=16777216,
)

pytestmark = pytest.mark.timeout(300)


def _png(width: int, height: int, seed: int) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# -- codec ----------------------------------------------------------------------------------


def _item(tensors: bool = True, seed: int = 1) -> multimodal.ProcessedImage:
    processor = multimodal.ImageProcessor(CONFIG)
    return processor(_png(300, 200, seed), tensors=tensors)


def test_codec_round_trip_full_and_light() -> None:
    codec = imagecache.EntryCodec(b"k")
    full = _item()
    key = "rs:mm:ns:t:" + full.mm_hash
    back = codec.decode(key, codec.encode(key, full), full.mm_hash, tensors=True)
    assert (back.kwargs_json, back.metadata, back.num_tokens, back.nbytes) == (
        full.kwargs_json,
        full.metadata,
        full.num_tokens,
        full.nbytes,
    )
    light = imagecache.light(full)
    assert light == _item(tensors=False)  # what process_light gives, derived from the full item
    lkey = "rs:mm:ns:l:" + full.mm_hash
    assert codec.decode(lkey, codec.encode(lkey, light), full.mm_hash, tensors=False) == light


def test_codec_rejects_tampered_foreign_moved_and_cut_entries() -> None:
    codec = imagecache.EntryCodec(b"k")
    full, other = _item(seed=1), _item(seed=2)
    key, other_key = "rs:mm:ns:t:" + full.mm_hash, "rs:mm:ns:t:" + other.mm_hash
    blob = codec.encode(key, full)

    def reason(stored: bytes, at: str = key, digest: str = full.mm_hash, tensors: bool = True) -> str:
        with pytest.raises(imagecache.EntryRejected) as caught:
            codec.decode(at, stored, digest, tensors)
        return caught.value.reason

    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 1
    assert reason(bytes(flipped)) == "bad_mac"
    assert reason(imagecache.EntryCodec(b"other").encode(key, full)) == "bad_mac"  # another deployment's key
    assert reason(blob, at=other_key, digest=other.mm_hash) == "bad_mac"  # copied under another image's key
    assert reason(blob[:-10]) == "bad_mac"
    assert reason(blob[:20]) == "malformed"
    # Signed by us but the wrong kind for the key (cannot happen unless a bug writes it): still refused.
    light_blob = codec.encode(key, imagecache.light(full))
    assert reason(light_blob) == "malformed"
    assert reason(blob, tensors=False) == "malformed"


def test_identify_digest_is_the_processors_and_skips_rehashing() -> None:
    processor = multimodal.ImageProcessor(CONFIG)
    data = _png(120, 90, 5)
    digest = processor.identify(data)
    assert digest == processor(data).mm_hash == multimodal.mm_hash(data, "/m", False)
    # A digest handed in is trusted (what the Redis tier computed under the same options).
    fresh = multimodal.ImageProcessor(CONFIG)
    assert fresh(data, digest="f" * 64).mm_hash == "f" * 64
    assert fresh.cache.peek("f" * 64) is not None and fresh.cache.hits == 0


def test_fetched_images_lookup_is_by_identity() -> None:
    url = "data:image/png;base64,AAAA"
    fetched = media.FetchedImages({}, {})
    fetched.known[id(url)] = (url, b"x", "d")
    assert fetched.lookup(url) == (b"x", "d")
    assert fetched.lookup("".join(["data:image/png;base64,", "AAAA"])) is None  # equal, not the same object


# -- the MGET reader ---------------------------------------------------------------------------


def test_reader_and_writer_auth_select_values_and_a_cancelled_read() -> None:
    """Against a password-protected redis-server, db 2: values (CRLF inside included) and misses come
    back intact; a read cut off by its timeout drops that connection, the next read is clean."""
    import asyncio

    big = bytes(range(256)) * 40_000  # 10 MB, larger than any socket buffer
    import redis

    with redis_server() as server:
        server.client().config_set("requirepass", "pw")
        client = redis.Redis(host="127.0.0.1", port=server.port, password="pw", db=2)
        client.set("big", big)
        client.set("small", b"a\r\nb")

        async def run() -> None:
            reader = imagecache._reader(f"redis://:pw@127.0.0.1:{server.port}/2")
            assert isinstance(reader, imagecache.FastReader)
            got = await reader.mget(["big", "absent", "small"])
            assert bytes(got[0]) == big and got[1] is None and bytes(got[2]) == b"a\r\nb"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.mget(["big", "big", "big"]), 0.0001)
            assert [bytes(v) for v in await reader.mget(["small"])] == [b"a\r\nb"]
            assert reader._open == 1  # the cut connection was dropped, one clean one left
            reader.close()
            # The writer (its own blocking socket, in a thread) over the same AUTH and SELECT.
            writer = imagecache.Writer("127.0.0.1", server.port, db=2, password="pw")
            codec = imagecache.EntryCodec(b"k")
            full = _item()
            entries = [("t:" + full.mm_hash, full), ("l:" + full.mm_hash, imagecache.light(full))]
            await writer.set_all(codec, entries, 60)
            writer.close()
            for key, item in entries:
                assert client.get(key) == codec.encode(key, item) and 0 < client.ttl(key) <= 60
            wrong = imagecache._reader(f"redis://:nope@127.0.0.1:{server.port}/2")
            with pytest.raises(imagecache.RedisError):
                await wrong.mget(["small"])

        asyncio.run(run())
    assert imagecache._reader("unix:///run/redis.sock") is None  # unix sockets: redis-py reads


@pytest.mark.parametrize("reply", [b"*1\r\n$12x\r\n", b"*1\r\n$999999999999\r\n", b"*1\r\n%3\r\n"])
def test_reader_fails_fast_on_a_bad_reply(reply: bytes) -> None:
    """A garbled length, an absurd one (never allocated) or an unknown type from whatever answers on
    the Redis port: the read fails at once with RedisError (a counted error, then the cool-down),
    not at the caller's timeout."""
    import asyncio

    async def run() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(4096)
            writer.write(reply)
            await writer.drain()
            await reader.read(4096)  # hold the connection open: only the reply can end the read
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = imagecache._reader(f"redis://127.0.0.1:{port}/0")
        assert client is not None
        started = time.monotonic()
        with pytest.raises(imagecache.RedisError):
            await asyncio.wait_for(client.mget(["k"]), 5)
        assert time.monotonic() - started < 1
        client.close()
        server.close()

    asyncio.run(run())


# -- two replicas and one Redis ---------------------------------------------------------------


class _Images(http.server.BaseHTTPRequestHandler):
    body = _png(320, 240, 77)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinyvl"), "qwen3-vl")


def test_each_image_is_decoded_and_hashed_once(vl_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tier on, the async step's bytes and digests reach the render: one base64 decode and
    one blake3 per new image; a re-sent data: URL (the cache's URL memo) needs neither."""
    from starlette.testclient import TestClient

    from render_service.server.app import create_app
    from render_service.settings import Settings

    calls = {"mm_hash": 0, "decode": 0}

    def counted(name: str, module: Any, function: Any) -> None:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)

        monkeypatch.setattr(module, function.__name__, wrapper)

    counted("mm_hash", multimodal, multimodal.mm_hash)
    counted("decode", media, media.decode_data_url)
    urls = [_data_url(_png(100, 80, seed)) for seed in (20, 21)]
    with redis_server() as redis:
        settings = Settings(
            model=str(vl_model),
            served_model_name=["tinyvl"],
            redis_url=redis.url,
            snapshot_key=SECRET,
            mm_cache_redis=True,
            trust_request_mm_kwargs=True,
        ).validate()
        with TestClient(create_app(settings)) as client:
            for payload, work in (("tensors", 2), ("tensors", 0), ("none", 0)):  # processed, then memo hits
                before = dict(calls)
                response = client.post("/v1/chat/completions/render", json=_request(urls, payload))
                assert response.status_code == 200, response.text
                assert {k: calls[k] - before[k] for k in calls} == {"mm_hash": work, "decode": work}
            # Request kwargs bypass the memo: the tier's step decodes and hashes once, the render reuses it.
            before = dict(calls)
            body = {**_request(urls, "none"), "mm_processor_kwargs": {"max_pixels": 70000}}
            assert client.post("/v1/chat/completions/render", json=body).status_code == 200
            assert {k: calls[k] - before[k] for k in calls} == {"mm_hash": 2, "decode": 2}


@pytest.fixture(scope="module")
def cluster(vl_model: Path) -> Iterator[dict[str, Any]]:
    model = vl_model
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    common = (
        "--served-model-name",
        "tinyvl",
        "--snapshot-key",
        SECRET,
        "--media-allow-private-addresses",
        "--workers",
        "1",
    )  # one registry: /metrics counts every request
    try:
        with redis_server() as redis, ExitStack() as stack:
            on = (*common, "--redis-url", redis.url, "--mm-cache-redis")
            flags = {
                "a": on,
                "b": on,
                "bounded": (*on, "--mm-processor-kwargs", '{"max_pixels": 65536}'),
                "off": (*common, "--redis-url", redis.url),
            }
            contexts = {name: service(model, *args) for name, args in flags.items()}
            with ThreadPoolExecutor(len(contexts)) as pool:  # start together: they load in parallel
                started = {name: pool.submit(ctx.__enter__) for name, ctx in contexts.items()}
            urls = {}
            for name, future in started.items():
                if future.exception() is None:  # stopped by the stack, whatever happens next
                    stack.push(contexts[name].__exit__)
                    urls[name] = future.result()
            for future in started.values():
                future.result()  # a service that did not start fails the fixture
            yield {**urls, "redis": redis, "image_url": f"http://127.0.0.1:{httpd.server_address[1]}/image.png"}
    finally:
        httpd.shutdown()


def _request(urls: list[str], payload: str = "tensors") -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {
        "model": "tinyvl",
        "mm_payload": payload,
        "messages": [{"role": "user", "content": [*content, {"type": "text", "text": "What is it?"}]}],
    }


def _render(url: str, body: dict[str, Any]) -> bytes:
    response = httpx.post(f"{url}/v1/chat/completions/render", json=body, headers={"x-request-id": "fixed"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.content


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    names = (
        "render_mm_cache_hits_total",
        "render_mm_cache_misses_total",
        "render_mm_cache_redis_hits_total",
        "render_mm_cache_redis_misses_total",
        "render_mm_cache_redis_fetched_bytes_total",
    )
    values = {name: metric(text, name) for name in names}
    values["stored"] = sum(metric(text, "render_mm_cache_redis_stored_total", kind=k) for k in ("tensors", "light"))
    values["errors"] = sum(metric(text, "render_mm_cache_redis_errors_total", op=o) for o in ("get", "set"))
    values["rejected"] = sum(
        metric(text, "render_mm_cache_redis_rejected_total", reason=r) for r in ("bad_mac", "malformed", "version")
    )
    return values


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after}


def _wait_stored(url: str, before: dict[str, float], count: int) -> None:
    """Write-behind: the write may finish after the response (bounded wait); poll its counter."""
    deadline = time.monotonic() + 10
    while _metrics(url)["stored"] - before["stored"] < count:
        assert time.monotonic() < deadline, "the processed image was never written to Redis"
        time.sleep(0.02)


def test_repeated_image_on_another_replica_is_a_redis_hit(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    urls = [_data_url(_png(640, 360, 1)), cluster["image_url"]]
    before_a, before_b = _metrics(a), _metrics(b)
    first = _render(a, _request(urls))
    _wait_stored(a, before_a, 4)  # two images, each as tensors and light entries
    assert _delta(_metrics(a), before_a)["render_mm_cache_misses_total"] == 2
    second = _render(b, _request(urls))
    assert second == first
    moved = _delta(_metrics(b), before_b)
    assert moved["render_mm_cache_redis_hits_total"] == 2, moved
    assert moved["render_mm_cache_misses_total"] == 0  # nothing processed on b
    assert moved["render_mm_cache_redis_fetched_bytes_total"] > 640 * 352 * 6  # the tensors came over
    # The next turn on b is a local hit: Redis is not asked again.
    assert _render(b, _request(urls)) == first
    again = _delta(_metrics(b), before_b)
    assert again["render_mm_cache_redis_hits_total"] == 2 and again["render_mm_cache_redis_misses_total"] == 0


def test_hashes_only_then_tensors(cluster: dict[str, Any]) -> None:
    a, b = cluster["a"], cluster["b"]
    urls = [_data_url(_png(400, 300, 2))]
    before_a, before_b = _metrics(a), _metrics(b)
    light = _render(a, _request(urls, "none"))
    _wait_stored(a, before_a, 1)  # the light entry only
    assert _render(b, _request(urls, "none")) == light
    assert _delta(_metrics(b), before_b)["render_mm_cache_redis_hits_total"] == 1
    assert _delta(_metrics(b), before_b)["render_mm_cache_misses_total"] == 0
    # A tensors request is never served by a light entry: b processes and stores the tensors...
    mid_b = _metrics(b)
    full = _render(b, _request(urls))
    moved = _delta(_metrics(b), mid_b)
    assert moved["render_mm_cache_redis_misses_total"] == 1 and moved["render_mm_cache_misses_total"] == 1
    _wait_stored(b, mid_b, 2)
    # ...which a, holding only the light item, then takes from Redis.
    mid_a = _metrics(a)
    assert _render(a, _request(urls)) == full
    moved = _delta(_metrics(a), mid_a)
    assert moved["render_mm_cache_redis_hits_total"] == 1 and moved["render_mm_cache_misses_total"] == 0


def test_messages_and_responses_renders_share_the_entries(cluster: dict[str, Any]) -> None:
    """The image a chat render processed on a is a Redis hit for Messages and Responses renders on b
    (their converted conversations hand the render the same URL strings the tier saw)."""
    a, b = cluster["a"], cluster["b"]
    data = _png(300, 240, 8)
    before_a = _metrics(a)
    chat = httpx.post(f"{a}/v1/chat/completions/render", json=_request([_data_url(data)])).json()
    _wait_stored(a, before_a, 2)
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }
    requests = [
        (
            "/v1/messages/render",
            {
                "model": "tinyvl",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What is it?"}]}],
            },
        ),
        (
            "/v1/responses/render",
            {
                "model": "tinyvl",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": _data_url(data)},
                            {"type": "input_text", "text": "What is it?"},
                        ],
                    }
                ],
            },
        ),
    ]
    # Messages: from Redis; Responses next: a local hit (the Messages render put it there).
    for (path, body), from_redis in zip(requests, (1, 0), strict=True):
        before = _metrics(b)
        response = httpx.post(f"{b}{path}", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["features"]["kwargs_data"] == chat["features"]["kwargs_data"]
        moved = _delta(_metrics(b), before)
        assert moved["render_mm_cache_redis_hits_total"] == from_redis
        assert moved["render_mm_cache_hits_total"] == 1 and moved["render_mm_cache_misses_total"] == 0


def _entry_keys(redis: Any, digest: str) -> list[bytes]:
    return sorted(redis.client().scan_iter(match=f"rs:mm:*:*:{digest}"))


def test_tampered_foreign_and_moved_entries_are_misses(cluster: dict[str, Any]) -> None:
    a, b, redis = cluster["a"], cluster["b"], cluster["redis"]
    images = [_png(256, 256, seed) for seed in (10, 11, 12)]
    # The server's hash of each image (the model path is the served folder's).
    bodies = [_render(a, _request([_data_url(data)])) for data in images]
    digests = [
        httpx.post(f"{a}/v1/chat/completions/render", json=_request([_data_url(d)], "none")).json()["features"][
            "mm_hashes"
        ]["image"][0]
        for d in images
    ]
    client = redis.client()
    deadline = time.monotonic() + 10
    while not all(len(_entry_keys(redis, d)) == 2 for d in digests):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    tkeys = [next(k for k in _entry_keys(redis, d) if b":t:" in k) for d in digests]
    # 1: a flipped byte; 2: re-signed with another deployment's key; 3: image 1's entry under image 3's key.
    genuine = [client.get(key) for key in tkeys]
    blob = bytearray(genuine[0])
    blob[len(blob) // 2] ^= 0x20
    client.set(tkeys[0], bytes(blob))
    ours = imagecache.EntryCodec(SECRET.encode())
    item = ours.decode(tkeys[1].decode(), genuine[1], digests[1], True)
    client.set(tkeys[1], imagecache.EntryCodec(b"someone else").encode(tkeys[1].decode(), item))
    client.set(tkeys[2], genuine[0])
    before = _metrics(b)
    for data, body in zip(images, bodies, strict=True):
        assert _render(b, _request([_data_url(data)])) == body  # processed on b: the right tensors
    moved = _delta(_metrics(b), before)
    assert moved["rejected"] == 3 and moved["render_mm_cache_redis_hits_total"] == 0
    assert moved["render_mm_cache_misses_total"] == 3
    _wait_stored(b, before, 6)  # b's good entries replace the bad ones
    assert all(ours.decode(k.decode(), client.get(k), d, True) for k, d in zip(tkeys, digests, strict=True))


def test_other_processor_bounds_never_share(cluster: dict[str, Any]) -> None:
    a, bounded = cluster["a"], cluster["bounded"]
    urls = [_data_url(_png(640, 480, 3))]
    before_a = _metrics(a)
    wide = httpx.post(f"{a}/v1/chat/completions/render", json=_request(urls)).json()
    _wait_stored(a, before_a, 2)
    before = _metrics(bounded)
    small = httpx.post(f"{bounded}/v1/chat/completions/render", json=_request(urls)).json()
    moved = _delta(_metrics(bounded), before)
    assert moved["render_mm_cache_redis_hits_total"] == 0 and moved["render_mm_cache_misses_total"] == 1
    _wait_stored(bounded, before, 2)  # its own entries, next to a's
    assert len(_entry_keys(cluster["redis"], small["features"]["mm_hashes"]["image"][0])) == 4
    # Same mm_hash (server kwargs are not hashed, as in vLLM), other tensors.
    assert small["features"]["mm_hashes"] == wide["features"]["mm_hashes"]
    assert small["features"]["mm_placeholders"] != wide["features"]["mm_placeholders"]


def test_flag_off_sends_nothing_to_redis(cluster: dict[str, Any]) -> None:
    off, redis = cluster["off"], cluster["redis"]
    client = redis.client()

    def calls() -> dict[str, int]:  # every command Redis served, but the INFO asking
        return {name: stat["calls"] for name, stat in client.info("commandstats").items() if name != "cmdstat_info"}

    before = calls()
    urls = [_data_url(_png(200, 200, 4)), cluster["image_url"]]
    for payload in ("tensors", "none", "tensors"):
        _render(off, _request(urls, payload))
    assert calls() == before and "cmdstat_mget" in before  # the replicas with the flag did use it
    values = _metrics(off)
    assert values["render_mm_cache_redis_hits_total"] == values["render_mm_cache_redis_misses_total"] == 0


def test_redis_killed_midway_still_renders_correctly(cluster: dict[str, Any]) -> None:
    """Last in this module: it stops the shared redis-server."""
    a, b, redis = cluster["a"], cluster["b"], cluster["redis"]
    urls = [_data_url(_png(500, 300, 6))]
    expected = _render(a, _request(urls))
    redis.kill()
    before = _metrics(b)
    start = time.monotonic()
    for _ in range(3):  # the first pays the timeout, the next ones the cool-down (no Redis call)
        assert _render(b, _request(urls)) == expected
    assert time.monotonic() - start < 5
    assert _render(b, _request([_data_url(_png(90, 90, 7))], "none"))  # and a new one, hashes only
    moved = _delta(_metrics(b), before)
    assert moved["errors"] >= 1 and moved["render_mm_cache_redis_hits_total"] == 0
    assert moved["render_mm_cache_misses_total"] == 2  # processed once, then a local hit


# -- timeouts and cool-downs ------------------------------------------------------------------


def _resp_value(value: bytes) -> bytes:
    return b"*1\r\n$%d\r\n%s\r\n" % (len(value), value)


def test_reader_idle_timeout_lets_a_slow_transfer_finish_and_stops_a_silent_one() -> None:
    """A value trickling in for longer than the idle timeout arrives; silence fails after one idle
    timeout; with every connection busy, a read gives up with Busy (a TimeoutError: load)."""
    import asyncio

    value = bytes(range(256)) * 64  # 16 KB, sent in 8 pieces 0.05 s apart: 0.4 s in all

    async def run() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while request := await reader.read(4096):
                if b"slow" in request:
                    reply = _resp_value(value)
                    for start in range(0, len(reply), len(reply) // 8 + 1):
                        writer.write(reply[start : start + len(reply) // 8 + 1])
                        await writer.drain()
                        await asyncio.sleep(0.05)
                # "silent": no answer at all
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader = imagecache.FastReader("127.0.0.1", port, max_connections=1)
        got = await reader.mget(["slow"], idle_timeout=0.2)
        assert bytes(got[0]) == value
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            await reader.mget(["silent"], idle_timeout=0.2)
        assert not isinstance(raised.value, imagecache.Busy) and 0.15 < time.monotonic() - started < 1.0
        slow = asyncio.ensure_future(reader.mget(["slow"], idle_timeout=0.2))
        await asyncio.sleep(0.05)
        with pytest.raises(imagecache.Busy):
            await reader.mget(["slow"], idle_timeout=0.1)
        assert bytes((await slow)[0]) == value
        reader.close()
        server.close()

    asyncio.run(run())


def test_tier_cools_reads_down_only_after_repeated_timeouts_and_writes_separately() -> None:
    import asyncio

    from render_service.server.metrics import Metrics

    async def run() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # never answers

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        tier = imagecache.ImageTier(f"redis://127.0.0.1:{port}/0", b"k", "ns", Metrics(), timeout=0.05)
        for _ in range(imagecache.TIMEOUTS_BEFORE_COOLDOWN):
            assert tier.available  # still asked after 1 and 2 timeouts
            assert await tier._fetch(["a" * 64], tensors=False) == {}
        assert not tier.available
        # A failed write cools writes down, not reads.
        other = imagecache.ImageTier(f"redis://127.0.0.1:{port}/0", b"k", "ns", Metrics())
        other._failed("set", ConnectionResetError("gone"))
        assert other.available and not other._available("set")
        server.close()

    asyncio.run(run())


def test_writer_reconnects_when_redis_closed_its_idle_socket() -> None:
    import asyncio

    with redis_server() as server:
        server.client().config_set("timeout", "1")  # Redis drops clients idle for 1 s

        async def run() -> None:
            writer = imagecache.Writer("127.0.0.1", server.port)
            codec = imagecache.EntryCodec(b"k")
            first, second = _item(seed=1), _item(seed=2)
            await writer.set_all(codec, [("t:1", first)], 60)
            await asyncio.sleep(2.5)
            await writer.set_all(codec, [("t:2", second)], 60)  # the kept socket is dead by now
            writer.close()
            assert server.client().get("t:2") == codec.encode("t:2", second)

        asyncio.run(run())
