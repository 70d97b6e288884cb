"""llm-d's render client (EPP `token-producer`, `vllm` backend) reproduced in Python for contract tests.

Mirrors llm-d-router `pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/`
(`vllm_http.go`, `endpoint_discovery.go`, `model_limits.go`, README "Native render contract"):

- transport: HTTP/1.1 only (Go clears TLSNextProto; httpx without h2), 16 idle keep-alive
  connections per endpoint, 90 s idle expiry, no global cap;
- timeouts: `timeout` (5 s) for Completions; max(`timeout`, `mmTimeout`) = 30 s for Chat, Messages and
  Responses, without looking at the content; both attempts share that budget, and an optional
  `attemptTimeout` bounds each attempt;
- endpoints: one fixed URL (never retried) or discovered endpoints in round-robin order; one retry on
  another endpoint after a transport failure, 408, 429 or 5xx, never after other statuses;
- body: the caller's JSON, unmodified except the two render-copy edits (`prefillOnly`, on by
  config: `max_tokens` 1, `max_completion_tokens` 1 when present, `min_tokens` 0 when present, skipped
  when `truncate_prompt_tokens` is non-null; `omitMMKwargs`, on by default: `"return_mm_kwargs":false`
  spliced before the closing brace). The prefillOnly copy is re-marshalled by Go's encoding/json from
  a `map[string]json.RawMessage`: top-level keys sorted, nested values compacted with `<`, `>`, `&`
  escaped as `\\u003c`..., nested key order untouched;
- headers: `Content-Type: application/json`, the inbound `Authorization` verbatim, and a W3C
  `traceparent` (otelhttp: the inbound trace id, a new span id);
- response: only `token_ids` ([]uint32) and `features` (*struct, `omitempty`: null and missing
  are the same nil) with `mm_hashes` map[string][]string and `mm_placeholders`
  map[string][]{offset,length}; features with both maps empty count as none. Go's decoder matches
  field names case-insensitively and ignores unknown fields; it reads the first JSON value only.
- `GET /v1/models` (model-limit discovery): `Authorization: Bearer $VLLM_API_KEY` (never the
  caller's), 2 s timeout, HTTP 200 required, the entry whose `id` equals the configured `modelName`
  with a positive integer `max_model_len`.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

COMPLETIONS = "/v1/completions/render"
CHAT = "/v1/chat/completions/render"
MESSAGES = "/v1/messages/render"
RESPONSES = "/v1/responses/render"
UINT32_MAX = 2**32 - 1
_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class RenderError(Exception):
    """A failed render call, as `postJSONAttempt` classifies it."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.attempts: list[Attempt] = []


def retryable_status(status: int) -> bool:
    """`isRetryableRenderStatus`."""
    return status in (408, 429) or 500 <= status <= 599


@dataclass
class Attempt:
    url: str
    status: int | None  # None: transport failure or timeout
    http_version: str | None = None
    client_port: int | None = None


@dataclass
class MMFeatures:
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[tuple[int, int]]]


@dataclass
class Rendered:
    token_ids: list[int]
    features: MMFeatures | None
    attempts: list[Attempt] = field(default_factory=list)


def _go_field(obj: dict[str, Any], name: str) -> Any:
    """encoding/json's key match: exact first, else case-insensitive (the last such key wins)."""
    if name in obj:
        return obj[name]
    found = None
    for key, value in obj.items():
        if key.lower() == name.lower():
            found = value
    return found


def _uint32_list(value: Any, what: str) -> list[int]:
    if value is None:
        return []  # Go: null leaves a nil slice
    if not isinstance(value, list):
        raise RenderError(f"unmarshal response: cannot unmarshal {type(value).__name__} into {what} []uint32")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= UINT32_MAX:
            raise RenderError(f"unmarshal response: cannot unmarshal {item!r} into {what} uint32")
        out.append(item)
    return out


def parse_render_response(obj: Any) -> tuple[list[int], MMFeatures | None]:
    """`renderResponse` decoding plus `toKVCacheMM`."""
    if obj is None:
        return [], None  # Go: decoding null into a struct is a no-op
    if not isinstance(obj, dict):
        raise RenderError(f"unmarshal response: cannot unmarshal {type(obj).__name__} into renderResponse")
    token_ids = _uint32_list(_go_field(obj, "token_ids"), "renderResponse.token_ids")
    raw = _go_field(obj, "features")
    if raw is None:
        return token_ids, None
    if not isinstance(raw, dict):
        raise RenderError("unmarshal response: features is not an object")
    hashes_raw = _go_field(raw, "mm_hashes") or {}
    places_raw = _go_field(raw, "mm_placeholders") or {}
    if not isinstance(hashes_raw, dict) or not isinstance(places_raw, dict):
        raise RenderError("unmarshal response: mm_hashes and mm_placeholders must be objects")
    hashes: dict[str, list[str]] = {}
    for modality, values in hashes_raw.items():
        if values is not None and (not isinstance(values, list) or not all(isinstance(v, str) for v in values)):
            raise RenderError(f"unmarshal response: mm_hashes[{modality}] is not []string")
        hashes[modality] = list(values or [])
    places: dict[str, list[tuple[int, int]]] = {}
    for modality, ranges in places_raw.items():
        if ranges is not None and not isinstance(ranges, list):
            raise RenderError(f"unmarshal response: mm_placeholders[{modality}] is not a list")
        out = []
        for entry in ranges or []:
            if not isinstance(entry, dict):
                raise RenderError(f"unmarshal response: mm_placeholders[{modality}] entry is not an object")
            offset, length = _go_field(entry, "offset"), _go_field(entry, "length")
            for number in (offset, length):
                if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
                    raise RenderError("unmarshal response: placeholder offset/length is not an int")
            out.append((offset or 0, length or 0))
        places[modality] = out
    if not hashes and not places:
        return token_ids, None
    return token_ids, MMFeatures(hashes, places)


def _go_compact(raw: str) -> str:
    """encoding/json's compact with escapeHTML: drop insignificant whitespace, escape <, >, &."""
    out = []
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            out.append(_HTML_ESCAPES.get(char, char))
        elif char == '"':
            in_string = True
            out.append(char)
        elif char not in " \t\r\n":
            out.append(char)
    return "".join(out)


def raw_envelope(payload: bytes) -> dict[str, str]:
    """`json.Unmarshal(payload, &map[string]json.RawMessage)`: top-level members, values left raw."""
    text = payload.decode()
    decoder = json.JSONDecoder()
    index = len(text) - len(text.lstrip())
    if not text.startswith("{", index):
        raise ValueError("render payload is not a JSON object")
    members: dict[str, str] = {}
    index += 1
    while True:
        index = _skip_ws(text, index)
        if text[index] == "}":
            return members
        key, index = decoder.raw_decode(text, index)
        index = _skip_ws(text, index)
        if text[index] != ":":
            raise ValueError("expected ':'")
        start = _skip_ws(text, index + 1)
        _, end = decoder.raw_decode(text, start)
        members[key] = text[start:end]  # a duplicate key: the last one wins, as in Go
        index = _skip_ws(text, end)
        if text[index] == ",":
            index += 1


def _skip_ws(text: str, index: int) -> int:
    while text[index] in " \t\r\n":
        index += 1
    return index


def go_marshal_envelope(members: dict[str, str]) -> bytes:
    """`json.Marshal(map[string]json.RawMessage)`: keys sorted, raw values compacted (order kept)."""
    parts = [
        f"{_go_compact(json.dumps(key, ensure_ascii=False))}:{_go_compact(value)}"
        for key, value in sorted(members.items())
    ]
    return ("{" + ",".join(parts) + "}").encode()


def render_only_budget(payload: bytes) -> bytes:
    """`renderOnlyBudget` (vllm.prefillOnly)."""
    members = raw_envelope(payload)
    truncate = members.get("truncate_prompt_tokens")
    if truncate is not None and truncate.strip() != "null":
        return payload
    members["max_tokens"] = "1"
    if "max_completion_tokens" in members:
        members["max_completion_tokens"] = "1"
    if "min_tokens" in members:
        members["min_tokens"] = "0"
    return go_marshal_envelope(members)


def omit_mm_kwargs(payload: bytes) -> bytes:
    """`omitMMKwargs`: splice `"return_mm_kwargs":false` before the closing brace, without decoding."""
    end = payload.rfind(b"}")
    head = payload[: max(end, 0)].strip()
    if end < 0 or not head or head[:1] != b"{" or payload[end + 1 :].strip():
        raise ValueError("render payload is not a JSON object")
    separator = b"" if head.endswith(b"{") else b","
    return payload[:end] + separator + b'"return_mm_kwargs":false' + payload[end:]


def child_traceparent(inbound: str | None) -> str | None:
    """What otelhttp injects for a sampled inbound context: same trace id, a new span id."""
    if not inbound:
        return None
    version, trace_id, _parent, flags = inbound.split("-")
    return f"{version}-{trace_id}-{secrets.token_hex(8)}-{flags}"


class LlmdRenderClient:
    """`vllmHTTPRenderer`: pass `url` (fixed endpoint) or `endpoints` (discovery, round-robin)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        endpoints: list[str] | None = None,
        timeout: float = 5.0,
        mm_timeout: float = 30.0,
        attempt_timeout: float | None = None,
        prefill_only: bool = False,
        omit_mm_kwargs: bool = True,
    ) -> None:
        if (url is None) == (endpoints is None):
            raise ValueError("only one of 'url' or 'endpointDiscovery' may be set")
        self.fixed = url.rstrip("/") if url is not None else None
        self.endpoints = [e.rstrip("/") for e in endpoints or []]
        self.next = 0
        self.timeout = timeout
        self.mm_timeout = mm_timeout
        self.attempt_timeout = attempt_timeout
        self.prefill_only = prefill_only
        self.omit_mm_kwargs = omit_mm_kwargs
        # Go's Transport: HTTP/1.1, MaxIdleConnsPerHost 16, MaxIdleConns 0 (no cap), IdleConnTimeout 90 s.
        self.http = httpx.Client(
            http1=True,
            http2=False,
            timeout=None,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=16, keepalive_expiry=90.0),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> LlmdRenderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Endpoint picking (`fixedEndpointPicker`, `discoveredEndpointPicker` + round-robin).
    def _pick(self, excluded: frozenset[str] | set[str] = frozenset()) -> str:
        if self.fixed is not None:
            return self.fixed
        available = [e for e in self.endpoints if e not in excluded]
        if not available:
            raise RenderError("no vLLM render endpoints discovered")
        if self.next >= len(available):
            self.next = 0
        chosen = available[self.next]
        self.next = (self.next + 1) % len(available)
        return chosen

    # The four render calls (`Render`, `RenderChat`, `RenderMessages`, `RenderResponses`).
    def render_completions(self, body: bytes, **headers: str | None) -> list[Rendered]:
        data, attempts = self._post(COMPLETIONS, body, self.timeout, **headers)
        if not isinstance(data, list):
            raise RenderError("unmarshal response: cannot unmarshal object into []renderResponse")
        if not data:
            raise RenderError("vLLM render returned empty response")
        out = []
        for item in data:
            token_ids, features = parse_render_response(item)
            out.append(Rendered(token_ids, features, attempts))
        return out

    def render_chat(self, body: bytes, **headers: str | None) -> Rendered:
        return self._conversation(CHAT, body, **headers)

    def render_messages(self, body: bytes, **headers: str | None) -> Rendered:
        return self._conversation(MESSAGES, body, **headers)

    def render_responses(self, body: bytes, **headers: str | None) -> Rendered:
        return self._conversation(RESPONSES, body, **headers)

    def _conversation(self, path: str, body: bytes, **headers: str | None) -> Rendered:
        data, attempts = self._post(path, body, max(self.timeout, self.mm_timeout), **headers)
        token_ids, features = parse_render_response(data)
        return Rendered(token_ids, features, attempts)

    def render_copy(self, body: bytes) -> bytes:
        """The bytes llm-d sends for `body`."""
        if self.prefill_only:
            body = render_only_budget(body)
        if self.omit_mm_kwargs:
            body = omit_mm_kwargs(body)
        return body

    def _post(
        self, path: str, body: bytes, timeout: float, authorization: str | None = None, traceparent: str | None = None
    ) -> tuple[Any, list[Attempt]]:
        """`postJSON`: one attempt, then at most one retry on another endpoint within the same budget."""
        payload = self.render_copy(body)
        deadline = time.monotonic() + timeout
        attempts: list[Attempt] = []
        url = self._pick()
        try:
            return self._attempt(url, path, payload, deadline, authorization, traceparent, attempts), attempts
        except RenderError as first:
            if not first.retryable or self.fixed is not None or time.monotonic() >= deadline:
                first.attempts = attempts
                raise
            try:
                other = self._pick({url})
            except RenderError:
                first.attempts = attempts
                raise first from None
        try:
            return self._attempt(other, path, payload, deadline, authorization, traceparent, attempts), attempts
        except RenderError as second:
            second.attempts = attempts
            raise

    def _attempt(
        self,
        base: str,
        path: str,
        payload: bytes,
        deadline: float,
        authorization: str | None,
        traceparent: str | None,
        attempts: list[Attempt],
    ) -> Any:
        remaining = deadline - time.monotonic()
        if self.attempt_timeout is not None:
            remaining = min(remaining, self.attempt_timeout)
        headers = {"Content-Type": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        child = child_traceparent(traceparent)
        if child:
            headers["traceparent"] = child
        try:
            response = self.http.post(
                base + path, content=payload, headers=headers, timeout=httpx.Timeout(max(remaining, 0.001))
            )
        except httpx.HTTPError as exc:
            attempts.append(Attempt(base, None))
            raise RenderError(f"post {path}: {exc!r}", retryable=True) from exc
        stream = response.extensions.get("network_stream")
        client_addr = stream.get_extra_info("client_addr") if stream is not None else None
        attempts.append(
            Attempt(base, response.status_code, response.http_version, client_addr[1] if client_addr else None)
        )
        if not 200 <= response.status_code < 300:
            raise RenderError(
                f"vLLM render returned status {response.status_code}: {response.text[:1024]}",
                status=response.status_code,
                retryable=retryable_status(response.status_code),
            )
        try:
            value, _ = json.JSONDecoder().raw_decode(response.text.lstrip())
        except ValueError as exc:
            raise RenderError(f"unmarshal response: {exc}") from exc
        return value


def read_model_limit(url: str, model: str, api_key: str | None = None) -> int:
    """`readModelLimit`: the warm-up credential (VLLM_API_KEY) only, 2 s, exact id, positive int."""
    api_key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY", "")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=2.0)
    if response.status_code != 200:
        raise RenderError(f"models endpoint returned HTTP {response.status_code}", status=response.status_code)
    body = response.json()
    for entry in (_go_field(body, "data") or []) if isinstance(body, dict) else []:
        entry_id = _go_field(entry, "id")
        limit = _go_field(entry, "max_model_len")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise RenderError(f"json: cannot unmarshal {limit!r} into max_model_len int")
        if entry_id == model and (limit or 0) > 0:
            return int(limit)
    raise RenderError(f"models endpoint has no positive max_model_len for {model!r}")


def messages_render_mode(url: str, model: str, authorization: str | None = None) -> str | None:
    """`messagesRenderMode: auto` discovery: probe Messages render with a small text request; 2xx selects
    "native"; 404/405 selects "legacy" (chat-render conversion) only if the same probe renders as chat;
    anything else leaves the mode unresolved (None). (The probe's exact text is llm-d's own; any small
    text request exercises the same branches.)"""
    headers = {"Authorization": authorization} if authorization else {}
    probe = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    native = httpx.post(url.rstrip("/") + MESSAGES, json=probe, headers=headers, timeout=30)
    if 200 <= native.status_code < 300:
        return "native"
    if native.status_code in (404, 405):
        chat = httpx.post(
            url.rstrip("/") + CHAT, json={"model": model, "messages": probe["messages"]}, headers=headers, timeout=30
        )
        return "legacy" if 200 <= chat.status_code < 300 else None
    return None
