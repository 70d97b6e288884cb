"""The gateway in front of a real vLLM CPU engine (tiny random-weight Qwen3, greedy). Opt-in (`-m live`,
VLLM_ENGINE_PYTHON): one engine at a time, ~40 s to start and ~4 GB each.

- against a `--tokens-only` engine: the gateway's tokens are the engine's own for the rendered
  request, streaming equals non-streaming, and a client that leaves frees the engine's slot;
- against `vllm serve --enable-scale-out` (the same engine with its tokenizer, so it answers
  /v1/chat/completions itself): the gateway's answers equal vLLM's, field by field except ids and
  timestamps (and the fingerprint), streams by merged content, chunk keys and usage.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from render_service.model.loader import Model
from tests.gateway.conftest import gateway_app, gateway_settings, sse_events
from tests.integration.engine_fixture import SERVED_NAME, build_weighted_model, engine_python, start_engine

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(900),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
]

MAX_MODEL_LEN = 4096  # the gateway settings use the same (conftest.gateway_settings)
CHAT = {
    "model": SERVED_NAME,
    "messages": [{"role": "user", "content": "Tell me a story about a fox."}],
    "max_tokens": 12,
    "temperature": 0,
}
COMPLETION = {"model": SERVED_NAME, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
MESSAGES = {
    "model": SERVED_NAME,
    "messages": [{"role": "user", "content": "Tell me a story about a fox."}],
    "max_tokens": 12,
    "temperature": 0,
}
RESPONSES = {"model": SERVED_NAME, "input": "Tell me a story about a fox.", "max_output_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def weighted_model() -> Path:
    return build_weighted_model()


def _gateway(weighted_model: Path, loaded_model: Model, engine_url: str) -> Any:
    settings = gateway_settings(weighted_model, [engine_url], engine_timeout=120.0)
    settings.served_model_name = [SERVED_NAME]
    return gateway_app(loaded_model, settings)


@pytest.fixture(scope="module")
def live_model(weighted_model: Path) -> Model:
    from render_service.model.loader import load_model

    settings = gateway_settings(weighted_model, [])
    settings.served_model_name = [SERVED_NAME]
    return load_model(settings)


def _content(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices"))


class TestTokensOnlyEngine:
    @pytest.fixture(scope="class")
    @classmethod
    def urls(cls, weighted_model: Path, live_model: Model) -> Iterator[tuple[str, str]]:
        engine = start_engine(weighted_model, max_model_len=MAX_MODEL_LEN)
        try:
            with _gateway(weighted_model, live_model, engine.url) as gateway:
                yield gateway, engine.url
        finally:
            engine.stop()

    def test_tokens_are_the_engines_own(self, urls: tuple[str, str]) -> None:
        gateway, engine = urls
        answer = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "return_token_ids": True}, timeout=120)
        assert answer.status_code == 200, answer.text
        rendered = httpx.post(f"{gateway}/v1/chat/completions/render", json=CHAT).json()
        direct = httpx.post(f"{engine}/inference/v1/generate", json=rendered, timeout=120).json()
        body = answer.json()
        assert body["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]
        assert body["prompt_token_ids"] == rendered["token_ids"]
        assert body["usage"]["completion_tokens"] == len(direct["choices"][0]["token_ids"])

    def test_streaming_equals_non_streaming(self, urls: tuple[str, str]) -> None:
        gateway, _ = urls
        batch = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=120).json()
        stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json=stream, timeout=120))
        assert events[-1] == "[DONE]" and events[-2]["usage"] == {
            k: batch["usage"][k] for k in ("prompt_tokens", "total_tokens", "completion_tokens")
        }
        assert _content(events) == (batch["choices"][0]["message"]["content"] or "")
        finish = [e for e in events[:-1] if e["choices"] and e["choices"][0].get("finish_reason")]
        assert finish[-1]["choices"][0]["finish_reason"] == batch["choices"][0]["finish_reason"]

        text = httpx.post(f"{gateway}/v1/completions", json=COMPLETION, timeout=120).json()["choices"][0]["text"]
        events = sse_events(httpx.post(f"{gateway}/v1/completions", json={**COMPLETION, "stream": True}, timeout=120))
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text

    def test_a_client_that_leaves_frees_the_engine_slot(self, urls: tuple[str, str]) -> None:
        gateway, engine = urls
        body = {**CHAT, "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{gateway}/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            for _ in range(6):  # the role chunk and a few tokens
                next(lines)
            assert _running(engine) == 1
        deadline = time.monotonic() + 30
        while _running(engine) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(engine) == 0

    def test_pd_pools_on_a_real_engine(self, weighted_model: Path, live_model: Model, urls: tuple[str, str]) -> None:
        """The prefill hop (max_tokens 1, do_remote_decode) is a request the real engine accepts; this
        engine has no KV connector (no NIXL on CPU), so it hands back no kv_transfer_params: 503, or
        with --prefill-fallback-recompute the decode pool's answer, equal to the single-engine one."""
        gateway, engine = urls
        single = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=120).json()

        def pd(**extra: Any) -> Any:
            settings = gateway_settings(
                weighted_model, [], prefill_engine=[engine], decode_engine=[engine], engine_timeout=120.0, **extra
            )
            settings.served_model_name = [SERVED_NAME]
            return gateway_app(live_model, settings)

        with pd() as strict:
            refused = httpx.post(f"{strict}/v1/chat/completions", json=CHAT, timeout=120)
            assert refused.status_code == 503 and "kv_transfer_params" in refused.json()["error"]["message"]
        with pd(prefill_fallback_recompute=True) as lenient:
            answer = httpx.post(f"{lenient}/v1/chat/completions", json=CHAT, timeout=120).json()
            assert _strip(answer) == _strip(single)
            events = sse_events(
                httpx.post(f"{lenient}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=120)
            )
            assert _content(events) == single["choices"][0]["message"]["content"]


class TestKVHandoff:
    """A real KV hand-off between two `--tokens-only` engines: vLLM's ExampleConnector (the shared-folder
    reference connector, which runs on CPU) on one folder, `kv_both` on each. The prefill engine
    stores the prompt's KV per layer under a hash of the prompt's full blocks; the decode engine finds
    it by the same prompt, loads it and computes only the rest. It answers the prefill without
    kv_transfer_params, so the gateway runs with --prefill-kv-by-prompt."""

    @pytest.fixture(scope="class")
    @classmethod
    def pair(cls, weighted_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Path]]:
        store = tmp_path_factory.mktemp("kv-store")
        config = {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(store)},
        }
        flags = ("--kv-transfer-config", json.dumps(config))
        prefill = start_engine(weighted_model, *flags, max_model_len=MAX_MODEL_LEN)
        try:
            decode = start_engine(weighted_model, *flags, max_model_len=MAX_MODEL_LEN)
            try:
                yield prefill, decode, store
            finally:
                decode.stop()
        finally:
            prefill.stop()

    def test_decode_uses_the_prefill_engines_kv(
        self, weighted_model: Path, live_model: Model, pair: tuple[Any, Any, Path]
    ) -> None:
        prefill, decode, store = pair

        def gateway(engines: list[str], **pools: Any) -> Any:
            settings = gateway_settings(weighted_model, engines, engine_timeout=120.0, **pools)
            settings.served_model_name = [SERVED_NAME]
            return gateway_app(live_model, settings)

        story = "The fox ran through the quiet village at dawn, past the mill and the old stone bridge. "
        for index, stream in enumerate((False, True)):
            # A prompt of several KV blocks, new to both engines (each case its own).
            chat = {**CHAT, "messages": [{"role": "user", "content": f"{index}. " + story * 40}]}
            with gateway([], prefill_engine=[prefill.url], decode_engine=[decode.url], prefill_kv_by_prompt=True) as pd:
                if stream:
                    events = sse_events(
                        httpx.post(f"{pd}/v1/chat/completions", json={**chat, "stream": True}, timeout=300)
                    )
                    assert events[-1] == "[DONE]"
                    answer_text = _content(events)
                else:
                    response = httpx.post(f"{pd}/v1/chat/completions", json=chat, timeout=300)
                    assert response.status_code == 200, response.text
                    answer = response.json()
                    answer_text = answer["choices"][0]["message"]["content"]
                metrics = httpx.get(f"{pd}/metrics").text
                assert 'render_gateway_pd_requests_total{outcome="prompt_keyed"} 1.0' in metrics
            # The decode engine loaded KV the prefill engine stored: its connector says how many tokens.
            injected = [int(n) for n in re.findall(r"Inject KV cache of (\d+) tokens", decode.log.read_text())]
            assert len(injected) == index + 1 and injected[-1] >= 256, injected
            assert len(list(store.glob("*/*.safetensors"))) == 2 * (index + 1)  # 2 layers per prompt
            # The single-engine answer: the prefill engine alone (it computed this prompt itself).
            with gateway([prefill.url]) as single:
                reference = httpx.post(f"{single}/v1/chat/completions", json=chat, timeout=300).json()
            if stream:
                assert answer_text == reference["choices"][0]["message"]["content"]
            else:
                assert _strip(answer) == _strip(reference)


def _running(engine: str) -> float:
    for line in httpx.get(f"{engine}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the engine exports no vllm:num_requests_running")


# Ids and timestamps differ by nature. `system_fingerprint` is vLLM's hash of the engine's whole
# config, which the gateway cannot know (ours is null); `weight_versions` (choices) and
# `kv_transfer_params` (stream chunks) are fields vLLM 0.33 emits and this 0.32 engine does not.
VOLATILE = (
    "id",
    "created",
    "created_at",
    "system_fingerprint",
    "weight_versions",
    "kv_transfer_params",
    "signature",
    "item_id",
)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _merged(events: list[Any], text_key: str) -> dict[str, Any]:
    """A stream's content: how the engine groups tokens into chunks depends on timing, so streams are
    compared by their merged text and token ids, their first and finishing chunks, and their usage."""
    chunks = [e for e in events if e != "[DONE]" and e.get("choices")]
    choices = [c["choices"][0] for c in chunks]

    def text(choice: dict[str, Any]) -> str:
        return (choice["delta"].get("content") or "") if text_key == "delta" else choice["text"]

    finish = [c for c in choices if c.get("finish_reason") is not None]
    return {
        "text": "".join(text(c) for c in choices),
        "token_ids": [t for c in choices for t in (c.get("token_ids") or [])],
        "first": _strip(chunks[0]),
        "finish": {k: v for k, v in _strip(finish[-1]).items() if k not in ("delta", "text", "token_ids")},
        "keys": sorted({tuple(_strip(c)) for c in chunks[1:]}),
        "usage": [_strip(e) for e in events if e != "[DONE]" and not e.get("choices")],
        "done": events[-1],
    }


def _named(response: httpx.Response) -> list[tuple[str, Any]]:
    """The `event:` / `data:` pairs of a Messages or Responses stream."""
    assert response.status_code == 200, response.text
    out = []
    for block in response.text.split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


DELTA_TEXT = ("text", "thinking", "partial_json", "delta")
# The engine here is vLLM 0.32; the gateway answers as 0.33, whose ResponsesResponse has these
# fields more, and whose output items carry `response_item_status` ("incomplete" when cut by
# max_output_tokens; 0.32 says "completed"), and whose stream ends such a response with
# `response.incomplete` (0.32: `response.completed` whatever the status).
RESPONSES_033_ONLY = {"prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "safety_identifier"}


def _as_032(value: Any) -> Any:
    """A 0.33 Responses answer (or merged stream) as 0.32 writes it (see RESPONSES_033_ONLY)."""
    if isinstance(value, dict):
        out = {k: _as_032(v) for k, v in value.items() if k not in RESPONSES_033_ONLY}
        if out.get("type") in ("message", "function_call") and out.get("status") == "incomplete":
            out["status"] = "completed"
        if out.get("type") == "response.incomplete":
            out["type"] = "response.completed"
        return out
    if isinstance(value, tuple) and value and value[0] == "response.incomplete":
        return ("response.completed", *(_as_032(v) for v in value[1:]))
    if isinstance(value, list | tuple):
        return type(value)(_as_032(v) for v in value)
    return value


def _merged_named(events: list[tuple[str, Any]]) -> dict[str, Any]:
    """An event stream with its deltas merged (their grouping depends on timing): the sequence of
    the other events, the merged text per block or output item, the final event."""
    merged: dict[Any, str] = {}
    others = []
    for name, data in events:
        delta = data.get("delta")
        if name.endswith("delta") and delta is not None:
            key = (data.get("index"), data.get("output_index"), name)
            piece = delta if isinstance(delta, str) else next((delta[k] for k in DELTA_TEXT if k in delta), "")
            merged[key] = merged.get(key, "") + piece
        else:
            others.append((name, _strip({k: v for k, v in data.items() if k != "sequence_number"})))
    return {"events": others, "merged": merged}


class TestAgainstVllmServe:
    """The same engine with its tokenizer answers /v1/chat/completions itself: the oracle."""

    @pytest.fixture(scope="class")
    @classmethod
    def urls(cls, weighted_model: Path, live_model: Model) -> Iterator[tuple[str, str]]:
        engine = start_engine(weighted_model, max_model_len=MAX_MODEL_LEN, tokens_only=False)
        try:
            with _gateway(weighted_model, live_model, engine.url) as gateway:
                yield gateway, engine.url
        finally:
            engine.stop()

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}),
            ("/v1/completions", COMPLETION),
            ("/v1/completions", {**COMPLETION, "prompt": ["one", "two"], "return_token_ids": True}),
        ],
    )
    def test_non_streaming_answers_equal(self, urls: tuple[str, str], path: str, body: dict[str, Any]) -> None:
        gateway, engine = urls
        ours = httpx.post(f"{gateway}{path}", json=body, timeout=120)
        theirs = httpx.post(f"{engine}{path}", json=body, timeout=120)
        assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
        assert _strip(ours.json()) == _strip(theirs.json())

    @pytest.mark.parametrize(
        "body",
        [MESSAGES, {**MESSAGES, "stop_sequences": ["the"]}, {**MESSAGES, "system": "Be brief.", "max_tokens": 5}],
    )
    def test_messages_equal(self, urls: tuple[str, str], body: dict[str, Any]) -> None:
        gateway, engine = urls
        ours = httpx.post(f"{gateway}/v1/messages", json=body, timeout=120)
        theirs = httpx.post(f"{engine}/v1/messages", json=body, timeout=120)
        assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
        assert _strip(ours.json()) == _strip(theirs.json())
        ours_events = _named(httpx.post(f"{gateway}/v1/messages", json={**body, "stream": True}, timeout=120))
        theirs_events = _named(httpx.post(f"{engine}/v1/messages", json={**body, "stream": True}, timeout=120))
        assert _merged_named(ours_events) == _merged_named(theirs_events)

    @pytest.mark.parametrize(
        "body",
        [
            RESPONSES,
            {**RESPONSES, "instructions": "Be brief.", "max_output_tokens": 4},
            {**RESPONSES, "include": ["message.output_text.logprobs"], "top_logprobs": 2},
        ],
    )
    def test_responses_equal(self, urls: tuple[str, str], body: dict[str, Any]) -> None:
        gateway, engine = urls
        ours = httpx.post(f"{gateway}/v1/responses", json=body, timeout=120)
        theirs = httpx.post(f"{engine}/v1/responses", json=body, timeout=120)
        assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
        assert _as_032(_strip(ours.json())) == _strip(theirs.json())
        ours_events = _named(httpx.post(f"{gateway}/v1/responses", json={**body, "stream": True}, timeout=120))
        theirs_events = _named(httpx.post(f"{engine}/v1/responses", json={**body, "stream": True}, timeout=120))
        assert _as_032(_merged_named(ours_events)) == _merged_named(theirs_events)

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
            ("/v1/chat/completions", {**CHAT, "return_token_ids": True}),
            (
                "/v1/completions",
                {**COMPLETION, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            ),
        ],
    )
    def test_streams_equal_chunk_by_chunk(self, urls: tuple[str, str], path: str, body: dict[str, Any]) -> None:
        gateway, engine = urls
        ours = sse_events(httpx.post(f"{gateway}{path}", json={**body, "stream": True}, timeout=120))
        theirs = sse_events(httpx.post(f"{engine}{path}", json={**body, "stream": True}, timeout=120))
        key = "delta" if path == "/v1/chat/completions" else "text"
        merged_ours, merged_theirs = _merged(ours, key), _merged(theirs, key)
        if body.get("stream_options", {}).get("continuous_usage_stats"):  # per chunk: grouping-dependent
            merged_ours.pop("first"), merged_theirs.pop("first")
            merged_ours.pop("finish"), merged_theirs.pop("finish")
        assert merged_ours == merged_theirs


class TestParsedAgainstVllmServe:
    """`vllm serve --reasoning-parser qwen3` (with its tokenizer) against the gateway with the same
    parser: stop strings on a stream through the parser, which vLLM applies in its detokenizer."""

    @pytest.fixture(scope="class")
    @classmethod
    def urls(cls, weighted_model: Path, live_model: Model) -> Iterator[tuple[str, str]]:
        engine = start_engine(
            weighted_model, "--reasoning-parser", "qwen3", max_model_len=MAX_MODEL_LEN, tokens_only=False
        )
        try:
            settings = gateway_settings(weighted_model, [engine.url], engine_timeout=120.0, reasoning_parser="qwen3")
            settings.served_model_name = [SERVED_NAME]
            with gateway_app(live_model, settings) as gateway:
                yield gateway, engine.url
        finally:
            engine.stop()

    def test_stop_strings_on_a_parsed_stream(self, urls: tuple[str, str]) -> None:
        gateway, engine = urls
        body = {**CHAT, "max_tokens": 24}
        plain = httpx.post(f"{engine}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]
        text = (plain.get("reasoning") or plain.get("reasoning_content") or "") + (plain.get("content") or "")
        stop = text[len(text) // 2 : len(text) // 2 + 2]  # somewhere inside what the model writes
        assert stop.strip(), text

        def merged(base: str) -> tuple[str, str, Any]:
            events = sse_events(
                httpx.post(f"{base}/v1/chat/completions", json={**body, "stop": [stop], "stream": True}, timeout=120)
            )
            reasoning = content = ""
            finish = None
            for event in events[:-1]:
                for choice in event.get("choices") or []:
                    delta = choice["delta"]
                    reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
                    content += delta.get("content") or ""
                    if choice.get("finish_reason"):
                        finish = (choice["finish_reason"], choice.get("stop_reason"))
            return reasoning, content, finish

        ours, theirs = merged(gateway), merged(engine)
        assert ours == theirs and ours[2] == ("stop", stop)
