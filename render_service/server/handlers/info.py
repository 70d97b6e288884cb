"""The service's own endpoints: health, version, models, metrics, load and the render config.

Never refused for load, never counted in flight (they are not `json_endpoint`s).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from render_service import VLLM_VERSION, __version__
from render_service.audit.fingerprint import components_header
from render_service.render import pipeline as render
from render_service.server.responses import JSONResponse
from render_service.server.state import State


async def health(request: Request) -> Response:
    """/health and /ping: 200 once loaded (and while the audit, when it gates readiness, agrees)."""
    return Response(status_code=200 if State.of(request).healthy else 503)


async def version(request: Request) -> Response:
    return JSONResponse({"version": VLLM_VERSION}, headers={"X-Render-Service-Version": __version__})


async def kv_event_sources(request: Request) -> Response:
    """vLLM's KV-event publisher config per data-parallel rank: always empty on a render tier (no engine)."""
    return JSONResponse({})


async def models(request: Request) -> Response:
    """vLLM's /v1/models: one card per served name."""
    state = State.of(request)
    max_model_len = state.model.max_model_len if state.model else None
    cards = [
        {
            "id": name,
            "object": "model",
            "created": state.started,
            "owned_by": "vllm",
            "root": state.settings.model,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{render.random_uuid()}",
                    "object": "model_permission",
                    "created": state.started,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for name in state.settings.served_names
    ]
    return JSONResponse({"object": "list", "data": cards})


async def metrics(request: Request) -> Response:
    """Prometheus text format: this worker's registry."""
    return Response(State.of(request).metrics.export(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def load(request: Request) -> Response:
    """vLLM's /load (its in-flight count): render does no engine work, so always 0."""
    return JSONResponse({"server_load": 0})


async def render_config(request: Request) -> Response:
    """The render fingerprint and its components: what a caller compares across replicas."""
    fingerprint = State.of(request).fingerprint
    return JSONResponse(
        {**fingerprint, "vllm_parity_version": VLLM_VERSION, "service_version": __version__},
        headers={
            "X-Render-Fingerprint": fingerprint["fingerprint"],
            "X-Render-Fingerprint-Components": components_header(fingerprint),
        },
    )
