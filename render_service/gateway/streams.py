"""Streaming derender with live state: engine chunks in, `vllm serve`'s SSE chunks out.

The parser and detokenizer state of each choice lives in this object for the whole request, so
every chunk costs O(its new tokens) and nothing is snapshotted or echoed (contrast the
/derender endpoints, whose state travels with the client). The chunk shapes are
`ChatCompletionStreamResponse` / `CompletionStreamResponse` as vLLM 0.33's serving code
serializes them: `exclude_unset`, so a key appears exactly when vLLM's code sets it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from render_service import parsers
from render_service.derender import logprobs as lp
from render_service.derender.detokenize import (
    DetokState,
    StopParams,
    decode_params,
    detokenize_delta,
    drop_stop_token,
    seed_state,
)
from render_service.derender.pipeline import DerenderContext, parser_for
from render_service.gateway.stops import HeldText, stop_strings


def stop_params(request: dict[str, Any]) -> StopParams:
    """What stop-token dropping and the stop-string hold-back read from the client's request."""
    return StopParams(
        stop=stop_strings(request),
        stop_token_ids=tuple(request.get("stop_token_ids") or ()),
        ignore_eos=bool(request.get("ignore_eos", False)),
        include_stop_str_in_output=bool(request.get("include_stop_str_in_output", False)),
        min_tokens=int(request.get("min_tokens", 0) or 0),
    )


def usage_options(request: dict[str, Any]) -> tuple[bool, bool]:
    """`should_include_usage`: (a final usage chunk, usage on every chunk)."""
    options = request.get("stream_options") or {}
    include = bool(options.get("include_usage"))
    return include, include and bool(options.get("continuous_usage_stats"))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


@dataclass
class _Choice:
    """One choice's live state."""

    detok: DetokState | None = None  # plain path
    parsed: parsers.ParsedStreamState | None = None  # parser path
    tool_ids: list[str] = field(default_factory=list)
    context: list[int] = field(default_factory=list)  # logprob byte-fallback context
    tokens: int = 0
    text_offset: int = 0  # completions logprobs
    finished: bool = False
    held: HeldText | None = None  # the text hold-back under stop strings


class ChatStream:
    """The `/v1/chat/completions` stream of one request."""

    def __init__(
        self, ctx: DerenderContext, request: dict[str, Any], request_id: str, prompt_ids: list[int], model: str
    ) -> None:
        self.ctx = ctx
        self.request = request
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.model = model
        self.created = int(time.time())
        self.n = int(request.get("n") or 1)
        self.opts = parsers.RequestOptions.from_request(request)
        self.stop = stop_params(request)
        self.include_usage, self.continuous = usage_options(request)
        self.top_limit = lp.chat_top_limit(request)
        self.spaces = bool(request.get("spaces_between_special_tokens", True))
        # The same choice as /derender's (Harmony's parser for gpt-oss); `ctx.has_parser` is False
        # with no parser configured, and the handler refuses streams that need vLLM's parsers.
        self.parser = parser_for(ctx, request)[0] if ctx.has_parser else None
        self.skip_special, _ = decode_params(
            request.get("skip_special_tokens"), self.spaces, preserve_special=self.parser is not None
        )
        self.hide_metadata = self.parser is not None and not self.opts.include_reasoning
        self.return_token_ids = bool(request.get("return_token_ids")) and not self.hide_metadata
        self.choices: dict[int, _Choice] = {}
        self.started = False

    def _choice(self, index: int) -> _Choice:
        state = self.choices.get(index)
        if state is None:
            state = _Choice()
            if self.parser is not None:
                state.parsed = parsers.new_parsed_stream(self.parser, self.prompt_ids)
            else:
                state.detok = seed_state(
                    self.ctx.render.model.hf_tokenizer, self.prompt_ids, skip_special_tokens=self.skip_special
                )
            self.choices[index] = state
        return state

    def prepare(self) -> None:
        """Every choice's state (the detokenizer window primed from the prompt's tail, or the
        parser's stream) made ahead of the first engine chunk, while the engine prefills."""
        for index in range(self.n):
            self._choice(index)

    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            **extra,
        }

    def _continuous_usage(self, completion_tokens: int) -> dict[str, Any]:
        return {**usage(len(self.prompt_ids), completion_tokens), "completion_tokens_details": None}

    def start(self) -> list[dict[str, Any]]:
        """The role chunk of every choice (sent when the first engine output arrives, as vLLM does)."""
        self.started = True
        out = []
        for index in range(self.n):
            chunk = self._chunk(
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            if self.continuous:
                chunk["usage"] = self._continuous_usage(0)
            chunk["prompt_token_ids"] = self.prompt_ids if self.request.get("return_token_ids") else None
            chunk["prompt_text"] = None
            out.append(chunk)
        return out

    def feed(self, engine_chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The client chunks for one engine chunk (none when the parser holds its text back)."""
        out = [] if self.started else self.start()
        for engine_choice in engine_chunk.get("choices") or []:
            chunk = self._step(engine_choice)
            if chunk is not None:
                out.append(chunk)
        return out

    def _step(self, engine_choice: dict[str, Any]) -> dict[str, Any] | None:
        index = int(engine_choice.get("index") or 0)
        state = self._choice(index)
        if state.finished:
            return None
        model = self.ctx.render.model
        delta_ids: list[int] = engine_choice.get("token_ids") or []
        finish = engine_choice.get("finish_reason")
        if not delta_ids and not state.tokens and finish is None:
            return None  # vLLM skips an empty output before the first token
        text_ids, stop_reason = drop_stop_token(
            delta_ids,
            finish,
            engine_choice.get("stop_reason"),
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=self.ctx.model_eos_ids,
            params=self.stop,
        )
        delta: dict[str, Any] | None
        finish_reason = finish
        if not delta_ids and not state.tokens:
            delta = {}  # finished without output: vLLM's unparsed final chunk
            finish_reason = parsers.resolve_finish_reason(finish, self.opts, False) if finish is not None else None
        elif self.parser is not None:
            assert state.parsed is not None

            def tool_id(tool_index: int) -> str:
                ids = state.tool_ids
                return ids[tool_index] if tool_index < len(ids) else parsers.id_for(self.id, index, tool_index)

            release = None
            if self.stop.stop:  # the parser sees the text a detokenizing engine would release
                if state.held is None:
                    state.held = HeldText(self.stop.stop, self.stop.include_stop_str_in_output)
                held = state.held

                def release(text: str) -> str:
                    return held.push(text, finish, stop_reason)

            parsed_delta, finish_reason = parsers.advance(
                self.parser,
                state.parsed,
                text_ids,
                delta_ids,
                finish,
                self.opts,
                tool_id,
                spaces_between_special_tokens=self.spaces,
                release_text=release,
            )
            delta = None if parsed_delta is None else _delta_wire(parsed_delta, state.tool_ids)
        else:
            assert state.detok is not None
            text, state.detok = detokenize_delta(
                model.hf_tokenizer,
                text_ids,
                state.detok,
                skip_special_tokens=self.skip_special,
                spaces_between_special_tokens=self.spaces,
            )
            if self.stop.stop:
                if state.held is None:
                    state.held = HeldText(self.stop.stop, self.stop.include_stop_str_in_output)
                text = state.held.push(text, finish, stop_reason)
            delta = {"content": text}
            if finish is not None:
                finish_reason = parsers.resolve_finish_reason(finish, self.opts, False)
        state.tokens += len(delta_ids)
        resolved = None
        if engine_choice.get("logprobs") is not None and not self.hide_metadata:
            resolved = lp.resolve(engine_choice["logprobs"], self.ctx.decoder, state.context, self.top_limit)
        state.context = lp.context_tail(state.context, delta_ids)
        if delta is None:
            if finish is None and resolved is None and not self.return_token_ids:
                return None
            delta = {}
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": resolved, "finish_reason": None}
        if finish is not None:
            state.finished = True
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = stop_reason
            choice["token_ids"] = delta_ids if self.return_token_ids else None
            choice["weight_versions"] = None
        else:
            choice["token_ids"] = delta_ids if self.return_token_ids else None
        chunk = self._chunk(choice)
        if self.continuous:
            chunk["usage"] = self._continuous_usage(state.tokens)
        chunk["kv_transfer_params"] = None
        return chunk

    def finish(self) -> list[dict[str, Any]]:
        """The usage chunk, when `stream_options.include_usage` asks for it (`exclude_none`)."""
        if not self.include_usage:
            return []
        completion = sum(state.tokens for state in self.choices.values())
        return [
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(len(self.prompt_ids), completion),
            }
        ]


def _delta_wire(delta: parsers.Delta, tool_ids: list[str]) -> dict[str, Any]:
    """`DeltaMessage` as vLLM's parsers set it, dumped with `exclude_unset` (a None field is one
    nobody set); the ids of tool calls are remembered so later deltas of the same call reuse them."""
    out: dict[str, Any] = {}
    if delta.content is not None:
        out["content"] = delta.content
    if delta.reasoning is not None:
        out["reasoning"] = delta.reasoning
    if delta.tool_calls:
        calls = []
        for call in delta.tool_calls:
            if call.id is not None and call.index >= len(tool_ids):
                tool_ids.append(call.id)
            wire: dict[str, Any] = {}
            if call.id is not None:
                wire["id"] = call.id
            if call.type is not None:
                wire["type"] = call.type
            wire["index"] = call.index
            function = {k: v for k, v in (("name", call.name), ("arguments", call.arguments)) if v is not None}
            if function:
                wire["function"] = function
            calls.append(wire)
        out["tool_calls"] = calls
    return out


class CompletionStream:
    """The `/v1/completions` stream of one prompt's generate (`index_base` numbers its choices)."""

    def __init__(
        self,
        ctx: DerenderContext,
        request: dict[str, Any],
        request_id: str,
        prompt_ids: list[int],
        model: str,
        index_base: int = 0,
        echo_text: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.request = request
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.model = model
        self.index_base = index_base
        self.echo_text = echo_text  # the prompt text that starts each choice (`echo`)
        self.created = int(time.time())
        self.stop = stop_params(request)
        self.include_usage, self.continuous = usage_options(request)
        self.top_limit = lp.completion_top_limit(request)
        self.skip_special, self.spaces = decode_params(
            request.get("skip_special_tokens"), request.get("spaces_between_special_tokens", True)
        )
        self.return_token_ids = bool(request.get("return_token_ids"))
        self.choices: dict[int, _Choice] = {}
        self._seeded: dict[int, DetokState] = {}  # `prepare`'s windows, taken by each choice's first output

    def prepare(self) -> None:
        """The detokenizer windows of the request's choices, primed from the prompt's tail ahead
        of the first engine chunk, while the engine prefills."""
        for index in range(int(self.request.get("n") or 1)):
            if index not in self.choices and index not in self._seeded:
                self._seeded[index] = self._seed()

    def _seed(self) -> DetokState:
        return seed_state(self.ctx.render.model.hf_tokenizer, self.prompt_ids, skip_special_tokens=self.skip_special)

    def _choice(self, index: int) -> tuple[_Choice, bool]:
        state = self.choices.get(index)
        if state is None:
            detok = self._seeded.pop(index, None) or self._seed()
            state = self.choices[index] = _Choice(detok=detok)
            return state, True
        return state, False

    def feed(self, engine_chunk: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for engine_choice in engine_chunk.get("choices") or []:
            chunk = self._step(engine_choice)
            if chunk is not None:
                out.append(chunk)
        return out

    def _step(self, engine_choice: dict[str, Any]) -> dict[str, Any] | None:
        index = int(engine_choice.get("index") or 0)
        state, first = self._choice(index)
        model = self.ctx.render.model
        delta_ids: list[int] = engine_choice.get("token_ids") or []
        finish = engine_choice.get("finish_reason")
        if not delta_ids and not state.tokens and finish is None:
            return None
        text_ids, stop_reason = drop_stop_token(
            delta_ids,
            finish,
            engine_choice.get("stop_reason"),
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=self.ctx.model_eos_ids,
            params=self.stop,
        )
        assert state.detok is not None
        text, state.detok = detokenize_delta(
            model.hf_tokenizer,
            text_ids,
            state.detok,
            skip_special_tokens=self.skip_special,
            spaces_between_special_tokens=self.spaces,
        )
        if self.stop.stop:
            if state.held is None:
                state.held = HeldText(self.stop.stop, self.stop.include_stop_str_in_output)
            text = state.held.push(text, finish, stop_reason)
        completion_logprobs = None
        if engine_choice.get("logprobs") is not None:
            resolved = lp.resolve(engine_choice["logprobs"], self.ctx.decoder, state.context, self.top_limit)
            completion_logprobs = lp.to_completion(resolved, engine_choice["logprobs"], state.text_offset)
            if completion_logprobs["tokens"]:
                state.text_offset = completion_logprobs["text_offset"][-1] + len(completion_logprobs["tokens"][-1])
        state.context = lp.context_tail(state.context, delta_ids)
        state.tokens += len(delta_ids)
        token_ids = delta_ids
        if first and self.echo_text is not None:  # vLLM echoes the prompt with the first output
            text = self.echo_text + text
            token_ids = [*self.prompt_ids, *delta_ids]
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": index + self.index_base,
                    "text": text,
                    "logprobs": completion_logprobs,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "prompt_token_ids": self.prompt_ids if first and self.return_token_ids else None,
                    "token_ids": token_ids if self.return_token_ids else None,
                    "weight_versions": None,
                }
            ],
        }
        if self.continuous:
            chunk["usage"] = usage(len(self.prompt_ids), state.tokens)
        chunk["kv_transfer_params"] = None
        return chunk

    @property
    def completion_tokens(self) -> int:
        return sum(state.tokens for state in self.choices.values())
