"""Prefill/decode disaggregation: the two hops vLLM's P/D proxy and llm-d's sidecar make.

1. Prefill: the rendered `GenerateRequest` goes to a prefill engine as a non-streaming request for
   one token (`max_tokens` 1, `n` 1, no `min_tokens`), with `kv_transfer_params`
   `{"do_remote_decode": true, ...}`: the engine computes the prompt's KV cache and keeps it for a
   decode engine to pull, answering with the `kv_transfer_params` that locate it.
2. Decode: the original request (the same prompt token ids and request id) goes to a decode
   engine with those `kv_transfer_params` (`do_remote_prefill`), streaming or not as the client
   asked; the decode engine pulls the KV blocks instead of recomputing the prompt.

Connectors that find the KV by the prompt's tokens instead (vLLM's ExampleConnector on a shared
folder, LMCache) answer the prefill without `kv_transfer_params`: with `--prefill-kv-by-prompt`
such a prefill has handed off, and the decode request goes with the prompt alone (the decode
engine's connector loads the stored KV for the prompt's full blocks and computes the rest).

A prefill that no engine could serve (connection failures, timeouts, 5xx, or an answer without
`kv_transfer_params`, i.e. an engine without a KV connector) fails the request with 503, or, with
`--prefill-fallback-recompute`, sends it to a decode engine alone, which recomputes the prompt. A
prefill engine's 4xx is the client's answer either way (the request itself is wrong). A request
that already carries `kv_transfer_params` (a router upstream doing P/D itself) goes straight to
the decode pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from render_service.exceptions import OverloadedError, RenderServiceError
from render_service.gateway import client
from render_service.gateway.metrics import GatewayMetrics
from render_service.gateway.pool import EnginePool

logger = logging.getLogger("render_service.gateway")

# What the prefill hop asks for: vLLM's proxy sends exactly these keys.
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop's `GenerateRequest`: one token, no stream, `do_remote_decode`."""
    sampling = dict(body.get("sampling_params") or {})
    sampling["max_tokens"] = 1
    sampling["n"] = 1
    sampling.pop("min_tokens", None)  # more than max_tokens is refused; the one token is discarded anyway
    return {
        **body,
        "sampling_params": sampling,
        "stream": False,
        "stream_options": None,
        "kv_transfer_params": dict(REMOTE_DECODE),
    }


class Disaggregated:
    """The two pools and the hand-off between them."""

    def __init__(
        self,
        prefill: EnginePool,
        decode: EnginePool,
        metrics: GatewayMetrics,
        *,
        fallback_recompute: bool,
        kv_by_prompt: bool = False,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.metrics = metrics
        self.fallback_recompute = fallback_recompute
        self.kv_by_prompt = kv_by_prompt

    async def decode_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` as the decode pool gets it: with the prefill's `kv_transfer_params`, or without
        them (recompute) when the prefill failed and the operator allows that."""
        if body.get("kv_transfer_params"):
            self.metrics.pd_requests.labels("passthrough").inc()
            return body
        try:
            answer = await client.generate(self.prefill, prefill_request(body))
        except RenderServiceError as exc:
            if exc.status_code < 500:
                self.metrics.pd_requests.labels("prefill_rejected").inc()
                raise
            return self._without_prefill(body, exc)
        params = answer.get("kv_transfer_params")
        if not params and self.kv_by_prompt:
            self.metrics.pd_requests.labels("prompt_keyed").inc()
            return body
        if not params:
            failure = OverloadedError(
                "The prefill engine returned no kv_transfer_params (is it running with a --kv-transfer-config?)",
                retry_after=1,
            )
            return self._without_prefill(body, failure)
        self.metrics.pd_requests.labels("remote_prefill").inc()
        return {**body, "kv_transfer_params": params}

    def _without_prefill(self, body: dict[str, Any], failure: RenderServiceError) -> dict[str, Any]:
        if not self.fallback_recompute:
            self.metrics.pd_requests.labels("prefill_failed").inc()
            raise failure
        logger.warning("prefill failed (%s); decoding with recompute", failure.message)
        self.metrics.pd_requests.labels("recompute").inc()
        return body

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        return await client.generate(self.decode, await self.decode_request(body))

    async def open_stream(
        self, body: dict[str, Any], while_waiting: Callable[[], None] | None = None
    ) -> client.EngineStream:
        return await client.open_stream(self.decode, await self.decode_request(body), while_waiting)
