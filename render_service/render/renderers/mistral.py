"""The `mistral` renderer: Mistral-format models rendered through mistral-common, as vLLM 0.33 does.

vLLM renders a `--tokenizer-mode mistral` model without a Jinja template
(`vllm/renderers/mistral.py`, `vllm/tokenizers/mistral.py`):

1. before anything else (`OnlineRenderer.render_chat`): tool-call ids longer than 9 characters
   are cut to their last 9 (assistant `tool_calls[].id`, tool `tool_call_id`), and a request
   with `chat_template` or `chat_template_kwargs`, or a `reasoning_effort` mistral-common does
   not know, is a 400 naming the parameter;
2. `MistralTokenizer.apply_chat_template`: `add_generation_prompt` with a final assistant
   message, `continue_final_message` without one, or both flags, are errors;
3. transformers' `MistralCommonBackend.apply_chat_template`: content parts without a `type` are
   dropped, then mistral-common builds its `ChatCompletionRequest.from_openai(messages, tools,
   continue_final_message, reasoning_effort)` (v15+ only passes the effort), validates it in
   test mode and encodes it: the tokenizer version decides the prompt (`[SYSTEM_PROMPT]`,
   `[AVAILABLE_TOOLS]`, `[TOOL_CALLS]` with a JSON array before v11 or `name[ARGS]{...}`
   from v11, `[CALL_ID]` in v11 only, `[THINK]...[/THINK]` for reasoning history from v13).

Every exception mistral-common raises becomes a 400 with its message, as vLLM's
`safe_apply_chat_template` turns it into a `ValueError`. The prompt is token ids; there is no
prompt text.
"""

from __future__ import annotations

import logging
from typing import Any

from render_service.api.protocol import BadRequestError, handler_error
from render_service.model.mistral import MistralTokenizer
from render_service.model.mistral_encoder import MistralChatEncoder
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt, plain_messages

logger = logging.getLogger("render_service.render.renderers.mistral")

TOOL_CALL_ID_LENGTH = 9  # mistral-common's validator: ids are 9 alphanumeric characters


def truncate_tool_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's `truncate_tool_call_ids`: keep the last 9 characters of every tool-call id
    (a copy: the request's own messages stay as sent)."""
    out = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call_id = call.get("id") if isinstance(call, dict) else None
                if isinstance(call_id, str) and len(call_id) > TOOL_CALL_ID_LENGTH:
                    call = {**call, "id": call_id[-TOOL_CALL_ID_LENGTH:]}
                calls.append(call)
            message = {**message, "tool_calls": calls}
        elif role in ("tool", "tool_results") and isinstance(message.get("tool_call_id"), str):
            call_id = message["tool_call_id"]
            if len(call_id) > TOOL_CALL_ID_LENGTH:
                message = {**message, "tool_call_id": call_id[-TOOL_CALL_ID_LENGTH:]}
        out.append(message)
    return out


def _adapt_content(message: Any) -> Any:
    """`MistralCommonBackend`'s message adaptation for text: parts without a `type` are dropped."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if not content or isinstance(content, str) or not isinstance(content, list):
        return message
    parts = [part for part in content if not isinstance(part, dict) or part.get("type")]
    return {**message, "content": parts}


class MistralRenderer(NoFillInTheMiddle):
    mode = "mistral"
    content_format: str | None = "string"  # vLLM parses the conversation with "string"
    needs_chat_template = False

    def __init__(self, tokenizer: MistralTokenizer) -> None:
        from mistral_common.protocol.instruct.request import ReasoningEffort

        self.tokenizer = tokenizer
        # Our encoder for the common shapes (the library's ids, without its pydantic passes);
        # None or a shape it does not know: mistral-common renders (model/mistral_encoder.py).
        self.fast: MistralChatEncoder | None = MistralChatEncoder(tokenizer)
        self.reasoning_efforts = [effort.value for effort in ReasoningEffort]
        # For the config fingerprint: what the prompts depend on besides the request.
        self.fingerprint = {
            "mistral_common": tokenizer.library_version,
            "tokenizer_version": tokenizer.version,
            "tekken": tokenizer.is_tekken,
        }

    def conversation_unused(self, messages: list[Any]) -> bool:
        """This renderer reads the request messages, not vLLM's parsed conversation: the pipeline
        skips building it when parsing could neither fail nor collect media (`plain_messages`)."""
        return plain_messages(messages)

    def check_request(self, body: dict[str, Any]) -> None:
        """vLLM's Mistral-only request checks (`validate_request_params`), run before the
        generic chat checks; also cuts tool-call ids to 9 characters in `body["messages"]`."""
        messages = body.get("messages")
        if isinstance(messages, list):
            body["messages"] = truncate_tool_call_ids(messages)
        if body.get("chat_template") is not None or body.get("chat_template_kwargs") is not None:
            raise handler_error("chat_template is not supported for Mistral tokenizers.", "chat_template")
        effort = body.get("reasoning_effort")
        if effort and effort not in self.reasoning_efforts:
            raise handler_error(
                f"reasoning_effort={effort} is not supported by Mistral models. "
                f"Supported values are: {self.reasoning_efforts}.",
                "reasoning_effort",
            )

    def render(self, chat: ChatInput) -> RenderedPrompt:
        messages = chat.messages
        add_generation_prompt = bool(chat.kwargs.get("add_generation_prompt", False))
        continue_final = bool(chat.kwargs.get("continue_final_message", False))
        if add_generation_prompt and continue_final:
            raise BadRequestError("Cannot set both `add_generation_prompt` and `continue_final_message` to True.")
        last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
        if add_generation_prompt and last_role == "assistant":
            raise BadRequestError(
                "Cannot set `add_generation_prompt` to True when the last message is from the assistant. "
                "Consider using `continue_final_message` instead."
            )
        if continue_final and last_role != "assistant":
            raise BadRequestError(
                "Cannot set `continue_final_message` to True when the last message is not from the assistant."
            )
        effort = chat.kwargs.get("reasoning_effort") if self.tokenizer.version >= 15 else None
        return RenderedPrompt(token_ids=self.encode(messages, chat.tools, continue_final, effort))

    def encode(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, continue_final: bool, effort: Any
    ) -> list[int]:
        from mistral_common.exceptions import MistralCommonException

        if self.fast is not None and effort is None:
            ids = self.fast.encode(messages, tools, continue_final)
            if ids is not None:
                return ids
        try:
            request = self.tokenizer.chat_request([_adapt_content(m) for m in messages], tools, continue_final, effort)
            return self.tokenizer.encode_chat(request)
        except (AssertionError, MistralCommonException) as exc:
            raise BadRequestError(str(exc)) from exc
        except Exception as exc:  # vLLM logs these and answers 400 with the message as well
            logger.debug("mistral-common failed to render the request", exc_info=True)
            raise BadRequestError(str(exc)) from exc
