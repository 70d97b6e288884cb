"""`/tokenize` and `/detokenize`, as vLLM's `ServingTokenization` answers them."""

from __future__ import annotations

from typing import Any

from render_service.api import requests
from render_service.exceptions import BadRequestError
from render_service.render import pipeline as render
from render_service.render import templating


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
        if template is None:
            raise BadRequestError("The model has no chat template.")
        fmt = ctx.settings.chat_template_content_format
        if fmt == "auto":
            fmt = templating.detect_content_format(template)
        conversation = templating.build_conversation(body["messages"], fmt, model_name=ctx.settings.served_names[0])
        kwargs = dict(user_kwargs)
        kwargs.update(
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
        )
        kwargs = render._merge_kwargs(ctx.settings.default_template_kwargs, kwargs)
        text = templating.render_prompt(
            model.hf_tokenizer, template, conversation, render.tool_dicts(body.get("tools")), kwargs
        )
        ids = model.encode(text, body.get("add_special_tokens", False))
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
