"""The Starlette app: `create_app` wires the routes, the lifespan and the middleware to a `State`.

Where things are: `routes` (the API table), `handlers/` (one module per concern), `state`
(what handlers read), `middleware` (API key; admission, body and error mapping per JSON route),
`body` (request decoding), `responses` (orjson responses, vLLM's error shape), `lifespan`
(start-up, shutdown, the event-loop watcher).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from render_service.model.loader import Model
from render_service.model.lora import AdapterRegistry
from render_service.server.lifespan import lifespan
from render_service.server.middleware import AuthMiddleware, JSONEndpoint
from render_service.server.responses import method_not_allowed, not_found
from render_service.server.routes import app_routes
from render_service.server.state import State
from render_service.settings import Settings

__all__ = ["RenderApp", "State", "create_app"]


class RenderApp(Starlette):
    """Starlette, with the JSON POST routes (`json_endpoint`s: every render, derender and
    tokenizer request) dispatched by exact path to their ASGI app, past Starlette's exception
    middleware and router, which they do not use: each answers every error itself, in vLLM's
    shape. Any other request (other methods, paths, a `root_path`) takes Starlette's way."""

    def __init__(self, routes: list[Route], api_key: str | None = None, **options: Any) -> None:
        super().__init__(routes=routes, **options)
        self.json_routes: dict[str, ASGIApp] = {}
        for route in routes:
            if isinstance(route.endpoint, JSONEndpoint) and route.methods == {"POST"}:
                endpoint: ASGIApp = route.endpoint
                self.json_routes[route.path] = AuthMiddleware(endpoint, api_key) if api_key else endpoint
        if api_key:
            self.add_middleware(AuthMiddleware, api_key=api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint = self.json_routes.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, model: Model | None = None, adapters: AdapterRegistry | None = None) -> RenderApp:
    """The app for one worker; `model` (loaded once in the parent) is shared copy-on-write, and so is
    `adapters` (the LoRA adapter set every worker of the replica reads)."""
    app = RenderApp(
        app_routes(settings),
        settings.api_key,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
    app.state.render = State(settings, model, adapters)
    return app
