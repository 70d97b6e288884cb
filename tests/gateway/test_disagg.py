"""Prefill/decode disaggregation and prefix affinity, against scripted engines over real HTTP: the
two hops and their bodies as each engine recorded them, the fallback to recompute, and the
same-prefix-same-engine rule."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from render_service.gateway.disagg import REMOTE_DECODE
from render_service.model.loader import Model
from tests.gateway.conftest import MODEL, gateway_app, gateway_settings, sse_events, tokens, unused_url
from tests.gateway.scripted_engine import Script, ScriptedEngine, scripted_engine

EOS = 151645  # <|im_end|>
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 30}
HANDOFF = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "prefill-engine-0",
    "remote_block_ids": [3, 4, 5],
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "remote_request_id": "abc",
    "tp_size": 1,
}


@pytest.fixture(scope="module")
def pd_engines() -> Iterator[tuple[ScriptedEngine, ScriptedEngine]]:
    with scripted_engine(Script([])) as prefill, scripted_engine(Script([])) as decode:
        yield prefill, decode


@pytest.fixture(autouse=True)
def reset(pd_engines: tuple[ScriptedEngine, ScriptedEngine]) -> None:
    for engine in pd_engines:
        engine.scripts.clear()
        engine.records.clear()
        engine.healthy = True
    pd_engines[0].default = Script([42], finish_reason="length", kv_transfer_params=HANDOFF)


def _pd_gateway(model_dir: Path, model: Model, prefill: list[str], decode: list[str], **extra: Any) -> Any:
    settings = gateway_settings(model_dir, [], prefill_engine=prefill, decode_engine=decode, **extra)
    return gateway_app(model, settings)


@pytest.fixture(scope="module")
def pd_gateway(
    qwen3_model_dir: Path, loaded_model: Model, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> Iterator[str]:
    with _pd_gateway(qwen3_model_dir, loaded_model, [pd_engines[0].url], [pd_engines[1].url]) as url:
        yield url


def _check_hops(prefill: ScriptedEngine, decode: ScriptedEngine, stream: bool) -> None:
    (first,) = [r.body for r in prefill.records]
    (second,) = [r.body for r in decode.records]
    # The prefill: one token, not streamed, do_remote_decode; the prompt as rendered.
    assert first["kv_transfer_params"] == REMOTE_DECODE
    assert first["sampling_params"]["max_tokens"] == 1 and first["stream"] is False
    assert first["stream_options"] is None
    # The decode: the same prompt ids and request id, the client's sampling, the prefill's hand-off.
    assert second["kv_transfer_params"] == HANDOFF
    assert second["token_ids"] == first["token_ids"] and second["request_id"] == first["request_id"]
    assert second["sampling_params"]["max_tokens"] == 30 and second["stream"] is stream
    rest = {
        k: v
        for k, v in second.items()
        if k not in ("kv_transfer_params", "sampling_params", "stream", "stream_options")
    }
    assert rest == {
        k: v for k, v in first.items() if k not in ("kv_transfer_params", "sampling_params", "stream", "stream_options")
    }


def test_two_hops_non_streaming(pd_gateway: str, pd_engines: tuple[ScriptedEngine, ScriptedEngine]) -> None:
    prefill, decode = pd_engines
    ids = tokens(pd_gateway, "Decoded remotely")
    decode.default = Script([*ids, EOS])
    answer = httpx.post(f"{pd_gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Decoded remotely"
    assert answer.json()["usage"]["completion_tokens"] == len(ids) + 1  # the prefill's token is not counted
    _check_hops(prefill, decode, stream=False)
    assert prefill.outcomes() == ["finished"] and decode.outcomes() == ["finished"]


def test_two_hops_streaming(pd_gateway: str, pd_engines: tuple[ScriptedEngine, ScriptedEngine]) -> None:
    prefill, decode = pd_engines
    ids = tokens(pd_gateway, "Streamed after the hand-off")
    decode.default = Script([*ids, EOS], chunk_size=2)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(f"{pd_gateway}/v1/chat/completions", json=body, timeout=10))
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert text == "Streamed after the hand-off" and events[-1] == "[DONE]"
    _check_hops(prefill, decode, stream=True)


def test_messages_and_responses_through_the_pools(
    pd_gateway: str, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> None:
    prefill, decode = pd_engines
    decode.default = Script([*tokens(pd_gateway, "Both"), EOS])
    messages = {"model": MODEL, "max_tokens": 30, "messages": [{"role": "user", "content": "Hi!"}]}
    assert httpx.post(f"{pd_gateway}/v1/messages", json=messages, timeout=10).json()["content"][0]["text"] == "Both"
    responses = {"model": MODEL, "input": "Hi!", "max_output_tokens": 30}
    answer = httpx.post(f"{pd_gateway}/v1/responses", json=responses, timeout=10).json()
    assert answer["output"][0]["content"][0]["text"] == "Both"
    assert [r.body["kv_transfer_params"] for r in decode.records] == [HANDOFF, HANDOFF]
    assert len(prefill.records) == 2


def test_prefill_errors(pd_gateway: str, pd_engines: tuple[ScriptedEngine, ScriptedEngine]) -> None:
    prefill, decode = pd_engines
    decode.default = Script([EOS])
    # The prefill engine's 4xx is the answer: the request is wrong, decoding would fail too.
    prefill.scripts.append(Script([], status=400))
    rejected = httpx.post(f"{pd_gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert rejected.status_code == 400 and rejected.json()["error"]["message"] == "scripted 400"
    # A prefill engine without a KV connector answers without kv_transfer_params: 503, not a silent recompute.
    prefill.scripts.append(Script([42]))
    unconnected = httpx.post(f"{pd_gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert unconnected.status_code == 503 and "kv_transfer_params" in unconnected.json()["error"]["message"]
    # A 5xx prefill (no other prefill engine to try): the engine's own error.
    prefill.scripts.append(Script([], status=500))
    failed = httpx.post(f"{pd_gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert failed.status_code == 500
    assert decode.records == []
    metrics = httpx.get(f"{pd_gateway}/metrics").text
    assert 'render_gateway_pd_requests_total{outcome="prefill_rejected"} 1.0' in metrics
    assert 'render_gateway_pd_requests_total{outcome="prefill_failed"} 2.0' in metrics


def test_fallback_to_recompute(
    qwen3_model_dir: Path, loaded_model: Model, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> None:
    _, decode = pd_engines
    ids = tokens_of(qwen3_model_dir, loaded_model, decode)
    decode.default = Script([*ids, EOS])
    with _pd_gateway(
        qwen3_model_dir, loaded_model, [unused_url()], [decode.url], prefill_fallback_recompute=True
    ) as gateway:
        answer = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=10)
        assert answer.status_code == 200, answer.text
        (sent,) = [r.body for r in decode.records]
        assert sent.get("kv_transfer_params") is None  # decoded alone: the engine recomputes the prompt
        assert 'render_gateway_pd_requests_total{outcome="recompute"} 1.0' in httpx.get(f"{gateway}/metrics").text
    with _pd_gateway(qwen3_model_dir, loaded_model, [unused_url()], [decode.url]) as strict:
        refused = httpx.post(f"{strict}/v1/chat/completions", json=CHAT, timeout=10)
        assert refused.status_code == 503 and len(decode.records) == 1


def test_a_connector_keyed_by_the_prompt(
    qwen3_model_dir: Path, loaded_model: Model, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> None:
    """With --prefill-kv-by-prompt a prefill answered without kv_transfer_params (ExampleConnector,
    LMCache) has handed off: the decode gets the prompt alone; without the flag it is a failure."""
    prefill, decode = pd_engines
    prefill.default = Script([42], finish_reason="length")  # no kv_transfer_params
    decode.default = Script([EOS])
    urls = [prefill.url], [decode.url]
    with _pd_gateway(qwen3_model_dir, loaded_model, *urls, prefill_kv_by_prompt=True) as gateway:
        answer = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
        assert answer.status_code == 200 and sse_events(answer)[-1] == "[DONE]"
        (first,), (second,) = [r.body for r in prefill.records], [r.body for r in decode.records]
        assert first["kv_transfer_params"] == REMOTE_DECODE and first["sampling_params"]["max_tokens"] == 1
        assert second.get("kv_transfer_params") is None and second["token_ids"] == first["token_ids"]
        metrics = httpx.get(f"{gateway}/metrics").text
        assert 'render_gateway_pd_requests_total{outcome="prompt_keyed"} 1.0' in metrics
    with _pd_gateway(qwen3_model_dir, loaded_model, *urls) as strict:
        assert httpx.post(f"{strict}/v1/chat/completions", json=CHAT, timeout=10).status_code == 503


def tokens_of(model_dir: Path, model: Model, engine: ScriptedEngine) -> list[int]:
    with gateway_app(model, gateway_settings(model_dir, [engine.url])) as plain:
        return tokens(plain, "Recomputed")


def test_a_request_with_its_own_kv_transfer_params_skips_the_prefill(
    pd_gateway: str, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> None:
    prefill, decode = pd_engines
    decode.default = Script([EOS])
    own = {"do_remote_prefill": True, "remote_engine_id": "elsewhere", "remote_block_ids": [1]}
    answer = httpx.post(f"{pd_gateway}/v1/chat/completions", json={**CHAT, "kv_transfer_params": own}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert prefill.records == [] and decode.records[0].body["kv_transfer_params"] == own


# -- prefix affinity -------------------------------------------------------------------------


def test_prefix_affinity_sends_a_prefix_to_one_engine(
    qwen3_model_dir: Path, loaded_model: Model, pd_engines: tuple[ScriptedEngine, ScriptedEngine]
) -> None:
    engines = pd_engines
    for engine in engines:
        engine.default = Script([EOS])
    settings = gateway_settings(
        qwen3_model_dir, [e.url for e in engines], engine_affinity_prefix_tokens=8, engine_health_interval=0.2
    )

    def served_by(prompt: list[int]) -> int:
        before = [len(e.records) for e in engines]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 5}
        assert httpx.post(f"{gateway}/v1/completions", json=body, timeout=10).status_code == 200
        (index,) = [i for i, e in enumerate(engines) if len(e.records) > before[i]]
        return index

    with gateway_app(loaded_model, settings) as gateway:
        shared = list(range(1000, 1008))
        # The same 8-token prefix, different tails: one engine, however the load is spread.
        assert len({served_by([*shared, tail]) for tail in range(10)}) == 1
        # Different prefixes spread over both engines (rendezvous hashing; 2^-15 to fail by chance).
        assert {served_by([first, *shared[1:]]) for first in range(2000, 2016)} == {0, 1}
        # An unhealthy engine's prefixes move to the other; back when it recovers.
        home = served_by(shared)
        engines[home].healthy = False
        assert wait_until(lambda: served_by(shared) != home)
        engines[home].healthy = True
        assert wait_until(lambda: served_by(shared) == home)
        metrics = httpx.get(f"{gateway}/metrics").text
        assert 'render_gateway_affinity_picks_total{result="hit"}' in metrics


def wait_until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False
