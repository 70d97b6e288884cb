"""The Starlette app: `create_app` wires the routes, the lifespan and the middleware to a `State`.

Where things are: `routes` (the API table), `handlers/` (one module per concern), `state`
(what handlers read), `middleware` (API key; admission, body and error mapping per JSON route),
`body` (request decoding), `responses` (orjson responses, vLLM's error shape), `lifespan`
(start-up, shutdown, the event-loop watcher).
"""

from __future__ import annotations

from starlette.applications import Starlette

from render_service.model.loader import Model
from render_service.server.lifespan import lifespan
from render_service.server.middleware import AuthMiddleware
from render_service.server.responses import method_not_allowed, not_found
from render_service.server.routes import ROUTES
from render_service.server.state import State
from render_service.settings import Settings

__all__ = ["State", "create_app"]


def create_app(settings: Settings, model: Model | None = None) -> Starlette:
    """The app for one worker; `model` (loaded once in the parent) is shared copy-on-write."""
    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.render = State(settings, model)
    if settings.api_key:
        app.add_middleware(AuthMiddleware, api_key=settings.api_key)
    return app
