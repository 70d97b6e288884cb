"""Generated token ids kept for token-identical continuation (render/continuation.py).

Derender (batch, and the final chunk of a stream) of a request that asked for it returns, with
each assistant message, a handle: `rsg1.<key id>.<base64url>`, the snapshot codec's HMAC-SHA256
over msgpack (the same `--snapshot-key`, so every replica of a deployment can check it) binding

- the configuration fingerprint (ids mean nothing to another tokenizer or template),
- the length and digest of the prompt the engine saw,
- the digest of the generated ids and of the message (content, reasoning, tool calls' names and
  arguments) as the client will send it back.

The ids themselves go to the store under a key made from the prompt and ids digests: in-process,
and in Redis when one is configured, so the next turn renders the same on any replica. Why both
a handle and a store: the handle is what makes the lookup safe. A store keyed by message content
alone would let one conversation's ids (or ids planted through derender by anyone) be spliced
into another conversation that happens to send the same reply text ("OK."); the handle ties the
ids to the exact prompt they followed and to the message, is checked before any lookup, and lets
a request fetch all its turns in one round of lookups. The ids stay out of the handle: a long
reasoning turn is thousands of ids, which every later request would carry again.

A handle that fails its MAC under our key is refused (400): it was altered. One made under
another key (its key id differs: another deployment, or a replica started without a shared
`--snapshot-key`) is not an error, only not used.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from render_service.derender import pipeline as derender
from render_service.derender.snapshots import LocalStore, RedisStore, SnapshotCodec, SnapshotRejected
from render_service.exceptions import BadRequestError
from render_service.render import continuation
from render_service.render.continuation import Generated, Lookup
from render_service.server.metrics import Metrics

logger = logging.getLogger("render_service.derender.generated")

PREFIX = "rsg1"
MAX_HANDLE_CHARS = 1024
_KEY_ID_LABEL = b"render-service generated-token handles"
# Without --snapshot-key: made at import, in the parent before the workers fork, so that a
# replica's workers accept each other's handles (each keeps its own ids, though: use Redis).
_REPLICA_KEY = secrets.token_bytes(32)

# Why derender issued no handle (metric label).
NO_PROMPT_IDS = "no_prompt_ids"  # the full prompt ids were not sent (generate_response's, or the body's)
NO_STREAM_IDS = "no_stream_ids"  # the stream state carries no output ids (compact mode, or no parser)
NO_MESSAGE = "no_message"  # the message cannot be digested, or the stream's output not derendered whole


class TamperedHandle(BadRequestError):
    def __init__(self, index: int) -> None:
        super().__init__(
            f"messages.{index}.{continuation.MESSAGE_FIELD} was not issued by this service (bad signature).",
            param=f"messages.{index}.{continuation.MESSAGE_FIELD}",
        )


class GeneratedStore:
    """Handles and the ids behind them: in-process first, then Redis (when configured)."""

    def __init__(
        self,
        key: bytes,
        fingerprint: str,
        metrics: Metrics,
        local: LocalStore | None = None,
        redis: RedisStore | None = None,
    ) -> None:
        self.codec = SnapshotCodec(key)
        self.key_id = hmac.new(key, _KEY_ID_LABEL, hashlib.sha256).hexdigest()[:8]
        self.fingerprint = fingerprint[:16]
        self.metrics = metrics
        self.local = local
        self.redis = redis

    # -- derender ---------------------------------------------------------------------------

    async def issue(self, prompt_ids: Sequence[int], ids: Sequence[int], message: dict[str, Any]) -> str | None:
        """Store the ids and return the handle for `message` (None: the message cannot be digested)."""
        digest = continuation.message_digest(message)
        prompt_digest = continuation.ids_digest(prompt_ids)
        packed = continuation.pack_ids(ids)
        if digest is None or prompt_digest is None or packed is None:
            return None
        ids_digest = continuation.packed_digest(packed)
        store_key = self._store_key(prompt_digest, ids_digest)
        if self.local is not None:  # in-process: the packed ids as they are
            self.local.put(store_key, packed)
        if self.redis is not None:  # shared: signed (nothing unauthenticated comes out of Redis)
            task = self.redis.put(store_key, self.codec.encode({"ids": packed}))
            if task is not None:  # the next turn may go to another replica at once
                await asyncio.wait({task})
        self.metrics.generated_issued.inc()
        payload = {"f": self.fingerprint, "n": len(prompt_ids), "p": prompt_digest, "i": ids_digest, "m": digest}
        token = base64.urlsafe_b64encode(self.codec.encode(payload)).rstrip(b"=").decode("ascii")
        return f"{PREFIX}.{self.key_id}.{token}"

    def skipped(self, reason: str) -> None:
        self.metrics.generated_skipped.labels(reason).inc()

    def _store_key(self, prompt_digest: bytes, ids_digest: bytes) -> str:
        return f"rs:gen:{self.fingerprint}:{prompt_digest.hex()}{ids_digest.hex()}"

    # -- render -----------------------------------------------------------------------------

    async def resolve(self, messages: Any) -> Lookup:
        """Check every assistant message's handle and fetch the ids it names (concurrently).
        Raises `TamperedHandle` for an altered handle; anything else unusable is a reason."""
        turns: dict[int, Generated | str] = {}
        wanted: list[tuple[int, dict[str, Any]]] = []
        if isinstance(messages, list):
            for index, message in enumerate(messages):
                if not isinstance(message, dict) or message.get("role") != "assistant":
                    continue
                handle = message.get(continuation.MESSAGE_FIELD)
                if handle is None:
                    continue
                payload = self._verify(index, handle)
                if payload is None:
                    turns[index] = continuation.FOREIGN
                elif continuation.message_digest(message) != payload["m"]:
                    turns[index] = continuation.MESSAGE_CHANGED
                else:
                    wanted.append((index, payload))
        found = await asyncio.gather(*(self._fetch(payload) for _, payload in wanted))
        for (index, payload), ids in zip(wanted, found, strict=True):
            turns[index] = continuation.NOT_FOUND if ids is None else Generated(payload["n"], payload["p"], ids)
        return Lookup(turns)

    def _verify(self, index: int, handle: Any) -> dict[str, Any] | None:
        """The handle's payload; None when it is another key's or configuration's; raises when altered."""
        if not isinstance(handle, str) or len(handle) > MAX_HANDLE_CHARS:
            raise TamperedHandle(index)
        parts = handle.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            raise TamperedHandle(index)
        if not hmac.compare_digest(parts[1], self.key_id):
            return None
        try:
            blob = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
            payload = self.codec.decode(blob)
        except (binascii.Error, ValueError, SnapshotRejected):
            raise TamperedHandle(index) from None
        if not _well_formed(payload):
            raise TamperedHandle(index)
        return payload if payload["f"] == self.fingerprint else None

    async def _fetch(self, payload: dict[str, Any]) -> list[int] | None:
        key = self._store_key(payload["p"], payload["i"])
        packed = self.local.get(key) if self.local is not None else None
        if packed is None and self.redis is not None:
            blob = await self.redis.get(key)
            if blob is None:
                return None
            try:
                packed = self.codec.decode(blob).get("ids")
            except SnapshotRejected as exc:
                logger.warning("rejected generated ids %s from redis: %s", key, exc.reason)
                return None
            if not isinstance(packed, bytes) or len(packed) % 4:
                return None
            if self.local is not None:
                self.local.put(key, packed)
        if packed is None or continuation.packed_digest(packed) != payload["i"]:
            return None
        return continuation.unpack_ids(packed)

    def count(self, lookup: Lookup) -> None:
        """Per assistant turn with a handle: spliced (a hit) or not, by cause; per request, the reason."""
        result = lookup.result
        spliced = result.spliced_turns if result is not None else 0
        self.metrics.generated_hits.inc(spliced)
        for turn in lookup.turns.values():
            if isinstance(turn, str):
                self.metrics.generated_misses.labels(turn).inc()
        if result is not None and not result.prefix_extends and result.reason is not None:
            self.metrics.generated_renders.labels("false", result.reason).inc()
        elif result is not None:
            self.metrics.generated_renders.labels("true", "").inc()

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()


def _well_formed(payload: dict[str, Any]) -> bool:
    return (
        isinstance(payload.get("f"), str)
        and type(payload.get("n")) is int
        and all(isinstance(payload.get(k), bytes) for k in ("p", "i", "m"))
    )


def build(settings: Any, fingerprint: str, metrics: Metrics, redis: RedisStore | None) -> GeneratedStore | None:
    """The store when `--preserve-generated-tokens` is on (None otherwise). Without `--snapshot-key`
    the key is this replica's own, so its handles are good only here (as its in-process ids are)."""
    if not settings.preserve_generated_tokens:
        return None
    key = settings.snapshot_key.encode() if settings.snapshot_key else _REPLICA_KEY
    local = LocalStore(ttl=settings.preserve_generated_tokens_ttl_seconds)
    return GeneratedStore(key, fingerprint, metrics, local=local, redis=redis)


# -- the derender side ------------------------------------------------------------------------


def _asked(body: dict[str, Any]) -> dict[str, Any] | None:
    """The chat request, when it asked for continuation."""
    chat_request = body.get("chat_request")
    return chat_request if continuation.asked(chat_request) else None


async def issue_batch(store: GeneratedStore, body: dict[str, Any], response: dict[str, Any]) -> None:
    """A handle on each choice's message, for a batch derender whose chat request asked for it."""
    if _asked(body) is None:
        return
    gen = body["generate_response"]
    prompt_ids = gen.get("prompt_token_ids") or body.get("prompt_token_ids")
    if not prompt_ids:
        store.skipped(NO_PROMPT_IDS)
        return
    sent = {choice["index"]: choice.get("token_ids") for choice in gen["choices"]}
    for choice in response["choices"]:
        ids = sent.get(choice["index"])
        if not ids:
            continue
        handle = await store.issue(prompt_ids, ids, choice["message"])
        if handle is None:
            store.skipped(NO_MESSAGE)
        else:
            choice["message"][continuation.MESSAGE_FIELD] = handle


async def issue_stream(
    store: GeneratedStore, ctx: derender.DerenderContext, body: dict[str, Any], result: dict[str, Any]
) -> None:
    """A handle on the delta of a stream's final chunk. The message it is bound to is the whole
    output derendered in one piece (what a client that joins the deltas holds, but for the rare
    outputs whose streamed and batch parses differ: their handle then does not match, and the
    next render says `message_changed`)."""
    chat_request = _asked(body)
    choices = result["chunk"]["choices"]
    engine_choices = body["generate_chunk"]["choices"]
    if chat_request is None or not choices or not engine_choices or choices[0]["finish_reason"] is None:
        return
    ids = result["stream_state"].get("output_token_ids")
    if isinstance(ids, orjson.Fragment):  # a full-mode echo read as bytes (`echo.seal`): decoded once, at the end
        ids = orjson.loads(orjson.dumps(ids))
    prompt_ids = body.get("prompt_token_ids") or body["generate_chunk"].get("prompt_token_ids")
    if not isinstance(ids, list) or not ids:
        store.skipped(NO_STREAM_IDS)
        return
    if not prompt_ids:
        store.skipped(NO_PROMPT_IDS)
        return
    engine = engine_choices[0]
    whole = {
        "model": body.get("model"),
        "prompt_token_ids": prompt_ids,
        "chat_request": chat_request,
        "generate_response": {
            "request_id": body["generate_chunk"].get("request_id"),
            "prompt_token_ids": prompt_ids,
            "choices": [
                {
                    "index": engine.get("index", 0),
                    "token_ids": list(ids),
                    "finish_reason": engine.get("finish_reason"),
                    "stop_reason": engine.get("stop_reason"),
                }
            ],
        },
    }
    try:
        message = derender.derender_chat(ctx, whole)["choices"][0]["message"]
    except Exception:  # e.g. a stop string only the stream path refuses: no handle, never an error
        store.skipped(NO_MESSAGE)
        return
    handle = await store.issue(prompt_ids, ids, message)
    if handle is None:
        store.skipped(NO_MESSAGE)
    else:
        choices[0]["delta"][continuation.MESSAGE_FIELD] = handle
