"""llm-d's render client contract, end to end against real service processes.

`llmd_client.LlmdRenderClient` reproduces llm-d-router's `token-producer` (`vllm` backend) byte for
byte where it matters: HTTP/1.1 keep-alive, the 5 s / 30 s budgets, round-robin endpoints with one
retry on another endpoint after a transport failure, 408, 429 or 5xx, the forwarded
`Authorization`, a `traceparent`, the unmodified body (plus `return_mm_kwargs: false` and, with
`prefillOnly`, Go's re-marshalled envelope), `GET /v1/models` for `max_model_len`, and the response
parsed as its Go structs parse it. Three servers: the primary (two served names, an API key), a
replica that answers every request with a back-pressure 503 (`--max-inflight 0`), and a port with
nothing listening (a stopped replica).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, service
from tests.integration.llmd_client import (
    LlmdRenderClient,
    RenderError,
    go_marshal_envelope,
    messages_render_mode,
    omit_mm_kwargs,
    parse_render_response,
    raw_envelope,
    read_model_limit,
    render_only_budget,
)

pytestmark = pytest.mark.timeout(300)

API_KEY = "llmd-contract-key"
BEARER = f"Bearer {API_KEY}"
MAX_MODEL_LEN = 4096
FLAGS = (
    "--served-model-name",
    "tinyqwen3",
    "alias-a",
    "--api-key",
    API_KEY,
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--workers",
    "1",
)
TRACEPARENT = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"


def tool_body(first: str, second: str, model: str = "alias-a") -> bytes:
    """A chat request as a client sends it: tool-schema properties in the order given, with `<`/`&`
    in a description (Go's marshaller escapes them; the value must not change)."""
    template = (
        '{"model": "MODEL", "messages": [{"role": "user", "content": "Weather in Paris?"}],\n'
        ' "tools": [{"type": "function", "function": {"name": "get_weather",\n'
        '   "description": "Weather <b>now</b> & later",\n'
        '   "parameters": {"type": "object", "properties": {\n'
        '     "FIRST": {"type": "string", "description": "first"},\n'
        '     "SECOND": {"type": "string", "description": "second"}},\n'
        '     "required": ["FIRST"]}}}],\n'
        ' "max_tokens": 64}'
    )
    return template.replace("MODEL", model).replace("FIRST", first).replace("SECOND", second).encode()


@pytest.fixture(scope="module")
def servers(qwen3_model_dir: Path) -> Iterator[dict[str, str]]:
    with service(qwen3_model_dir, *FLAGS) as primary, service(qwen3_model_dir, *FLAGS, "--max-inflight", "0") as busy:
        yield {"primary": primary, "busy": busy, "stopped": f"http://127.0.0.1:{free_port()}"}


@pytest.fixture
def client(servers: dict[str, str]) -> Iterator[LlmdRenderClient]:
    with LlmdRenderClient(url=servers["primary"]) as renderer:
        yield renderer


def detokenize(url: str, ids: list[int]) -> str:
    response = httpx.post(
        f"{url}/detokenize", json={"model": "tinyqwen3", "tokens": ids}, headers={"Authorization": BEARER}
    )
    assert response.status_code == 200, response.text
    return response.json()["prompt"]


def plain_render(url: str, path: str, body: bytes) -> Any:
    """The same bytes posted as-is (no llm-d edits), for comparison."""
    response = httpx.post(
        url + path, content=body, headers={"Authorization": BEARER, "Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    return response.json()


# Transport.


def test_http11_keepalive_pool_reuses_one_connection(client: LlmdRenderClient) -> None:
    body = b'{"model": "tinyqwen3", "prompt": "hello"}'
    attempts = [client.render_completions(body, authorization=BEARER)[0].attempts[0] for _ in range(6)]
    assert {a.http_version for a in attempts} == {"HTTP/1.1"}
    assert {a.status for a in attempts} == {200}
    ports = {a.client_port for a in attempts}
    assert len(ports) == 1 and None not in ports, "the service closed a keep-alive connection"


def test_budgets_are_5s_for_completions_and_30s_for_conversations(servers: dict[str, str]) -> None:
    """A render that never answers (a listener that never accepts) uses up the whole budget, and with no
    attemptTimeout there is no time left to retry; with one, the retry on another endpoint succeeds."""
    with socket.socket() as hang:
        hang.bind(("127.0.0.1", 0))
        hang.listen(8)
        hanging = f"http://127.0.0.1:{hang.getsockname()[1]}"
        with LlmdRenderClient(endpoints=[hanging, servers["primary"]], timeout=0.4, mm_timeout=0.2) as renderer:
            with pytest.raises(RenderError) as failed:
                renderer.render_completions(b'{"model": "tinyqwen3", "prompt": "x"}', authorization=BEARER)
            assert [a.url for a in failed.value.attempts] == [hanging]
            assert failed.value.retryable
        with LlmdRenderClient(
            endpoints=[hanging, servers["primary"]], timeout=5.0, mm_timeout=30.0, attempt_timeout=0.3
        ) as renderer:
            rendered = renderer.render_chat(
                b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": "x"}]}', authorization=BEARER
            )
            assert [a.url for a in rendered.attempts] == [hanging, servers["primary"]]
            assert [a.status for a in rendered.attempts] == [None, 200]
    defaults = LlmdRenderClient(url=servers["primary"])
    assert (defaults.timeout, max(defaults.timeout, defaults.mm_timeout)) == (5.0, 30.0)
    defaults.close()


# Retries.


@pytest.mark.parametrize("failing", ["busy", "stopped"])
def test_one_retry_on_another_endpoint_after_5xx_or_transport_failure(servers: dict[str, str], failing: str) -> None:
    bad, good = servers[failing], servers["primary"]
    with LlmdRenderClient(endpoints=[bad, good]) as renderer:
        rendered = renderer.render_chat(tool_body("zeta", "alpha"), authorization=BEARER)
        assert [a.url for a in rendered.attempts] == [bad, good]
        assert rendered.attempts[0].status == (503 if failing == "busy" else None)
        assert rendered.token_ids
        # No circuit breaker: the failed endpoint stays in rotation (the retry's pick reset the shared
        # round-robin cursor), so the next request pays the same retry.
        again = renderer.render_chat(tool_body("zeta", "alpha"), authorization=BEARER)
        assert [a.url for a in again.attempts] == [bad, good]
        assert again.token_ids == rendered.token_ids


def test_503_from_back_pressure_is_retryable_and_says_so(servers: dict[str, str]) -> None:
    response = httpx.post(
        f"{servers['busy']}/v1/chat/completions/render",
        headers={"Authorization": BEARER},
        json={"model": "tinyqwen3", "messages": [{"role": "user", "content": "x"}]},
    )
    assert response.status_code == 503
    assert response.headers.get("retry-after")
    assert response.json()["error"]["code"] == 503


def test_only_one_retry_and_never_on_a_fixed_url(servers: dict[str, str]) -> None:
    body = b'{"model": "tinyqwen3", "prompt": "x"}'
    # busy first; the retry picks from [primary, stopped] with the cursor at 1: stopped, and stops there.
    with LlmdRenderClient(endpoints=[servers["busy"], servers["primary"], servers["stopped"]]) as renderer:
        with pytest.raises(RenderError) as failed:
            renderer.render_completions(body, authorization=BEARER)
        assert [a.url for a in failed.value.attempts] == [servers["busy"], servers["stopped"]]
        assert failed.value.retryable and failed.value.status is None
    with LlmdRenderClient(url=servers["busy"]) as renderer:
        with pytest.raises(RenderError) as failed:
            renderer.render_completions(body, authorization=BEARER)
        assert failed.value.status == 503 and len(failed.value.attempts) == 1


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b'{"model": "no-such-model", "prompt": "x"}', {"authorization": BEARER}, 404),
        (b'{"model": "tinyqwen3", "prompt": "x", "max_tokens": 999999}', {"authorization": BEARER}, 400),
        (b'{"model": "tinyqwen3", "prompt": "x"}', {"authorization": "Bearer wrong"}, 401),
        (b'{"model": "tinyqwen3", "prompt": "x"}', {}, 401),
    ],
)
def test_4xx_is_returned_without_retry(
    servers: dict[str, str], body: bytes, headers: dict[str, str], status: int
) -> None:
    with LlmdRenderClient(endpoints=[servers["primary"], servers["busy"]]) as renderer:
        with pytest.raises(RenderError) as failed:
            renderer.render_completions(body, **headers)
        assert failed.value.status == status and not failed.value.retryable
        assert [a.url for a in failed.value.attempts] == [servers["primary"]]
        assert "error" in json.loads(str(failed.value).split(": ", 1)[1])  # vLLM's error shape


# Headers.


def test_authorization_is_forwarded_verbatim(client: LlmdRenderClient) -> None:
    body = b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": "hi"}]}'
    assert client.render_chat(body, authorization=BEARER).token_ids
    with pytest.raises(RenderError) as failed:
        client.render_chat(body, authorization="Basic " + API_KEY)
    assert failed.value.status == 401


def test_traceparent_is_accepted_and_changes_nothing(client: LlmdRenderClient) -> None:
    body = tool_body("zeta", "alpha")
    with_trace = client.render_chat(body, authorization=BEARER, traceparent=TRACEPARENT)
    without = client.render_chat(body, authorization=BEARER)
    assert with_trace.token_ids == without.token_ids
    malformed = client.render_chat(body, authorization=BEARER, traceparent="00-zz-zz-01")
    assert malformed.token_ids == without.token_ids


# Served-model names and model limits.


def test_every_served_model_alias_renders_the_same_tokens(client: LlmdRenderClient) -> None:
    by_name = {
        name: client.render_chat(tool_body("zeta", "alpha", model=name), authorization=BEARER).token_ids
        for name in ("tinyqwen3", "alias-a")
    }
    assert by_name["tinyqwen3"] == by_name["alias-a"]
    completions = {
        name: client.render_completions(b'{"model": "%s", "prompt": "hi"}' % name.encode(), authorization=BEARER)[
            0
        ].token_ids
        for name in ("tinyqwen3", "alias-a")
    }
    assert completions["tinyqwen3"] == completions["alias-a"]


def test_models_endpoint_gives_max_model_len_as_llmd_parses_it(servers: dict[str, str]) -> None:
    for name in ("tinyqwen3", "alias-a"):
        assert read_model_limit(servers["primary"], name, api_key=API_KEY) == MAX_MODEL_LEN
    with pytest.raises(RenderError, match="no positive max_model_len"):
        read_model_limit(servers["primary"], "not-served", api_key=API_KEY)
    # The probe uses VLLM_API_KEY, never a caller's credential: without it a keyed server says 401.
    with pytest.raises(RenderError) as failed:
        read_model_limit(servers["primary"], "tinyqwen3", api_key="")
    assert failed.value.status == 401


# The body.


def test_body_is_forwarded_unmodified_and_tool_schema_key_order_reaches_the_template(
    client: LlmdRenderClient, servers: dict[str, str]
) -> None:
    zeta_first = client.render_chat(tool_body("zeta", "alpha"), authorization=BEARER)
    alpha_first = client.render_chat(tool_body("alpha", "zeta"), authorization=BEARER)
    assert zeta_first.token_ids != alpha_first.token_ids
    text = detokenize(servers["primary"], zeta_first.token_ids)
    assert text.index('"zeta"') < text.index('"alpha"')
    text_b = detokenize(servers["primary"], alpha_first.token_ids)
    assert text_b.index('"alpha"') < text_b.index('"zeta"')
    assert "Weather <b>now</b> & later" in text
    # llm-d's only edit by default (`return_mm_kwargs: false`) changes no token.
    assert (
        zeta_first.token_ids
        == plain_render(servers["primary"], "/v1/chat/completions/render", tool_body("zeta", "alpha"))["token_ids"]
    )


def test_prefill_only_copy_is_go_marshalled_and_keeps_nested_order(servers: dict[str, str]) -> None:
    body = tool_body("zeta", "alpha")
    copy = render_only_budget(body)
    assert b"\\u003cb\\u003enow\\u003c/b\\u003e \\u0026 later" in copy  # Go's escapeHTML
    assert list(json.loads(copy)) == sorted(json.loads(body))  # map keys sorted
    assert json.loads(copy)["max_tokens"] == 1
    assert json.loads(copy)["tools"] == json.loads(body)["tools"]
    with LlmdRenderClient(url=servers["primary"], prefill_only=True) as renderer:
        rendered = renderer.render_chat(body, authorization=BEARER)
    with LlmdRenderClient(url=servers["primary"]) as renderer:
        assert rendered.token_ids == renderer.render_chat(body, authorization=BEARER).token_ids


@pytest.mark.parametrize("path", ["chat", "completions"])
def test_prefill_only_lets_an_oversized_output_budget_render(servers: dict[str, str], path: str) -> None:
    """vLLM rejects `max_tokens` > max_model_len outright; the render-only copy asks for 1 token (and
    `min_tokens` 0, `max_completion_tokens` 1) so the same prompt renders, with the same tokens."""
    if path == "chat":
        body = (
            b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": "hi"}], '
            b'"max_completion_tokens": 999999, "max_tokens": 999999, "min_tokens": 5}'
        )
    else:
        body = b'{"model": "tinyqwen3", "prompt": "hi", "max_tokens": 999999, "min_tokens": 5}'
    render = (
        (lambda r: r.render_chat(body, authorization=BEARER).token_ids)
        if path == "chat"
        else (lambda r: r.render_completions(body, authorization=BEARER)[0].token_ids)
    )
    with LlmdRenderClient(url=servers["primary"]) as renderer:
        with pytest.raises(RenderError) as failed:
            render(renderer)
        assert failed.value.status == 400
    with LlmdRenderClient(url=servers["primary"], prefill_only=True) as renderer:
        ids = render(renderer)
    sent = json.loads(render_only_budget(body))
    assert sent["max_tokens"] == 1 and sent["min_tokens"] == 0
    unbounded = json.loads(body)
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        unbounded.pop(key, None)
    path_url = "/v1/chat/completions/render" if path == "chat" else "/v1/completions/render"
    expected = plain_render(servers["primary"], path_url, json.dumps(unbounded).encode())
    assert ids == (expected["token_ids"] if path == "chat" else expected[0]["token_ids"])


def test_prefill_only_keeps_the_budget_when_truncate_prompt_tokens_is_set(servers: dict[str, str]) -> None:
    body = (
        b'{"model": "tinyqwen3", "prompt": "one two three four five six", "truncate_prompt_tokens": 3,'
        b' "max_tokens": 999999}'
    )
    assert render_only_budget(body) == body
    nulled = body.replace(b'"truncate_prompt_tokens": 3', b'"truncate_prompt_tokens": null')
    assert json.loads(render_only_budget(nulled))["max_tokens"] == 1
    with LlmdRenderClient(url=servers["primary"], prefill_only=True) as renderer:
        with pytest.raises(RenderError) as failed:
            renderer.render_completions(body, authorization=BEARER)
        assert failed.value.status == 400
        assert len(renderer.render_completions(nulled, authorization=BEARER)[0].token_ids) == 6


@pytest.mark.parametrize("path", ["chat", "completions"])
def test_truncate_prompt_tokens_keeps_the_last_tokens(client: LlmdRenderClient, path: str) -> None:
    if path == "chat":
        full = client.render_chat(
            b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": "one two three four five"}]}',
            authorization=BEARER,
        ).token_ids
        cut = client.render_chat(
            b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": '
            b'"one two three four five"}], "truncate_prompt_tokens": 4}',
            authorization=BEARER,
        ).token_ids
    else:
        full = client.render_completions(
            b'{"model": "tinyqwen3", "prompt": "one two three four five"}', authorization=BEARER
        )[0].token_ids
        cut = client.render_completions(
            b'{"model": "tinyqwen3", "prompt": "one two three four five", "truncate_prompt_tokens": 4}',
            authorization=BEARER,
        )[0].token_ids
    assert len(full) > 4 and cut == full[-4:]
    with pytest.raises(RenderError) as failed:
        client.render_completions(
            b'{"model": "tinyqwen3", "prompt": "x", "truncate_prompt_tokens": %d}' % (MAX_MODEL_LEN + 1),
            authorization=BEARER,
        )
    assert failed.value.status == 400


# The response, as llm-d's Go structs read it.


def test_response_fields_parse_as_llmd_reads_them(client: LlmdRenderClient, servers: dict[str, str]) -> None:
    chat = plain_render(
        servers["primary"],
        "/v1/chat/completions/render",
        omit_mm_kwargs(b'{"model": "tinyqwen3", "messages": [{"role": "user", "content": "hi"}]}'),
    )
    assert isinstance(chat, dict) and "features" in chat and chat["features"] is None  # present, null
    assert parse_render_response(chat) == (chat["token_ids"], None)
    assert all(isinstance(t, int) and 0 <= t < 2**32 for t in chat["token_ids"])
    # Completions: a list, one entry per prompt (llm-d keeps every entry).
    many = client.render_completions(b'{"model": "tinyqwen3", "prompt": ["one", "two three"]}', authorization=BEARER)
    assert [len(r.token_ids) for r in many] == [1, 2]
    assert all(r.features is None for r in many)


def test_go_struct_semantics_of_the_parser() -> None:
    """The parser is the contract's yardstick: null and missing `features` are both nil, empty maps are
    no features, unknown fields are ignored, names match case-insensitively, ids must fit uint32."""
    assert parse_render_response({"token_ids": [1, 2]}) == ([1, 2], None)
    assert parse_render_response({"token_ids": [1], "features": None}) == ([1], None)
    assert parse_render_response({"token_ids": [1], "features": {"mm_hashes": {}, "mm_placeholders": {}}}) == (
        [1],
        None,
    )
    ids, features = parse_render_response(
        {
            "Token_IDs": [7],
            "extra": 1,
            "features": {
                "mm_hashes": {"image": ["h1"]},
                "mm_placeholders": {"image": [{"offset": 3, "length": 4}]},
                "kwargs_data": {"image": ["..."]},
            },
        }
    )
    assert ids == [7] and features is not None
    assert features.mm_hashes == {"image": ["h1"]} and features.mm_placeholders == {"image": [(3, 4)]}
    for bad in ([-1], [2**32], [1.5], "abc"):
        with pytest.raises(RenderError):
            parse_render_response({"token_ids": bad})
    with pytest.raises(RenderError):
        parse_render_response([{"token_ids": [1]}])


def test_envelope_helpers_match_go() -> None:
    body = b'{"b": {"z": 1, "a": [1, 2]}, "a": "x<y", "b": {"k": 2}}'
    assert raw_envelope(body) == {"b": '{"k": 2}', "a": '"x<y"'}  # the last duplicate wins
    assert (
        go_marshal_envelope(raw_envelope(b'{"m": {"z": 1, "a": 2}, "c": "<&>"}'))
        == b'{"c":"\\u003c\\u0026\\u003e","m":{"z":1,"a":2}}'
    )
    assert omit_mm_kwargs(b"{}") == b'{"return_mm_kwargs":false}'
    assert omit_mm_kwargs(b'{"a": 1} ') == b'{"a": 1,"return_mm_kwargs":false} '


# Anthropic Messages (vLLM 0.33 converts to a chat request and renders it the same way).

MESSAGES_BODY = (
    b'{"model": "alias-a", "max_tokens": 64,\n'
    b' "system": [{"type": "text", "text": "You are terse."}],\n'
    b' "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],\n'
    b' "tools": [{"name": "get_weather", "description": "Weather <b>now</b> & later",\n'
    b'   "input_schema": {"type": "object", "properties": {\n'
    b'     "zeta": {"type": "string"}, "alpha": {"type": "string"}}, "required": ["zeta"]}}]}'
)


def test_messages_render_matches_the_equivalent_chat_render(client: LlmdRenderClient, servers: dict[str, str]) -> None:
    rendered = client.render_messages(MESSAGES_BODY, authorization=BEARER, traceparent=TRACEPARENT)
    assert rendered.features is None and rendered.token_ids
    text = detokenize(servers["primary"], rendered.token_ids)
    assert text.index('"zeta"') < text.index('"alpha"')
    chat = json.dumps(
        {
            "model": "alias-a",
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Weather in Paris?"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather <b>now</b> & later",
                        "parameters": {
                            "type": "object",
                            "properties": {"zeta": {"type": "string"}, "alpha": {"type": "string"}},
                            "required": ["zeta"],
                        },
                        "strict": None,
                        "defer_loading": None,
                    },
                }
            ],
            "tool_choice": "auto",
        }
    ).encode()
    assert rendered.token_ids == client.render_chat(chat, authorization=BEARER).token_ids
    # prefillOnly rewrites Anthropic's required `max_tokens` to 1: same prompt.
    with LlmdRenderClient(url=servers["primary"], prefill_only=True) as renderer:
        assert renderer.render_messages(MESSAGES_BODY, authorization=BEARER).token_ids == rendered.token_ids
    # llm-d's `messagesRenderMode: auto` picks native rendering only when this path answers its probe
    # with a 2xx (a 404 would silently downgrade it to legacy chat conversion); 401 leaves it unresolved.
    assert messages_render_mode(servers["primary"], "tinyqwen3", BEARER) == "native"
    assert messages_render_mode(servers["primary"], "tinyqwen3") is None
    with LlmdRenderClient(endpoints=[servers["busy"], servers["primary"]]) as renderer:
        retried = renderer.render_messages(MESSAGES_BODY, authorization=BEARER)
        assert [a.status for a in retried.attempts] == [503, 200]
