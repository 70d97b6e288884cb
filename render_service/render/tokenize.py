"""`/tokenize` and `/detokenize`, as vLLM's `ServingTokenization` answers them."""

from __future__ import annotations

from typing import Any

from render_service.api.protocol import int_list, opt_bool, schema_error
from render_service.exceptions import BadRequestError
from render_service.render import content_parts, renderers, templating
from render_service.render import pipeline as render


def tokenize(ctx: render.RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    render.check_model(ctx, body.get("model"))
    model = ctx.model
    if "messages" in body:
        # vLLM's /tokenize renders messages directly: the chat-request validators do not run.
        render._validate_messages(body)
        if body.get("tools") not in (None, []):  # TokenizeChatRequest's tool schema (no chat validators)
            render._validate_tools(body)
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
        add_special = bool(opt_bool(body, "add_special_tokens", False))
        if renderer.mode == "hf":
            assert template is not None
            text = templating.render_prompt(model.hf_tokenizer, template, conversation, tools, kwargs)
            ids = model.encode(text, add_special)
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
            ids = (
                rendered.token_ids if rendered.token_ids is not None else model.encode(rendered.text or "", add_special)
            )
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise schema_error(
                "body.prompt", "Field required" if prompt is None else "Input should be a valid string", prompt
            )
        ids = model.encode(prompt, bool(opt_bool(body, "add_special_tokens", True)))
    token_strs = model.hf_tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": model.max_model_len, "tokens": ids, "token_strs": token_strs}


def detokenize(ctx: render.RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    render.check_model(ctx, body.get("model"))
    if "tokens" not in body:
        raise schema_error("body.tokens", "Field required", body)
    ids = int_list(body["tokens"], "body.tokens", non_negative=True)
    # vLLM drops ids the tokenizer does not know instead of failing.
    known = len(ctx.model.hf_tokenizer)
    return {"prompt": ctx.model.hf_tokenizer.decode([i for i in ids if i < known])}
