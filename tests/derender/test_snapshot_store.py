"""The snapshot codec and the in-process snapshot store: bounds, TTL, and fail-closed decoding."""

from __future__ import annotations

import hmac

import pytest

from render_service.derender import snapshots
from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotRejected


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(snapshots.time, "monotonic", fake)
    return fake


def test_bounded_by_bytes_oldest_written_first(clock: Clock) -> None:
    store = LocalStore(max_bytes=100, ttl=60)
    store.put("a", b"x" * 40)
    store.put("b", b"y" * 40)
    assert store.get("a") == b"x" * 40  # a read does not keep it: the oldest written goes first
    store.put("c", b"z" * 40)
    assert store.get("a") is None
    assert store.get("b") == b"y" * 40 and store.get("c") == b"z" * 40
    assert store.bytes == 80 and len(store) == 2


def test_bounded_by_entries(clock: Clock) -> None:
    store = LocalStore(max_entries=2, ttl=60)
    for key in "abc":
        store.put(key, key.encode())
    assert store.keys() == ["b", "c"]


def test_rewriting_a_key_counts_its_bytes_once_and_makes_it_newest(clock: Clock) -> None:
    store = LocalStore(max_bytes=100, ttl=60)
    store.put("a", b"x" * 40)
    store.put("b", b"y" * 40)
    store.put("a", b"w" * 50)
    assert store.bytes == 90 and store.keys() == ["b", "a"]
    store.put("c", b"z" * 10)  # 100 bytes: within the bound
    assert store.keys() == ["b", "a", "c"]
    store.delete("a")
    store.delete("missing")
    assert store.bytes == 50 and store.keys() == ["b", "c"]


def test_a_value_larger_than_the_bound_is_not_kept(clock: Clock) -> None:
    store = LocalStore(max_bytes=10, ttl=60)
    store.put("a", b"x" * 11)
    assert store.get("a") is None and store.bytes == 0


def test_entries_expire_after_the_ttl_from_their_write(clock: Clock) -> None:
    store = LocalStore(ttl=10)
    store.put("a", b"1")
    clock.now += 5
    store.put("b", b"2")
    assert store.get("a") == b"1"
    clock.now += 5  # a: 10 s after its write
    assert store.get("a") is None and store.get("b") == b"2"
    clock.now += 6
    store.put("c", b"3")  # b expired meanwhile: dropped by the write, unread
    assert store.keys() == ["c"] and store.bytes == 1


def test_codec_signs_with_hmac_sha256_and_fails_closed() -> None:
    key = b"k" * 32
    codec = SnapshotCodec(key)
    blob = codec.encode({"v": 3, "ids": [1, 2], "digest": b"\x00" * 32})
    assert blob[:32] == hmac.digest(key, blob[32:], "sha256")  # the format other replicas read
    assert codec.decode(blob) == {"v": 3, "ids": [1, 2], "digest": b"\x00" * 32}
    assert codec.decode(bytearray(blob)) == codec.decode(blob)
    for at in (0, 31, 32, len(blob) - 1):
        damaged = bytearray(blob)
        damaged[at] ^= 0x01
        with pytest.raises(SnapshotRejected) as rejected:
            codec.decode(bytes(damaged))
        assert rejected.value.reason == "bad_signature"
    with pytest.raises(SnapshotRejected) as rejected:
        SnapshotCodec(b"j" * 32).decode(blob)
    assert rejected.value.reason == "bad_signature"
    for malformed in (b"", blob[:33], "text"):
        with pytest.raises(SnapshotRejected) as rejected:
            codec.decode(malformed)  # type: ignore[arg-type]
        assert rejected.value.reason == "malformed"
    # each message's MAC starts from the keyed state, not from the previous message
    assert codec.encode({"a": 1}) == codec.encode({"a": 1})


def test_a_snapshots_request_bytes_round_trip_and_their_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from render_service import parsers
    from render_service.derender import pipeline
    from render_service.derender.detokenize import StopParams

    monkeypatch.setattr(pipeline, "_PACKED_REQUESTS", {})
    monkeypatch.setattr(pipeline, "_packed_bytes", 0)
    monkeypatch.setattr(pipeline, "_PACKED_BYTES_LIMIT", 2000)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def request(request_id: str) -> pipeline._StreamRequest:
        opts = parsers.RequestOptions(tool_choice="auto", has_tools=True, tools=tools)
        return pipeline._StreamRequest(opts, True, StopParams(stop_token_ids=(7,)), False, 5, True, request_id)

    made = request("r-0")
    packed = made.packed()
    assert packed is made.packed()  # encoded once
    read = pipeline._StreamRequest.from_packed(packed)
    assert read == made and read.to_obj() == made.to_obj() and read.packed() is packed
    assert pipeline._StreamRequest.from_packed(bytes(packed)) is read  # by the bytes, not the object
    for index in range(1, 40):
        pipeline._StreamRequest.from_packed(request(f"r-{index}").packed())
    assert pipeline._packed_bytes <= 2000
    assert pipeline._packed_bytes == sum(map(len, pipeline._PACKED_REQUESTS))
    assert packed not in pipeline._PACKED_REQUESTS  # the oldest went first
