"""`/v1/messages` answers, built as vLLM 0.33's `AnthropicServingMessages` builds them: from the
chat completion (or the chat stream) of the converted request.

vLLM runs a Messages request as a chat request (api/messages.py converts it) and translates the
chat answer: `full_message` is `messages_full_converter` (dumped with `exclude_none`), and
`MessagesStream` is `message_stream_converter`, an event state machine over chat chunks (each
event dumped with `exclude_unset`, framed as `event: NAME\\ndata: JSON`).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from render_service.exceptions import RenderServiceError

# `translate_error_type`: Anthropic SDKs dispatch on `error.type`.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


class AnthropicError(RenderServiceError):
    """A handler error answered in Anthropic's shape (vLLM's `translate_error_response`), keeping
    the status and headers (Retry-After) of the error it wraps."""

    def __init__(self, inner: RenderServiceError) -> None:
        super().__init__(inner.message)
        self.inner = inner
        self.status_code = inner.status_code

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error_type(self.status_code), "message": self.message}}

    def headers(self) -> dict[str, str] | None:
        return self.inner.headers()


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    """`_build_anthropic_usage` (the cache fields stay unset: the engine reports no prompt details)."""
    if chat_usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": max(0, chat_usage["prompt_tokens"]), "output_tokens": chat_usage["completion_tokens"] or 0}


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def stop_reason(
    finish_reason: str | None, stop: int | str | None, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """`_to_anthropic_stop_reason`: (stop_reason, stop_sequence)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def full_message(chat: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming chat completion as an Anthropic message (`exclude_none`)."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"), bool(calls), bool(calls))
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": uuid.uuid4().hex})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        function = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": orjson.loads(function["arguments"]),
            }
        )
    if not content:  # Anthropic's shape of an empty completion: one empty text block
        content.append({"type": "text", "text": ""})
    out: dict[str, Any] = {
        "id": chat["id"],
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": chat["model"],
    }
    if reason is not None:
        out["stop_reason"] = reason
    if sequence is not None:
        out["stop_sequence"] = sequence
    out["usage"] = usage(chat.get("usage"))
    for key in ("kv_transfer_params", "ec_transfer_params"):
        if chat.get(key) is not None:
            out[key] = chat[key]
    return out


def event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class MessagesStream:
    """`message_stream_converter`: chat chunks in, Anthropic SSE events out (one content block
    open at a time; text that arrives inside a tool_use block is held and flushed after it)."""

    def __init__(self) -> None:
        self.first = True
        self.finish_reason: str | None = None
        self.stop_sequence: int | str | None = None
        self.tool_used = False
        self.last_tool_args: list[str] = []
        self.tool_ids: dict[int, str] = {}
        self.next_index = 0  # `content_block_index`
        self.block_type: str | None = None
        self.block_index: int | None = None
        self.signature: str | None = None
        self.signature_sent = False
        self.tool_use_id: str | None = None
        self.pending: list[str] = []

    # -- blocks ------------------------------------------------------------------------------

    def _index(self) -> int:
        return self.block_index if self.block_index is not None else self.next_index

    def _start(self, block: dict[str, Any]) -> bytes:
        out = event(
            "content_block_start", {"type": "content_block_start", "content_block": block, "index": self.next_index}
        )
        self.block_type = block["type"]
        self.block_index = self.next_index
        self.signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self.signature_sent = block["type"] != "thinking"
        self.tool_use_id = block.get("id") if block["type"] == "tool_use" else None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self._index()})

    def _stop(self) -> list[bytes]:
        if self.block_type is None:
            return []
        out = []
        if self.block_type == "thinking" and self.signature is not None and not self.signature_sent:
            out.append(self._delta({"type": "signature_delta", "signature": self.signature}))
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.block_index}))
        self.block_type = self.block_index = self.signature = self.tool_use_id = None
        self.signature_sent = False
        self.pending.clear()
        self.next_index += 1
        return out

    def _stop_and_flush(self) -> list[bytes]:
        held = "".join(self.pending)
        self.pending.clear()
        out = self._stop()
        if held:
            out.append(self._start({"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": held}))
            out += self._stop()
        return out

    # -- chunks ------------------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        if self.first:
            self.first = False
            message = {
                "id": chunk["id"],
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk["model"],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage(chunk.get("usage")),
            }
            return [event("message_start", {"type": "message_start", "message": message})]
        if not chunk["choices"]:  # the final usage chunk
            out = self._stop_and_flush()
            complete = self.tool_used and _is_json("".join(self.last_tool_args))
            reason, sequence = stop_reason(self.finish_reason or "stop", self.stop_sequence, self.tool_used, complete)
            out.append(
                event(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(chunk.get("usage")),
                    },
                )
            )
            return out
        choice = chunk["choices"][0]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.stop_sequence = choice.get("stop_reason")
        delta = choice["delta"]
        out = []
        reasoning = delta.get("reasoning")
        if reasoning:
            if self.block_type != "thinking":
                out += self._stop_and_flush()
                out.append(self._start({"type": "thinking", "thinking": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if text:
            if self.block_type == "tool_use":
                self.pending.append(text)
            else:
                if self.block_type != "text":
                    out += self._stop_and_flush()
                    out.append(self._start({"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or []:
            out += self._tool_call(call)
        return out

    def _tool_call(self, call: dict[str, Any]) -> list[bytes]:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        out = []
        if call.get("id") is not None:
            self.tool_ids[call["index"]] = call["id"]
            if self.tool_use_id != call["id"] and function.get("name") is not None:
                out += self._stop_and_flush()
                self.tool_used = True
                self.last_tool_args = []
                out.append(self._start({"type": "tool_use", "id": call["id"], "name": function["name"], "input": {}}))
            current = call["id"]
        else:
            current = self.tool_ids.get(call["index"])
        if arguments and current is not None and self.tool_use_id == current:
            self.last_tool_args.append(arguments)
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return out

    def finish(self) -> list[bytes]:
        return [*self._stop_and_flush(), event("message_stop", {"type": "message_stop"})]

    def fail(self, status: int, message: str) -> list[bytes]:
        """An error after the stream started: close the open block, then Anthropic's error event."""
        error = {"type": error_type(status), "message": message}
        return [*self._stop(), event("error", {"type": "error", "error": error})]
