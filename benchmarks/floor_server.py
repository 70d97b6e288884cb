#!/usr/bin/env python3
"""The floor *server*: the least a chat-render server can do, for render_bench.py to compare with.

A bare Starlette app on uvicorn with the same settings as render-service's worker (uvloop,
httptools, one process, access log off): `POST /v1/chat/completions/render` decodes the body
with orjson, renders the model's chat template (compiled once with jinja2 in HF's environment,
or with `--engine minijinja` render-service's own minijinja construction, `FastTemplate`) with
the request's `messages`, `tools` and `add_generation_prompt`, encodes the text with the
same fastokens construction render-service chooses (`render_service.model.backends.choose_backend`,
segment cache included), and answers a GenerateRequest-shaped orjson body. No validation, no
parity work beyond what the template needs (tool-call arguments parsed to objects, as vLLM does),
no metrics, no error handling: a malformed request is a 500 here.

    python3 -m benchmarks.floor_server MODEL_DIR --port 8003
"""

from __future__ import annotations

import argparse
import json
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2.ext
import jinja2.sandbox
import orjson
import tokenizers
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render_service.model.backends import choose_backend
from render_service.render.templating import FastTemplate

# What render-service echoes for a plain request; only the per-request fields change.
SAMPLING = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "stop": [],
    "stop_token_ids": [],
    "max_tokens": 0,
    "skip_special_tokens": False,
    "output_kind": 2,
    "skip_clone": True,
    "bad_words": [],
    "skip_reading_prefix_cache": False,
}


def compile_template(source: str) -> jinja2.Template:
    """HF's `apply_chat_template` environment: sandboxed, trim/lstrip blocks, loopcontrols, its tojson."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def create_app(model_dir: str, model_name: str, max_model_len: int, engine: str = "jinja2") -> Starlette:
    folder = Path(model_dir)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if config.get(k)}
    if engine == "minijinja":
        fast = FastTemplate(config["chat_template"], specials)

        def render(messages: Any, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
            return fast.render(messages, tools, {**kwargs, "add_generation_prompt": add_generation_prompt})
    else:
        template = compile_template(config["chat_template"])

        def render(messages: Any, tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
            return template.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **specials, **kwargs
            )

    tokenizer_json = (folder / "tokenizer.json").read_text()
    backend = choose_backend(tokenizers.Tokenizer.from_str(tokenizer_json), tokenizer_json)

    async def chat_render(request: Request) -> Response:
        body = orjson.loads(await request.body())
        messages = body["messages"]
        for message in messages:
            if message.get("tool_calls"):
                for call in message["tool_calls"]:
                    function = call["function"]
                    if isinstance(function.get("arguments"), str):
                        function["arguments"] = orjson.loads(function["arguments"])
        tools = body.get("tools")
        add_generation_prompt = body.get("add_generation_prompt", True)
        text = render(messages, tools, add_generation_prompt, body.get("chat_template_kwargs") or {})
        ids = backend.encode(text, add_special_tokens=False)
        kwargs = {"add_generation_prompt": add_generation_prompt, "continue_final_message": False}
        out = {
            "request_id": f"chatcmpl-{secrets.token_hex(8)}",
            "token_ids": ids,
            "token_offsets": None,
            "features": None,
            "content_parts": None,
            "sampling_params": {**SAMPLING, "max_tokens": max_model_len - len(ids)},
            "model": model_name,
            "reasoning_ended": False,
            "reasoning_parser_kwargs": {"chat_template_kwargs": kwargs},
            "return_token_ids": None,
            "output_mode": "tokens",
            "parse_context": {
                "tools": tools,
                "tool_choice": "auto" if tools else "none",
                "parallel_tool_calls": True,
                "include_reasoning": True,
                "chat_template_kwargs": kwargs,
                "history_tool_call_cnt": 0,
            },
            "stream": False,
            "stream_options": None,
            "cache_salt": None,
            "priority": 0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
        }
        return Response(orjson.dumps(out), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions/render", chat_render, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.state.backend = f"template {engine}, tokenizer {backend.name}"
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model folder with tokenizer.json and tokenizer_config.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8003)
    parser.add_argument("--served-model-name", default="tinyqwen3")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument(
        "--engine", choices=("jinja2", "minijinja"), default="jinja2", help="template engine (default: %(default)s)"
    )
    args = parser.parse_args()
    app = create_app(args.model, args.served_model_name, args.max_model_len, args.engine)
    print(f"floor server: {app.state.backend}", flush=True)
    # The same loop, parser and logging settings as render-service's worker.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )


if __name__ == "__main__":
    main()
