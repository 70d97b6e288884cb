"""`/tokenize` and `/detokenize`, as vLLM's `ServingTokenization` answers them."""

from __future__ import annotations

from typing import Any

from render_service.api import requests
from render_service.exceptions import BadRequestError
from render_service.render import content_parts, renderers, templating
from render_service.render import pipeline as render


def tokenize(ctx: render.RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    model = ctx.model
    # FastAPI's body union: TokenizeCompletionRequest | TokenizeChatRequest (no chat validators)
    matched = requests.validate_tokenize_request(body)
    render.check_model(ctx, body.get("model"))
    if matched is requests.TOKENIZE_CHAT_REQUEST:
        user_kwargs = body.get("chat_template_kwargs") or {}
        if not ctx.settings.trust_request_chat_template and (
            body.get("chat_template") is not None or user_kwargs.get("chat_template") is not None
        ):
            raise BadRequestError(
                "Chat template is passed with request, but --trust-request-chat-template "
                "is not set. Refused request with untrusted chat template."
            )
        template = body.get("chat_template") or model.chat_template
        renderer: renderers.Renderer = model.renderer
        if template is None and renderer.needs_chat_template:
            raise BadRequestError("The model has no chat template.")
        fmt = renderer.content_format or ctx.settings.chat_template_content_format
        if fmt == "auto":
            assert template is not None
            fmt = templating.detect_content_format(template)
        content_parts.check_messages(body["messages"])
        conversation = templating.build_conversation(body["messages"], fmt, model_name=ctx.settings.served_names[0])
        kwargs = dict(user_kwargs)
        kwargs.update(
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
        )
        kwargs = render._merge_kwargs(ctx.settings.default_template_kwargs, kwargs)
        tools = render.tool_dicts(body.get("tools"))
        add_special = body.get("add_special_tokens", False)  # coerced by the schema
        if renderer.mode == "hf":
            assert template is not None
            text = templating.render_prompt(model.hf_tokenizer, template, conversation, tools, kwargs)
            ids = ctx.encode(text, add_special)
        else:  # the model's own encoder (DeepSeek, Kimi K3), as vLLM's /tokenize uses it
            rendered = renderer.render(
                renderers.ChatInput(
                    messages=body["messages"],
                    conversation=conversation,
                    tools=tools,
                    kwargs=kwargs,
                    chat_template=template,
                    tool_choice=body.get("tool_choice") if body.get("tools") else None,
                )
            )
            ids = rendered.token_ids if rendered.token_ids is not None else ctx.encode(rendered.text or "", add_special)
    else:
        ids = model.encode(body["prompt"], body.get("add_special_tokens", True))
    token_strs = model.hf_tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids, "token_strs": token_strs}


def detokenize(ctx: render.RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    requests.validate_detokenize_request(body)
    render.check_model(ctx, body.get("model"))
    ids = body["tokens"]
    # vLLM drops ids the tokenizer does not know instead of failing.
    known = len(ctx.model.hf_tokenizer)
    return {"prompt": ctx.model.hf_tokenizer.decode([i for i in ids if i < known])}
