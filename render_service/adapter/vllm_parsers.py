"""vLLM's own parser classes, driven the way vLLM 0.33's render tier drives them on derender.

This module imports vLLM (and so torch): it is imported only when a configured parser has no
native implementation (`render_service.adapter.runtime`). The parser class is the one vLLM's
`ParserManager.get_parser` composes for the same flags (a `DelegatingParser`, or the family's
own `Parser` such as Kimi K3's or Cohere's), so the composition is vLLM's too; batch and
streaming call the same functions as `OnlineDerenderer` (`parse` + `assemble_chat_message_fields`
+ `resolve_finish_reason`; `ChatStreamProcessor.step` once per engine chunk). Detokenization,
stop-token handling, logprobs and the response envelope stay the service's own (they are
native and proven identical to vLLM's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # a render tier never needs an accelerator

from vllm.entrypoints.openai.chat_completion.message_assembly import (
    assemble_chat_message_fields,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
from vllm.entrypoints.serve.utils.tool_calls_utils import resolve_finish_reason
from vllm.parser import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

from render_service.exceptions import BadRequestError


def load_plugins(tool_parser_plugin: str | None, reasoning_parser_plugin: str | None) -> None:
    """`--tool-parser-plugin` / `--reasoning-parser-plugin` files, as vLLM's `init_parser_plugin`
    imports them (its `len(...) > 3` check included: shorter values are ignored)."""
    if tool_parser_plugin and len(tool_parser_plugin) > 3:
        ToolParserManager.import_tool_parser(tool_parser_plugin)
    if reasoning_parser_plugin and len(reasoning_parser_plugin) > 3:
        ReasoningParserManager.import_reasoning_parser(reasoning_parser_plugin)


def registered_names() -> tuple[frozenset[str], frozenset[str]]:
    """(reasoning, tool) parser names vLLM's registries know, plugins loaded so far included."""
    return frozenset(ReasoningParserManager.list_registered()), frozenset(ToolParserManager.list_registered())


@dataclass(frozen=True)
class ModelFacts:
    """What vLLM's parsers read from `model_config` (`get_tool_call_id_type`: the model types and
    `hf_overrides`; Cohere's parser: `architecture`). Building vLLM's whole `ModelConfig` would
    resolve a device platform and engine defaults a render tier has no use for."""

    hf_config: Any
    hf_text_config: Any
    architecture: str | None
    hf_overrides: dict[str, Any] | None = None

    @classmethod
    def load(cls, model_path: Path, trust_remote_code: bool, revision: str | None) -> ModelFacts:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code, revision=revision)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        architectures = getattr(config, "architectures", None) or [None]
        return cls(config, text, architectures[0])


@dataclass(frozen=True)
class RenderEffects:
    """The parser's effects on a rendered chat request (see `AdapterParsers.render_effects`):
    `structured_outputs` holds `StructuredOutputsParams` fields when the parser set a constraint."""

    skip_special_tokens: bool | None
    spaces_between_special_tokens: bool | None  # None: left as the request has it
    structured_outputs: dict[str, Any] | None
    structured_outputs_changed: bool
    reasoning_ended: bool | None
    reasoning_parser_kwargs: dict[str, Any] | None


class AdapterParsers:
    """One server configuration's vLLM parser class, tokenizer and model facts."""

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path,
        *,
        reasoning_parser: str | None,
        tool_call_parser: str | None,
        enable_auto_tools: bool,
        trust_remote_code: bool = False,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
    ) -> None:
        self.tokenizer = get_tokenizer(
            str(tokenizer_path), trust_remote_code=trust_remote_code, revision=tokenizer_revision or revision
        )
        self.model_config = ModelFacts.load(model_path, trust_remote_code, revision)
        self.enable_auto_tools = enable_auto_tools
        model_type = getattr(self.model_config.hf_config, "model_type", None)
        # `ParserManager.get_parser` also checks the tokenizer (vLLM fails at start the same way).
        parser_cls = ParserManager.get_parser(
            tool_parser_name=tool_call_parser,
            reasoning_parser_name=reasoning_parser,
            enable_auto_tools=enable_auto_tools,
            model_name=str(model_path),
            is_harmony=model_type == "gpt_oss",
            tokenizer=self.tokenizer,
        )
        if parser_cls is None:
            raise ValueError("no parser is configured")
        self.parser_cls = parser_cls
        self.uses_harmony = model_type == "gpt_oss"

    # -- requests -------------------------------------------------------------------------------------

    def request(self, chat_request: Mapping[str, Any]) -> Any:
        """vLLM's `ChatCompletionRequest` for a request the service already validated."""
        return ChatCompletionRequest.model_validate(dict(chat_request))

    def new_parser(self, request: Any, template_kwargs: Mapping[str, Any]) -> Any:
        kwargs = {} if self.uses_harmony else dict(template_kwargs)
        return self.parser_cls(
            self.tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=self.model_config
        )

    # -- render ---------------------------------------------------------------------------------------

    def render_effects(
        self, body: Mapping[str, Any], template_kwargs: Mapping[str, Any], prompt_token_ids: list[int]
    ) -> RenderEffects:
        """What the parser changes in a rendered chat request, as vLLM's render tier applies it:
        `adjust_request` (when vLLM runs it: a reasoning parser, `always_adjust_request`, or a
        tool_choice other than none), then `extract_structured_outputs` and
        `resolve_reasoning_ended` on the adjusted request."""
        request = self.request(body)
        before_skip, before_so = request.skip_special_tokens, request.structured_outputs
        before_spaces = request.spaces_between_special_tokens
        parser_cls = self.parser_cls
        if (
            parser_cls.always_adjust_request
            or parser_cls.reasoning_parser_cls is not None
            or getattr(request, "tool_choice", "none") != "none"
        ):
            parser = self.new_parser(request, template_kwargs)
            parser.set_prompt_token_ids(prompt_token_ids)
            try:
                request = parser.adjust_request(request=request)
            except ValueError as exc:  # e.g. Cohere's structural tags for tools: vLLM answers a 400
                raise BadRequestError(str(exc)) from None
        constraint = None
        if request.structured_outputs is not before_so:
            params = request.extract_structured_outputs()
            if params is not None:
                constraint = {f.name: getattr(params, f.name) for f in fields(params) if not f.name.startswith("_")}
        # vLLM hands the reasoning parser the very dict it sends as `reasoning_parser_kwargs`, and
        # some parsers add their defaults to it (e.g. `thinking`): keep that dict.
        reasoning_kwargs = dict(template_kwargs)
        reasoning_parser = None
        if parser_cls.reasoning_parser_cls is not None:
            reasoning_parser = parser_cls(
                self.tokenizer, request.tools, chat_template_kwargs=reasoning_kwargs, model_config=self.model_config
            )
        return RenderEffects(
            skip_special_tokens=request.skip_special_tokens
            if request.skip_special_tokens != before_skip
            else body.get("skip_special_tokens"),
            spaces_between_special_tokens=request.spaces_between_special_tokens
            if request.spaces_between_special_tokens != before_spaces
            else None,
            structured_outputs=constraint,
            structured_outputs_changed=request.structured_outputs is not before_so,
            reasoning_ended=request.resolve_reasoning_ended(reasoning_parser, prompt_token_ids),
            reasoning_parser_kwargs=None if reasoning_parser is None else {"chat_template_kwargs": reasoning_kwargs},
        )

    # -- batch ----------------------------------------------------------------------------------------

    def parse_choice(
        self,
        request: Any,
        template_kwargs: Mapping[str, Any],
        text: str,
        token_ids: Sequence[int],
        prompt_token_ids: Sequence[int] | None,
        finish_reason: str | None,
    ) -> tuple[dict[str, Any], str | None]:
        """`OnlineDerenderer._parse_and_assemble` + `resolve_finish_reason`: the message's
        (content, reasoning, tool_calls) as wire fields and the chat finish reason."""
        parser = self.new_parser(request, template_kwargs)
        if prompt_token_ids is not None:
            parser.set_prompt_token_ids(list(prompt_token_ids))
        reasoning, content, tool_calls = parser.parse(
            text, request, enable_auto_tools=self.enable_auto_tools, model_output_token_ids=list(token_ids)
        )
        fields = assemble_chat_message_fields(
            request,
            reasoning,
            content,
            tool_calls,
            enable_auto_tools=self.enable_auto_tools,
            parser_cls=self.parser_cls,
        )
        calls = [call.model_dump(mode="json") for call in fields.tool_calls]
        message = {"content": fields.content, "reasoning": fields.reasoning, "tool_calls": calls}
        return message, resolve_finish_reason(finish_reason, request, bool(calls))

    # -- streaming ------------------------------------------------------------------------------------

    def new_stream(self, request: Any, template_kwargs: Mapping[str, Any]) -> ChatStreamProcessor:
        """A `ChatStreamProcessor` over a fresh parser: one per stream, as vLLM builds one per call."""
        return ChatStreamProcessor(
            request,
            self.new_parser(request, template_kwargs),
            enable_auto_tools=self.enable_auto_tools,
            parser_cls=self.parser_cls,
        )


def step(
    processor: ChatStreamProcessor,
    text: str,
    token_ids: list[int],
    finish_reason: str | None,
    prompt_token_ids: list[int] | None,
) -> tuple[Any, str | None]:
    """`ChatStreamProcessor.step`: (vLLM's DeltaMessage or None, chat finish reason)."""
    delta, finish = processor.step(text, token_ids, finish_reason, prompt_token_ids)
    return delta, finish


def empty_delta() -> Any:
    from vllm.entrypoints.generate.base.protocol import DeltaMessage

    return DeltaMessage()
