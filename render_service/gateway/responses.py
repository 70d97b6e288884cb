"""`/v1/responses` answers, built as vLLM 0.33's `OpenAIServingResponses` builds them on its
simple (non-Harmony) path: one generation, parsed by the configured parsers.

The gateway parses the output as chat derender does, on a chat view of the request (its tools as
chat tools, its tool choice, `include_reasoning`), then shapes it: `output_items` is
`build_response_output_items`, `envelope` is `ResponsesResponse.from_request` (dumped with
`model_dump(mode="json")`, so every field is present), and `ResponsesStream` is
`SimpleStreamingEventProcessor` with `responses_stream_generator`'s framing (`event: TYPE\\ndata:
JSON`, sequence numbers from 0, `response.created` / `in_progress` first, then
`response.completed` or `response.incomplete`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from functools import cache
from typing import Any

import orjson
import partial_json_parser  # type: ignore[import-untyped]
from partial_json_parser.core.options import Allow  # type: ignore[import-untyped]

from render_service.api import generated, responses

# Reasoning is not in the recorded schemas; openai's `Reasoning` fields, in declaration order.
_REASONING_FIELDS = ("context", "effort", "generate_summary", "mode", "summary")


OUTPUT_LOGPROBS = "message.output_text.logprobs"


def random_id() -> str:
    return uuid.uuid4().hex[:16]  # vLLM's `random_uuid` length


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"  # `make_tool_call_id`'s random form


# -- echoing the request as pydantic dumps it ------------------------------------------------


@cache
def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = orjson.loads(generated.SCHEMAS.read_bytes())
    return schemas


def _matches(node: dict[str, Any], value: Any) -> bool:
    """Whether `value` fits union member `node` (required fields present, literal tags equal)."""
    node = _resolve(node)
    if node["k"] == "literal":
        return value in node["v"]
    if node["k"] != "model" or not isinstance(value, dict):
        return node["k"] == "any" or (node["k"] == "str" and isinstance(value, str))
    for name, field_type, required in node["f"]:
        if required and name not in value:
            return False
        inner = _resolve(field_type)
        if name in value and inner["k"] == "literal" and value[name] not in inner["v"]:
            return False
    return True


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while node["k"] in ("ref", "fn"):
        node = _schemas()["defs"][node["r"]] if node["k"] == "ref" else node["s"]
    return node


def dump(node: dict[str, Any], value: Any) -> Any:
    """`value` (already validated) as pydantic's `model_dump(mode="json")` writes it: a model's
    unset optional fields as null, in declaration order, then its extra keys."""
    node = _resolve(node)
    kind = node["k"]
    if value is None:
        return None
    if kind == "nullable":
        return dump(node["s"], value)
    if kind in ("list", "iter") and isinstance(value, list):
        return [dump(node["s"], item) for item in value]
    if kind == "union":
        members = node["c"]
        ordered = [m for m in members if _resolve(m)["k"] == "model" and _resolve(m)["kind"] == "model"]
        for member in ordered + [m for m in members if m not in ordered]:
            if _matches(member, value):
                return dump(member, value)
        return value
    if kind == "model" and isinstance(value, dict):
        fields = node["f"]
        out: dict[str, Any] = {}
        for name, field_type, _required in fields:
            if name in value:
                out[name] = dump(field_type, value[name])
            elif node["kind"] == "model":
                out[name] = None
        known = {name for name, _, _ in fields}
        out.update((k, v) for k, v in value.items() if k not in known)
        return out
    return value


def _root(name: str) -> dict[str, Any]:
    root: dict[str, Any] = _schemas()["roots"][name]
    return root


def envelope(
    body: dict[str, Any],
    sampling: dict[str, Any],
    *,
    request_id: str,
    model: str,
    created: int,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
    kv_transfer_params: Any = None,
) -> dict[str, Any]:
    """`ResponsesResponse.from_request(...)` dumped: the request's settings echoed, the sampling
    values as the engine ran them."""
    reasoning = body.get("reasoning")
    parallel = body.get("parallel_tool_calls")
    return {
        "id": request_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True if parallel is None else parallel,
        "temperature": sampling.get("temperature", 1.0),
        "tool_choice": dump(_root("responses.tool_choice"), body.get("tool_choice", "auto")),
        "tools": dump(_root("responses.tools"), body.get("tools") or []),
        "top_p": sampling.get("top_p", 1.0),
        "background": bool(body.get("background") or False),
        "max_output_tokens": sampling.get("max_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": body.get("previous_response_id"),
        "prompt": body.get("prompt"),
        "prompt_cache_options": body.get("prompt_cache_options"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "reasoning": None if reasoning is None else {k: reasoning.get(k) for k in _REASONING_FIELDS},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": body.get("service_tier", "auto"),
        "status": status,
        "text": dump(_root("responses.text"), body.get("text")),
        "top_logprobs": sampling.get("logprobs"),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "user": body.get("user"),
        "presence_penalty": sampling.get("presence_penalty", 0.0),
        "frequency_penalty": sampling.get("frequency_penalty", 0.0),
        "kv_transfer_params": kv_transfer_params,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def usage(prompt_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    """`ResponseUsage` of one generation (no per-turn metrics: the simple path has one turn)."""
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt_tokens + output_tokens,
    }


def item_status(finish_reason: str | None) -> str:
    """`response_item_status`."""
    return "incomplete" if finish_reason == "length" else "completed"


# -- the chat view ----------------------------------------------------------------------------


def chat_view(body: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """What the parsers read, as the chat request vLLM's Responses parser is given: function tools
    as chat tools, the tool choice, `include_reasoning`, the decode flags the render settled on."""
    tools = responses._chat_tools(body)
    view: dict[str, Any] = {
        "include_reasoning": body.get("include_reasoning", True),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "skip_special_tokens": sampling.get("skip_special_tokens", True),
        "spaces_between_special_tokens": body.get("spaces_between_special_tokens", True),
        "include_stop_str_in_output": body.get("include_stop_str_in_output", False),
    }
    if tools:
        view["tools"] = tools
        view["tool_choice"] = responses._chat_tool_choice(body.get("tool_choice", "auto"))
    else:
        view["tool_choice"] = "none"
    return view


def _function_tools(body: dict[str, Any]) -> dict[str, str | None]:
    """Function names -> their namespace (a tool inside a `namespace` tool), as vLLM maps them."""
    names: dict[str, str | None] = {}
    for tool in body.get("tools") or []:
        if tool.get("type") == "function":
            names.setdefault(tool["name"], None)
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if inner.get("type") == "function":
                    names.setdefault(inner["name"], tool.get("name"))
    return names


def _custom_tools(body: dict[str, Any]) -> set[str]:
    return {t["name"] for t in body.get("tools") or [] if t.get("type") == "custom"}


def output_logprobs(body: dict[str, Any]) -> bool:
    """`is_include_output_logprobs`: only `include` asks for them (`top_logprobs` alone does not)."""
    include = body.get("include")
    return isinstance(include, list) and OUTPUT_LOGPROBS in include


def text_logprobs(chat_logprobs: Any) -> list[dict[str, Any]] | None:
    """`_create_response_logprobs` from the chat answer's logprobs, which vLLM resolves alike
    (decoded token, clamped logprob, bytes, the first `top_logprobs` entries)."""
    if not isinstance(chat_logprobs, dict) or chat_logprobs.get("content") is None:
        return None
    return [
        {
            "token": entry["token"],
            "bytes": entry["bytes"],
            "logprob": entry["logprob"],
            "top_logprobs": [
                {"token": top["token"], "bytes": top["bytes"], "logprob": top["logprob"]}
                for top in entry.get("top_logprobs") or []
            ],
        }
        for entry in chat_logprobs["content"]
    ]


def _stream_logprobs(chat_logprobs: Any) -> list[dict[str, Any]]:
    """`_to_stream_logprobs`: a delta event's logprobs carry no bytes."""
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]],
        }
        for entry in text_logprobs(chat_logprobs) or []
    ]


def output_items(
    body: dict[str, Any], message: dict[str, Any], finish_reason: str | None, logprobs: Any = None
) -> list[dict[str, Any]]:
    """`build_response_output_items` (or the no-parser message) from a derendered chat message;
    `logprobs` (the whole output's) go on the message's text."""
    last_status = item_status(finish_reason)
    reasoning = message.get("reasoning")
    content = message.get("content")
    calls = message.get("tool_calls") or []
    out: list[dict[str, Any]] = []
    if reasoning:
        out.append(_reasoning_item(f"rs_{random_id()}", reasoning, None))
    if content:
        out.append(_message_item(f"msg_{random_id()}", content, "completed" if calls else last_status, logprobs))
    namespaces = _function_tools(body)
    custom = _custom_tools(body)
    for position, call in enumerate(calls):
        function = call["function"]
        name = function["name"]
        call_id = call.get("id") or tool_call_id()
        if name in custom:
            out.append(_custom_item(f"ctc_{random_id()}", call_id, name, function["arguments"]))
            continue
        status = last_status if position == len(calls) - 1 else "completed"
        out.append(
            _function_item(f"fc_{random_id()}", call_id, name, namespaces.get(name), function["arguments"], status)
        )
    return out


def plain_output(text: str, finish_reason: str | None, logprobs: Any = None) -> list[dict[str, Any]]:
    """The no-parser output: one message, empty when nothing was generated."""
    item = _message_item(f"msg_{random_id()}", text, item_status(finish_reason), logprobs)
    if not text:
        item["content"] = []
    return [item]


def _text_part(text: str, logprobs: Any = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _message_item(item_id: str, text: str, status: str, logprobs: Any = None) -> dict[str, Any]:
    return {
        "id": item_id,
        "content": [_text_part(text, logprobs)],
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _reasoning_item(item_id: str, text: str, status: str | None) -> dict[str, Any]:
    return {
        "id": item_id,
        "summary": [],
        "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}],
        "encrypted_content": None,
        "status": status,
    }


def _function_item(
    item_id: str, call_id: str, name: str, namespace: str | None, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": item_id,
        "async": None,
        "caller": None,
        "namespace": namespace,
        "status": status,
    }


def _custom_item(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "input": _custom_input(arguments),
        "name": name,
        "type": "custom_tool_call",
        "id": item_id,
        "async": None,
        "caller": None,
        "namespace": None,
    }


def _custom_input(arguments: str) -> str:
    """`decode_custom_tool_input`: a custom tool's payload travels as `{"input": ...}` JSON."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


# -- streaming --------------------------------------------------------------------------------


def event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponsesStream:
    """Chat deltas (from the gateway's chat stream) in, Responses events out."""

    def __init__(self, body: dict[str, Any], sampling: dict[str, Any], request_id: str, model: str) -> None:
        self.body = body
        self.sampling = sampling
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.sequence = 0
        self.state: str | None = None  # None, "content", "reasoning", "tool_call"
        self.output_index = 0
        self.item_id = ""
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []  # the open message's, for its done events
        self.with_logprobs = output_logprobs(body)
        self.tool: dict[str, Any] = {}
        self.items: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.kv_transfer_params: Any = None
        self.namespaces = _function_tools(body)
        self.custom = _custom_tools(body)

    def _emit(self, payload: dict[str, Any]) -> bytes:
        payload = {**payload, "sequence_number": self.sequence}
        self.sequence += 1
        return event(payload)

    def _envelope(
        self, status: str, output: list[dict[str, Any]], final_usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return envelope(
            self.body,
            self.sampling,
            request_id=self.request_id,
            model=self.model,
            created=self.created,
            output=output,
            status=status,
            usage=final_usage,
            kv_transfer_params=self.kv_transfer_params,
        )

    def start(self) -> list[bytes]:
        initial = self._envelope("in_progress", [], None)
        return [
            self._emit({"response": initial, "type": "response.created"}),
            self._emit({"response": initial, "type": "response.in_progress"}),
        ]

    # -- one chat chunk ----------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if chunk.get("usage") is not None:
            self.prompt_tokens = chunk["usage"]["prompt_tokens"]
            self.output_tokens = chunk["usage"]["completion_tokens"] or 0
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if "role" in delta:
                continue
            logprobs = choice.get("logprobs") if self.with_logprobs else None
            for part in _split(delta):
                out += self._step(part, logprobs)
        return out

    def _step(self, delta: dict[str, Any], logprobs: Any = None) -> list[bytes]:
        """One delta's events; a content delta carries its engine chunk's `logprobs` (as vLLM's
        `emit_delta`: those of a chunk that shows no content are not sent)."""
        calls = delta.get("tool_calls") or []
        call = calls[0] if calls and calls[0].get("function") is not None else None
        if call is not None:
            target = "tool_call"
        elif delta.get("reasoning") is not None:
            target = "reasoning"
        elif delta.get("content"):
            target = "content"
        else:
            return []
        out: list[bytes] = []
        switch = self.state != target or (
            target == "tool_call" and call is not None and self.tool.get("index") not in (None, call.get("index"))
        )
        if switch:
            out += self.close()
            out += self._open(target, call)
        if target == "tool_call":
            arguments = "".join((c.get("function") or {}).get("arguments") or "" for c in calls)
            if arguments:
                self.text += arguments
                if self.tool["custom"]:
                    out += self._custom_delta(_custom_input_prefix(self.text))
                else:
                    out.append(
                        self._emit(
                            {
                                "delta": arguments,
                                "item_id": self.item_id,
                                "output_index": self.output_index,
                                "type": "response.function_call_arguments.delta",
                            }
                        )
                    )
        elif target == "reasoning":
            self.text += delta["reasoning"]
            out.append(
                self._emit(
                    {
                        "content_index": 0,
                        "delta": delta["reasoning"],
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "type": "response.reasoning_text.delta",
                    }
                )
            )
        else:
            self.text += delta["content"]
            self.logprobs += text_logprobs(logprobs) or []
            out.append(
                self._emit(
                    {
                        "content_index": 0,
                        "delta": delta["content"],
                        "item_id": self.item_id,
                        "logprobs": _stream_logprobs(logprobs),
                        "output_index": self.output_index,
                        "type": "response.output_text.delta",
                    }
                )
            )
        return out

    def _open(self, target: str, call: dict[str, Any] | None) -> list[bytes]:
        self.state = target
        self.text = ""
        self.logprobs = []
        if target == "content":
            self.item_id = f"msg_{random_id()}"
            message = {"id": self.item_id, "content": [], "role": "assistant", "status": "in_progress"}
            return [
                self._added({**message, "type": "message", "phase": None}),
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "part": {"annotations": [], "text": "", "type": "output_text", "logprobs": []},
                        "type": "response.content_part.added",
                    }
                ),
            ]
        if target == "reasoning":
            self.item_id = f"rs_{random_id()}"
            item: dict[str, Any] = {
                "id": self.item_id,
                "summary": [],
                "type": "reasoning",
                "content": None,
                "encrypted_content": None,
                "status": "in_progress",
            }
            return [
                self._added(item),
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "part": {"text": "", "type": "reasoning_text"},
                        "type": "response.content_part.added",
                    }
                ),
            ]
        assert call is not None
        name = call["function"].get("name") or ""
        custom = name in self.custom
        self.item_id = f"{'ctc' if custom else 'fc'}_{random_id()}"
        call_id = call.get("id") or tool_call_id()
        self.tool = {"index": call.get("index"), "name": name, "call_id": call_id, "custom": custom, "payload": ""}
        if custom:
            item = _custom_item(self.item_id, call_id, name, "")
        else:
            item = _function_item(self.item_id, call_id, name, self.namespaces.get(name), "", "in_progress")
        return [self._added(item)]

    def _added(self, item: dict[str, Any]) -> bytes:
        return self._emit({"item": item, "output_index": self.output_index, "type": "response.output_item.added"})

    def _done(self, item: dict[str, Any]) -> bytes:
        self.items.append(item)
        return self._emit({"item": item, "output_index": self.output_index, "type": "response.output_item.done"})

    def _custom_delta(self, payload: str) -> list[bytes]:
        streamed = self.tool["payload"]
        if payload == streamed:
            return []
        self.tool["payload"] = payload
        delta = payload[len(streamed) :] if payload.startswith(streamed) else payload
        return [
            self._emit(
                {
                    "delta": delta,
                    "item_id": self.item_id,
                    "output_index": self.output_index,
                    "type": "response.custom_tool_call_input.delta",
                }
            )
        ]

    def close(self, status: str = "completed") -> list[bytes]:
        """The open item's done events (`close_current`)."""
        if self.state is None:
            return []
        out: list[bytes]
        if self.state == "content":
            part = _text_part(self.text, self.logprobs or None)
            item = _message_item(self.item_id, self.text, status)
            item["content"] = [part] if self.text else []
            out = [
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "logprobs": [],
                        "output_index": self.output_index,
                        "text": self.text,
                        "type": "response.output_text.done",
                    }
                ),
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "part": part,
                        "type": "response.content_part.done",
                    }
                ),
                self._done(item),
            ]
        elif self.state == "reasoning":
            part = {"text": self.text, "type": "reasoning_text"}
            out = [
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "text": self.text,
                        "type": "response.reasoning_text.done",
                    }
                ),
                self._emit(
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "part": part,
                        "type": "response.content_part.done",
                    }
                ),
                self._done(_reasoning_item(self.item_id, self.text, status)),
            ]
        elif self.tool["custom"]:
            payload = _custom_input(self.text)
            out = self._custom_delta(payload)
            out.append(
                self._emit(
                    {
                        "input": payload,
                        "item_id": self.item_id,
                        "output_index": self.output_index,
                        "type": "response.custom_tool_call_input.done",
                    }
                )
            )
            item = _custom_item(self.item_id, self.tool["call_id"], self.tool["name"], self.text)
            out.append(self._done(item))
        else:
            name = self.tool["name"]
            out = [
                self._emit(
                    {
                        "arguments": self.text,
                        "item_id": self.item_id,
                        "name": name,
                        "output_index": self.output_index,
                        "type": "response.function_call_arguments.done",
                    }
                )
            ]
            item = _function_item(
                self.item_id, self.tool["call_id"], name, self.namespaces.get(name), self.text, status
            )
            out.append(self._done(item))
        self.output_index += 1
        self.state = None
        self.tool = {}
        return out

    def finish(self, reasoning_tokens: int = 0) -> list[bytes]:
        out = self.close(item_status(self.finish_reason))
        status = "incomplete" if self.finish_reason == "length" else "completed"
        final = self._envelope(status, self.items, usage(self.prompt_tokens, self.output_tokens, reasoning_tokens))
        out.append(self._emit({"response": final, "type": f"response.{status}"}))
        return out

    def fail(self, message: str) -> list[bytes]:
        """vLLM's streamed error event (`_convert_generation_error_to_streaming_response`)."""
        return [self._emit({"type": "error", "code": "InternalServerError", "message": message, "param": None})]


def _custom_input_prefix(arguments: str) -> str:
    """`decode_custom_tool_input_prefix`: the longest payload prefix of partial `{"input": ...`
    arguments, so the streamed deltas stay a prefix of the final input."""
    try:
        parsed = partial_json_parser.loads(arguments, Allow.STR | Allow.OBJ)
    except (ValueError, IndexError, AssertionError):
        return ""
    payload = parsed.get("input") if isinstance(parsed, dict) else None
    if not isinstance(payload, str):
        return ""
    if payload and "\ud800" <= payload[-1] <= "\udbff":  # half a surrogate pair
        payload = payload[:-1]
    return payload


def _split(delta: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """`split_delta`: one typed delta per event kind (reasoning, content, each tool call index)."""
    parts = [key for key in ("reasoning", "content") if delta.get(key) is not None]
    calls = delta.get("tool_calls") or []
    indexes = {c.get("index") for c in calls}
    if len(parts) + bool(calls) <= 1 and len(indexes) <= 1:
        return [delta]
    out: list[dict[str, Any]] = [{key: delta[key]} for key in parts]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for call in calls:
        groups.setdefault(call.get("index"), []).append(call)
    out += [{"tool_calls": group} for group in groups.values()]
    return out
