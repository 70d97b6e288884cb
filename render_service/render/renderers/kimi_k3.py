"""The `kimi_k3` renderer: vLLM 0.33's `KimiK3Renderer` around the model's own chat encoder.

Kimi K3 ships no chat template in vLLM: its tokenizer's `apply_chat_template` writes the XTML
format. vLLM's renderer prepares what that call gets, and this module does the same:

- tool results are reordered to follow the assistant's calls (matched by `tool_call_id` or by
  a `"{name}:{position}"` alias) and carry `tool` and `index` (1-based); a block with any
  unmatched result keeps its order;
- `enable_thinking` becomes `thinking`; `reasoning_effort` "none" turns thinking off, any
  other value becomes `thinking_effort`, which must be low, high or max (a 400 otherwise);
- a `tool_choice` other than "auto" (only when the request has tools) and the
  `response_format` are passed to the encoder, as their JSON dumps;
- the prompt is tokenized here, without the request's `add_special_tokens`.

The encoder is the chat template the model folder provides (rendered as Hugging Face
renders it); a K3 tokenizer whose encoder is remote Python code needs `--trust-remote-code`
and is called through its own `apply_chat_template`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from render_service.api.protocol import handler_error
from render_service.render import templating
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt

THINKING_EFFORTS = ("low", "high", "max")
# Consumed by the call itself (HF's apply_chat_template), never template variables.
_CALL_ARGUMENTS = ("tools", "chat_template", "tokenize", "return_dict")


def order_tool_results(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results after an assistant turn, in the order of its calls, tagged `tool`/`index`."""
    ordered: list[dict[str, Any]] = []
    position = 0
    while position < len(conversation):
        message = conversation[position]
        ordered.append(dict(message))
        position += 1
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        targets: dict[str, tuple[int, str]] = {}
        for call_position, call in enumerate(calls):
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                continue
            aliases = [f"{name}:{call_position}"]
            if call.get("id"):
                aliases.insert(0, str(call["id"]))
            for alias in aliases:
                targets.setdefault(alias, (call_position, name))
        start = position
        while position < len(conversation) and conversation[position].get("role") == "tool":
            position += 1
        block = conversation[start:position]
        resolved: list[tuple[int, int, dict[str, Any]]] = []
        for order, result in enumerate(block):
            call_id = result.get("tool_call_id")
            target = targets.get(str(call_id)) if call_id is not None else None
            if target is None:  # one unmatched result: the block keeps its order
                ordered.extend(dict(item) for item in block)
                break
            resolved.append((target[0], order, dict(result, tool=target[1], index=target[0] + 1)))
        else:
            ordered.extend(entry for _, _, entry in sorted(resolved, key=lambda item: (item[0], item[1])))
    return ordered


def encoder_kwargs(chat: ChatInput) -> dict[str, Any]:
    kwargs = dict(chat.kwargs)
    enable_thinking = kwargs.pop("enable_thinking", None)
    if enable_thinking is not None:
        kwargs.setdefault("thinking", enable_thinking)
    effort = kwargs.pop("reasoning_effort", None)
    if effort == "none":
        kwargs.setdefault("thinking", False)
    elif effort is not None:
        kwargs.setdefault("thinking_effort", effort)
    thinking_effort = kwargs.get("thinking_effort")
    if thinking_effort is not None and thinking_effort not in THINKING_EFFORTS:
        raise handler_error(
            f"Kimi K3 supports thinking_effort values: {', '.join(THINKING_EFFORTS)}",
            "thinking_effort",
            thinking_effort,
        )
    if chat.tool_choice not in (None, "auto"):
        kwargs["tool_choice"] = dump_tool_choice(chat.tool_choice)
    if chat.response_format is not None:
        kwargs["response_format"] = dump_response_format(chat.response_format)
    return kwargs


def _without_none(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v is not None}


def dump_tool_choice(choice: Any) -> Any:
    """`ChatCompletionNamedToolChoiceParam.model_dump(mode="json", exclude_none=True)`."""
    if not isinstance(choice, dict):
        return choice
    if "function" not in choice:  # a Responses tool choice (ToolChoiceFunction: name, type)
        return _without_none({"name": choice.get("name"), **choice})
    dumped: dict[str, Any] = {"function": _without_none(dict(choice.get("function") or {}))}
    dumped["type"] = choice.get("type", "function")
    dumped.update(_without_none({k: v for k, v in choice.items() if k not in ("function", "type")}))
    return dumped


def dump_response_format(response_format: Any) -> Any:
    """vLLM's response-format model dumped with `exclude_none`: declared fields first (the JSON
    schema under its field name `json_schema`), then extra fields."""
    if not isinstance(response_format, dict):
        return response_format
    dumped: dict[str, Any] = {"type": response_format.get("type")}
    schema = response_format.get("json_schema")
    if isinstance(schema, dict):
        inner = {
            "name": schema.get("name"),
            "description": schema.get("description"),
            "json_schema": schema.get("schema"),
            "strict": schema.get("strict"),
        }
        inner.update({k: v for k, v in schema.items() if k not in ("name", "description", "schema", "strict")})
        dumped["json_schema"] = _without_none(inner)
    dumped.update({k: v for k, v in response_format.items() if k not in ("type", "json_schema")})
    return _without_none(dumped)


class KimiK3Renderer(NoFillInTheMiddle):
    mode: str = "kimi_k3"
    content_format: str | None = "string"
    needs_chat_template: bool = True

    def __init__(self, hf_tokenizer: Any, encode: Callable[[str, bool], list[int]]) -> None:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        self._hf_tokenizer = hf_tokenizer
        self._encode = encode
        # A real K3 tokenizer (remote code) overrides apply_chat_template with its encoder.
        self._own_encoder = type(hf_tokenizer).apply_chat_template is not PreTrainedTokenizerBase.apply_chat_template
        self.needs_chat_template = not self._own_encoder

    def render(self, chat: ChatInput) -> RenderedPrompt:
        conversation = order_tool_results(chat.conversation)
        kwargs = {k: v for k, v in encoder_kwargs(chat).items() if k not in _CALL_ARGUMENTS}
        if self._own_encoder:
            ids = self._hf_tokenizer.apply_chat_template(
                conversation,
                tools=chat.tools,
                chat_template=chat.chat_template,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
            return RenderedPrompt(token_ids=list(ids))
        assert chat.chat_template is not None
        prompt = templating.render_template(self._hf_tokenizer, chat.chat_template, conversation, chat.tools, kwargs)
        # Eagerly tokenized, as vLLM does (`tokenize=True`): no special tokens added.
        return RenderedPrompt(token_ids=self._encode(prompt, False))
