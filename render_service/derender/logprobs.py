"""Generate's integer-id logprobs resolved to the OpenAI chat and completions shapes, as vLLM does.

A port of vLLM 0.33's `_resolve_logprobs`, `_correct_decoded_token` (U+FFFD byte-fallback
repair over a 4-token context), `decode_token_ids` and the top-k cuts of the coupled
endpoints (`chat_top_logprobs_limit`, `completion_top_logprobs_limit`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

CONTEXT_WINDOW = 4  # _LOGPROB_CONTEXT_WINDOW
REPLACEMENT = "\ufffd"


class Decoder:
    """Per-token decoding with the engine's rules, cached per token id (the vocabulary is fixed)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.marker = _leading_space_marker(tokenizer)
        self.decode_one = lru_cache(maxsize=1 << 16)(self._decode_one)

    def _decode_one(self, token_id: int) -> tuple[str, list[int] | None]:
        raw = self.tokenizer.convert_ids_to_tokens([token_id])[0]
        if raw is None:
            return "", None
        text = self.tokenizer.decode([token_id]) or ""
        if self.marker is not None:
            text = _restore_leading_spaces(raw, text, self.marker)
        return text, list(text.encode("utf-8", errors="replace"))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def _leading_space_marker(tokenizer: Any) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except Exception:
        return None
    if pre.get("type") == "Metaspace":
        return pre.get("replacement", "▁")
    if pre.get("type") == "Sequence":
        for sub in pre.get("pretokenizers", []):
            if sub.get("type") == "Metaspace":
                return sub.get("replacement", "▁")
    return None


def _restore_leading_spaces(raw: str, text: str, marker: str) -> str:
    markers = len(raw) - len(raw.lstrip(marker))
    if markers == 0:
        return text
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def chat_top_limit(chat_request: dict[str, Any] | None) -> int | None:
    if chat_request is None or not chat_request.get("logprobs"):
        return None
    top = chat_request.get("top_logprobs")
    if chat_request.get("logprob_token_ids") or top == -1:
        return None
    return top or 0


def completion_top_limit(completion_request: dict[str, Any] | None) -> int | None:
    if completion_request is None:
        return None
    logprobs = completion_request.get("logprobs")
    if completion_request.get("logprob_token_ids") or logprobs is None or logprobs == -1:
        return None
    return max(logprobs + 1, 0)


def _correct(token_id: int, context: Sequence[int], decoder: Decoder) -> str:
    """`_correct_decoded_token`: decode with preceding sampled ids to repair byte fallback."""
    for num in range(1, min(len(context), CONTEXT_WINDOW) + 1):
        ctx = list(context[-num:])
        full = decoder.decode([*ctx, token_id])
        if full.endswith(REPLACEMENT):
            continue
        clean_end = len(ctx)
        for j in range(len(ctx) - 1, -1, -1):
            if decoder.decode([ctx[j]]).endswith(REPLACEMENT):
                clean_end = j
            else:
                break
        prefix = decoder.decode(ctx[:clean_end]) if clean_end > 0 else ""
        if full.startswith(prefix):
            return full[len(prefix) :]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def resolve(
    logprobs: dict[str, Any], decoder: Decoder, context: Sequence[int] = (), top_limit: int | None = None
) -> dict[str, Any]:
    """`ChatCompletionLogProbs` for one choice: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = logprobs.get("content")
    if content is None:
        return {"content": None}
    ctx = list(context)
    out = []
    for entry in content:
        tops = entry.get("top_logprobs") or []
        if top_limit is not None:
            tops = tops[:top_limit]
        token_id = entry["token_id"]
        token, token_bytes = decoder.decode_one(token_id)
        if token.endswith(REPLACEMENT):
            token = _correct(token_id, ctx, decoder)
            token_bytes = list(token.encode("utf-8"))
        resolved_tops = []
        for top in tops:
            top_token, top_bytes = decoder.decode_one(top["token_id"])
            if top_token.endswith(REPLACEMENT):
                top_token = _correct(top["token_id"], ctx, decoder)
                top_bytes = list(top_token.encode("utf-8"))
            resolved_tops.append({"token": top_token, "logprob": top["logprob"], "bytes": top_bytes})
        out.append({"token": token, "logprob": entry["logprob"], "bytes": token_bytes, "top_logprobs": resolved_tops})
        ctx.append(token_id)
    return {"content": out}


def to_completion(resolved: dict[str, Any], source: dict[str, Any], initial_offset: int = 0) -> dict[str, Any]:
    """`CompletionLogProbs`: parallel lists with absolute `text_offset`."""
    content = resolved.get("content")
    if content is None:
        return {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    offsets, logps, tokens, tops = [], [], [], []
    offset = initial_offset
    for entry, src in zip(content, source.get("content") or (), strict=False):
        offsets.append(offset)
        tokens.append(entry["token"])
        logps.append(entry["logprob"])
        tops.append({t["token"]: t["logprob"] for t in entry["top_logprobs"]} if src.get("top_logprobs") else None)
        offset += len(entry["token"])
    return {"text_offset": offsets, "token_logprobs": logps, "tokens": tokens, "top_logprobs": tops}


def context_tail(context: Sequence[int], delta: Sequence[int]) -> list[int]:
    return [*context, *delta][-CONTEXT_WINDOW:]
