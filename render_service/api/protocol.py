"""Wire shapes of vLLM 0.33's render tier, as plain ordered dicts.

Requests are decoded with orjson and validated by hand: the raw dicts keep the caller's key
order (tool schemas reach the chat template exactly as sent) and decoding a 9k-token
request stays a few microseconds. Responses are built in vLLM's declaration order with
nulls included (vLLM serializes them with `model_dump()`), so the JSON is byte-compatible.
"""

from __future__ import annotations

import math
import re
from typing import Any

from render_service.api.schema import error, validation_error
from render_service.exceptions import BadRequestError, RequestValidationError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
OUTPUT_KIND_DELTA = 1
OUTPUT_KIND_FINAL_ONLY = 2
MAX_STOP_STRINGS = 4  # VLLM_MAX_STOP_STRINGS

# ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS: always sent by vLLM (see sampling_params).
DEFAULT_SAMPLING_FLOATS: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


# pydantic's error type for a message, by prefix (the most specific first).
_ERROR_TYPES = (
    ("Field required", "missing"),
    ("Extra inputs are not permitted", "extra_forbidden"),
    ("JSON decode error", "json_invalid"),
    ("Input should be a valid dictionary or object", "model_attributes_type"),
    ("Input should be a valid dictionary", "dict_type"),
    ("Input should be a valid list", "list_type"),
    ("Input should be a valid string", "string_type"),
    ("Input should be a valid integer, unable to parse", "int_parsing"),
    ("Input should be a valid integer, got a number with a fractional part", "int_from_float"),
    ("Input should be a valid integer", "int_type"),
    ("Input should be a finite number", "finite_number"),
    ("Input should be a valid number, unable to parse", "float_parsing"),
    ("Input should be a valid number", "float_type"),
    ("Input should be a valid boolean, unable to interpret", "bool_parsing"),
    ("Input should be a valid boolean", "bool_type"),
    ("Input should be iterable", "iterable_type"),
    ("Input should be greater than or equal to", "greater_than_equal"),
    ("Input should be greater than", "greater_than"),
    ("Input should be less than or equal to", "less_than_equal"),
    ("Input should be less than", "less_than"),
    ("List should have at most", "too_long"),
    ("List should have at least", "too_short"),
    ("String should have at most", "string_too_long"),
    ("Input tag", "union_tag_invalid"),
    ("Unable to extract tag", "union_tag_not_found"),
)
# pydantic's literal_error: "Input should be 'a' or 'b'", "... be True", "... be 3".
_LITERAL = re.compile(r"Input should be (?:'|\"|True\b|False\b|None\b|-?\d)")


def _error_type(message: str) -> str:
    for prefix, kind in _ERROR_TYPES:
        if message.startswith(prefix):
            return kind
    return "literal_error" if _LITERAL.match(message) else "value_error"


def schema_error(param: str, message: str, value: Any = None) -> RequestValidationError:
    """A schema failure reported as vLLM's validation handler reports it (pydantic's error type
    follows from the message)."""
    return validation_error([error(_error_type(message), _loc(param), message, value)])


def union_error(param: str, value: Any, count: int = 2) -> RequestValidationError:
    """A value matching no member of a `str | list[...]` union: pydantic reports every member's
    errors, the `str` member's first; we report that first one (the count is pydantic's minimum)."""
    first = error("string_type", _loc(param), "Input should be a valid string", value)
    return validation_error([first], unlisted=count - 1)


def _loc(param: str) -> tuple[str | int, ...]:
    return tuple(int(part) if part.isdigit() else part for part in param.split("."))


def validator_error(message: str, param: str | None = None, value: Any = None) -> BadRequestError:
    """A VLLMValidationError raised inside a request model validator.

    pydantic does not wrap it (it is not a ValueError), so vLLM's VLLMError handler answers
    it like a handler error: "BadRequestError", the parameter as `param`.
    """
    return handler_error(message, param, value)


def handler_error(message: str, param: str | None = None, value: Any = None) -> BadRequestError:
    """A VLLMValidationError raised in a handler: str() carries parameter and value."""
    extras = []
    if param is not None:
        extras.append(f"parameter={param}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return BadRequestError(text, param=param)


# -- field checks ---------------------------------------------------------------------------


def opt_dict(body: dict[str, Any], name: str, prefix: str = "body") -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise schema_error(f"{prefix}.{name}", "Input should be a valid dictionary", value)
    return value


def check_count(items: list[Any], limit: int, noun: str, param: str) -> None:
    """Our bound on list lengths (vLLM has none), checked before any per-item work."""
    if len(items) > limit:
        raise validator_error(f"Too many {noun}: {len(items)} (at most {limit}).", param)


def bounded_list(value: Any, limit: int, name: str) -> list[Any]:
    """A request's list field `name`: pydantic's type error, then our bound on its length."""
    if not isinstance(value, list):
        raise schema_error(f"body.{name}", "Input should be a valid list", value)
    check_count(value, limit, name, name)
    return value


def validate_cache_salt(salt: Any) -> None:
    """vLLM's `validate_cache_salt` (generate/base/protocol.py)."""
    if salt is None:
        return
    if not isinstance(salt, str):
        raise schema_error("body.cache_salt", "Input should be a valid string", salt)
    if not salt:
        raise validator_error("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > 128 or any(ch in salt for ch in "@/\\\x00"):
        raise validator_error(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


# -- SamplingParams ---------------------------------------------------------------------------

# SamplingParams declaration order (sampling_params.py) and the declared defaults that
# msgspec's omit_defaults compares against. Floats compare by identity in msgspec, and vLLM
# always passes fresh float objects for the fields in DEFAULT_SAMPLING_FLOATS, so those are
# always on the wire; every other field is omitted when equal to its default.
_SAMPLING_ORDER: tuple[tuple[str, Any], ...] = (
    ("n", 1),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0),
    ("temperature", 1.0),
    ("watermarking", None),
    ("top_p", 1.0),
    ("top_k", 0),
    ("min_p", 0.0),
    ("seed", None),
    ("stop", None),
    ("stop_token_ids", None),
    ("ignore_eos", False),
    ("max_tokens", 16),
    ("min_tokens", 0),
    ("logprobs", None),
    ("prompt_logprobs", None),
    ("prompt_logprob_token_ids", None),
    ("prompt_logprob_start", None),
    ("logprob_token_ids", None),
    ("flat_logprobs", False),
    ("detokenize", True),
    ("skip_special_tokens", True),
    ("spaces_between_special_tokens", True),
    ("include_stop_str_in_output", False),
    ("output_kind", 0),
    ("stream_interval", None),
    ("skip_clone", False),
    ("output_text_buffer_length", 0),
    ("structured_outputs", None),
    ("logit_bias", None),
    ("allowed_token_ids", None),
    ("extra_args", None),
    ("bad_words", None),
    ("skip_reading_prefix_cache", None),
    ("thinking_token_budget", None),
    ("repetition_detection", None),
    ("routed_experts_prompt_start", 0),
    ("trace_decode_token_ids", None),
)
_ALWAYS_SENT = frozenset(DEFAULT_SAMPLING_FLOATS) - {"top_k"}
_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2


def sampling_params_wire(values: dict[str, Any]) -> dict[str, Any]:
    """`SamplingParams.from_optional(**values)` after `__post_init__`, as vLLM serializes it."""
    params = dict(values)
    temperature = params["temperature"]
    if 0 < temperature < _MAX_TEMP:
        params["temperature"] = max(temperature, _MAX_TEMP)
    if params.get("seed") == -1:
        params["seed"] = None
    stop = params.get("stop")
    params["stop"] = [] if stop is None else [stop] if isinstance(stop, str) else stop
    stop_ids = params.get("stop_token_ids")
    params["stop_token_ids"] = [] if stop_ids is None else list(dict.fromkeys(stop_ids))
    bad_words = params.get("bad_words")
    params["bad_words"] = [] if bad_words is None else list(dict.fromkeys(bad_words))
    if params["stop"] and not params.get("include_stop_str_in_output", False):
        params["output_text_buffer_length"] = max(len(s) for s in params["stop"]) - 1
    _verify_sampling(params)
    always_sent = _ALWAYS_SENT
    if params["temperature"] < _SAMPLING_EPS:
        # __post_init__ resets these to the declared defaults themselves, so msgspec omits them.
        params["top_p"] = 1.0
        params["top_k"] = 0
        params["min_p"] = 0.0
        always_sent = _ALWAYS_SENT - {"top_p", "min_p"}
        if params.get("n", 1) > 1:
            raise handler_error(f"n must be 1 when using greedy sampling, got {params['n']}.")
    if params.get("skip_reading_prefix_cache") is None:
        params["skip_reading_prefix_cache"] = (
            params.get("prompt_logprobs") is not None or params.get("prompt_logprob_token_ids") is not None
        )
    wire: dict[str, Any] = {}
    for name, default in _SAMPLING_ORDER:
        if name not in params:
            continue
        value = params[name]
        if name in always_sent or _differs(value, default):
            wire[name] = value
    if "logit_bias" in wire and wire["logit_bias"] is not None:
        wire["logit_bias"] = {str(k): v for k, v in wire["logit_bias"].items()}
    return wire


def _differs(value: Any, default: Any) -> bool:
    if value is None or default is None:
        return value is not default
    if isinstance(value, bool) or isinstance(default, bool):
        return value is not default
    return value != default


def _verify_sampling(p: dict[str, Any]) -> None:
    n = p.get("n", 1)
    if n < 1:
        raise handler_error(f"n must be at least 1, got {n}.")
    if n > 16384:
        raise handler_error(
            f"n must be at most 16384, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable."
        )
    if not -2.0 <= p["presence_penalty"] <= 2.0:
        raise handler_error(f"presence_penalty must be in [-2, 2], got {p['presence_penalty']}.")
    if not -2.0 <= p["frequency_penalty"] <= 2.0:
        raise handler_error(f"frequency_penalty must be in [-2, 2], got {p['frequency_penalty']}.")
    rep = p["repetition_penalty"]
    if not math.isfinite(rep):
        raise handler_error(f"repetition_penalty must be a finite number, got {rep}.")
    if rep <= 0.0:
        raise handler_error(f"repetition_penalty must be greater than zero, got {rep}.")
    t = p["temperature"]
    if not math.isfinite(t):
        raise handler_error(f"temperature must be a finite number, got {t}.", "temperature", t)
    if t < 0.0:
        raise handler_error(f"temperature must be non-negative, got {t}.", "temperature", t)
    if t > 2.0:
        raise handler_error(f"temperature must be in [0, 2], got {t}.", "temperature", t)
    if not 0.0 < p["top_p"] <= 1.0:
        raise handler_error(f"top_p must be in (0, 1], got {p['top_p']}.", "top_p", p["top_p"])
    if p["top_k"] < -1:
        raise handler_error(f"top_k must be 0 (disable), or at least 1, got {p['top_k']}.")
    if not 0.0 <= p["min_p"] <= 1.0:
        raise handler_error(f"min_p must be in [0, 1], got {p['min_p']}.")
    max_tokens = p.get("max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise handler_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    min_tokens = p.get("min_tokens", 0)
    if min_tokens < 0:
        raise handler_error(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise handler_error(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    logprobs = p.get("logprobs")
    if logprobs is not None and logprobs != -1 and logprobs < 0:
        raise handler_error(f"logprobs must be non-negative or -1, got {logprobs}.", "logprobs", logprobs)
    if any(not s for s in p["stop"]):
        raise handler_error("stop cannot contain an empty string.")
    if any(not w for w in p["bad_words"]):
        raise handler_error(f"bad_words cannot contain an empty string. Got bad_words={p['bad_words']}")


# -- GenerateRequest ----------------------------------------------------------------------------


def generate_request(
    *,
    request_id: str,
    token_ids: list[int],
    sampling_params: dict[str, Any],
    model: str | None,
    reasoning_ended: bool | None = None,
    reasoning_parser_kwargs: dict[str, Any] | None = None,
    return_token_ids: bool | None = None,
    parse_context: dict[str, Any] | None = None,
    stream: bool = False,
    stream_options: dict[str, Any] | None = None,
    cache_salt: str | None = None,
    priority: int = 0,
    kv_transfer_params: dict[str, Any] | None = None,
    ec_transfer_params: dict[str, Any] | None = None,
    token_offsets: list[list[int]] | None = None,
    features: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `GenerateRequest` in declaration order (ttio/protocol.py), nulls included."""
    return {
        "request_id": request_id,
        "token_ids": token_ids,
        "token_offsets": token_offsets,
        "features": features,
        "content_parts": None,
        "sampling_params": sampling_params,
        "model": model,
        "reasoning_ended": reasoning_ended,
        "reasoning_parser_kwargs": reasoning_parser_kwargs,
        "return_token_ids": return_token_ids,
        "output_mode": "tokens",
        "parse_context": parse_context,
        "stream": stream,
        "stream_options": stream_options,
        "cache_salt": cache_salt,
        "priority": priority,
        "kv_transfer_params": kv_transfer_params,
        "ec_transfer_params": ec_transfer_params,
    }


def stream_options_wire(options: Any) -> dict[str, Any] | None:
    if options is None:
        return None
    # validated (and coerced) by the request table's StreamOptions; null means the default
    include_usage = options.get("include_usage")
    continuous = options.get("continuous_usage_stats")
    return {
        "include_usage": False if include_usage is None else include_usage,
        "continuous_usage_stats": False if continuous is None else continuous,
    }
