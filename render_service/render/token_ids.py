"""Every token id a render sends to the engine is inside the vocabulary.

A `--tokens-only` engine has no tokenizer to catch an out-of-vocabulary id, and an id past its
embedding table can take its engine core down: one request must never be able to do that. vLLM's
own render tier forwards token-id prompts unchecked (its engine checks them, older engines not
always); here every id a client supplied is checked before the `GenerateRequest` leaves, with the
messages vLLM's engine gives for the same ids. Ids this service tokenized itself need no check.

The bound is vLLM's (`BaseRenderer.validate_token_ids`): the larger of the tokenizer's and the
model's (`config.json` `vocab_size`) vocabularies. Qwen3's embedding has padding rows past its
tokenizer (151,936 vs 151,669: those ids are valid engine input); some multimodal tokenizers have
placeholder ids past the embedding, which only the tokenizer knows. An id at or past both is
refused here.

Sampling ids (`stop_token_ids`, `allowed_token_ids`, `logit_bias`, `logprob_token_ids`) are left
to the engine, as vLLM's render tier leaves them: its `SamplingParams.verify` refuses them with a
400 before they index anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from render_service.api.protocol import handler_error
from render_service.model.loader import Model


def check_prompt_token_ids(ids: Iterable[int], model: Model, param: str | None = None) -> None:
    """vLLM's `validate_token_ids`: the first negative id, else the largest id, is named."""
    ids = list(ids)
    if not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0:
        raise handler_error(f"Token id {low} is out of vocabulary", param)
    if high >= model.vocab_size:
        raise handler_error(f"Token id {high} is out of vocabulary", param)


def check_forwarded_prompt_token_ids(kv_transfer_params: Any, model: Model) -> None:
    """`kv_transfer_params.prompt_token_ids` that a render forwards to the engine as sent (completions:
    vLLM reuses them for chat, Messages and Responses only, where `reused_prompt_ids` checks them)."""
    if not isinstance(kv_transfer_params, dict):
        return
    ids = kv_transfer_params.get("prompt_token_ids")
    if isinstance(ids, list) and all(type(i) is int for i in ids):
        check_prompt_token_ids(ids, model, "kv_transfer_params.prompt_token_ids")


def check_generate_request(request: dict[str, Any], model: Model, *, client_prompt_ids: bool) -> dict[str, Any]:
    """Every id in an outgoing `GenerateRequest` that a client chose; returns the request.

    `client_prompt_ids`: the prompt ids came from the client (a token-id prompt, reused ids), not
    from this service's tokenizer."""
    if client_prompt_ids:
        check_prompt_token_ids(request["token_ids"], model, "prompt")
    check_forwarded_prompt_token_ids(request.get("kv_transfer_params"), model)
    return request
