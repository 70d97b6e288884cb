"""The API at a glance: vLLM 0.33's render tier (`vllm launch render`) plus /v1/render/config.

Every POST route but /ping takes a JSON body (`json_endpoint`: admission, limits, error shape);
the GET routes are the service's own and are never refused for load.
"""

from __future__ import annotations

from starlette.routing import Route

from render_service.api import openapi
from render_service.server.handlers import derender, info, lora, render, tokenize
from render_service.settings import Settings

ROUTES: list[Route] = [
    # Render: a request in, token ids and a vLLM GenerateRequest out.
    Route("/v1/chat/completions/render", render.chat_render, methods=["POST"]),
    Route("/v1/completions/render", render.completion_render, methods=["POST"]),
    Route("/v1/messages/render", render.messages_render, methods=["POST"]),
    Route("/v1/responses/render", render.responses_render, methods=["POST"]),
    # Derender: engine token ids in, an OpenAI response (or stream chunk) out.
    Route("/v1/chat/completions/derender", derender.chat_derender, methods=["POST"]),
    Route("/v1/completions/derender", derender.completion_derender, methods=["POST"]),
    # Tokenizer.
    Route("/tokenize", tokenize.tokenize, methods=["POST"]),
    Route("/detokenize", tokenize.detokenize, methods=["POST"]),
    # Operations.
    Route("/health", info.health, methods=["GET"]),
    Route("/ping", info.health, methods=["GET", "POST"]),
    Route("/version", info.version, methods=["GET"]),
    Route("/v1/models", info.models, methods=["GET"]),
    Route("/metrics", info.metrics, methods=["GET"]),
    Route("/load", info.load, methods=["GET"]),
    Route("/kv_event_sources", info.kv_event_sources, methods=["GET"]),
    Route("/v1/render/config", info.render_config, methods=["GET"]),
    Route("/openapi.json", openapi.openapi_endpoint, methods=["GET"]),
]

# vLLM mounts these only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set (otherwise they are 404s).
RUNTIME_LORA_ROUTES: list[Route] = [
    Route("/v1/load_lora_adapter", lora.load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", lora.unload_lora_adapter, methods=["POST"]),
]


def gateway_routes() -> list[Route]:
    """Gateway mode (`--engine`): vLLM's generation endpoints, served through the engine pool."""
    from render_service.gateway import handlers  # imported only when engines are configured

    return handlers.routes()


def app_routes(settings: Settings) -> list[Route]:
    """The routes one app serves under `settings`."""
    routes = ROUTES + (RUNTIME_LORA_ROUTES if settings.allow_runtime_lora_updating else [])
    return routes + (gateway_routes() if settings.gateway_mode else [])
