"""The derender request tables: /v1/chat/completions/derender and /v1/completions/derender.

Each route's body is vLLM's `batch | stream` union (`DerenderChatRequestUnion`,
`DerenderCompletionRequestUnion`), validated by pydantic's smart union: the batch member first,
then the stream member; when both fail, every error of both, each under its member's class name
(`body.DerenderChatRequest.generate_response`), except where a model validator wraps the class
(`DerenderCompletionRequest`: vLLM's error cleaner drops the `function-after[...]` label).
Source: entrypoints/scale_out/token_in_token_out/protocol.py, with the shared types of
serve/engine/protocol.py (`UsageInfo`), generate/base/protocol.py (`PerRequestMetrics`),
logprobs.py (`Logprob`) and outputs.py (`WeightVersionSpan`).
"""

from __future__ import annotations

import enum
import math
from typing import Any

from render_service.api import requests
from render_service.api.schema import (
    INVALID,
    REQUIRED,
    After,
    AnyValue,
    Bool,
    DictOf,
    ErrorList,
    Field,
    FieldType,
    Float,
    Int,
    ListOf,
    Literal,
    Loc,
    Model,
    Nullable,
    Str,
    Union,
    error,
    raise_if_errors,
)
from render_service.exceptions import BadRequestError

PREV_TOKENS_LIMIT = 1024  # DerenderStreamState._bound_prev_tokens
LOGPROB_CONTEXT_LIMIT = 4  # the window `_correct_decoded_token` reads


def _opt(kind: FieldType) -> Nullable:
    return Nullable(kind)


_INT_LIST = ListOf(Int())
_TOKEN_IDS = ListOf(Int(ge=0))  # list[NonNegativeInt]

# -- shared types --------------------------------------------------------------------------------

PROMPT_TOKEN_USAGE_INFO = Model(
    "PromptTokenUsageInfo",
    [
        Field("cached_tokens", _opt(Int())),
        Field("created_cache_tokens", _opt(Int())),
        Field("multimodal_tokens", _opt(DictOf(Int()))),
    ],
)
USAGE_INFO = Model(
    "UsageInfo",
    [
        Field("prompt_tokens", Int(), 0),
        Field("total_tokens", Int(), 0),
        Field("completion_tokens", _opt(Int()), 0),
        Field("prompt_tokens_details", _opt(PROMPT_TOKEN_USAGE_INFO)),
        Field(
            "completion_tokens_details", _opt(Model("CompletionTokenUsageInfo", [Field("reasoning_tokens", Int(), 0)]))
        ),
    ],
)
SPECULATIVE_DECODING_METRICS = Model(
    "SpeculativeDecodingMetrics",
    [
        Field("mean_acceptance_length", Float(), REQUIRED),
        Field("draft_acceptance_rate", Float(), REQUIRED),
        Field("acceptance_histogram", _INT_LIST, REQUIRED),
        Field("num_spec_steps", Int(), REQUIRED),
        Field("num_accepted_draft_tokens", Int(), REQUIRED),
        Field("num_draft_tokens", Int(), REQUIRED),
        Field("num_spec_tokens", Int(), REQUIRED),
        Field("per_step_accepted", _opt(_INT_LIST)),
        Field("per_step_drafted", _opt(_INT_LIST)),
    ],
)
PER_REQUEST_METRICS = Model(
    "PerRequestMetrics",
    [
        Field("time_to_first_token_ms", _opt(Float())),
        Field("generation_time_ms", _opt(Float())),
        Field("queue_time_ms", _opt(Float())),
        Field("mean_itl_ms", _opt(Float())),
        Field("tokens_per_second", _opt(Float())),
        Field("speculative_decoding", _opt(SPECULATIVE_DECODING_METRICS)),
    ],
)
LOGPROB = Model(
    "Logprob",
    [Field("logprob", Float(), REQUIRED), Field("rank", _opt(Int())), Field("decoded_token", _opt(Str()))],
    kind="dataclass",
)
WEIGHT_VERSION_SPAN = Model(
    "WeightVersionSpan",
    [Field("version", Str(), REQUIRED), Field("start", Int(), REQUIRED), Field("end", Int(), REQUIRED)],
    kind="dataclass",
)
PLACEHOLDER_RANGE_INFO = Model(
    "PlaceholderRangeInfo", [Field("offset", Int(ge=0), REQUIRED), Field("length", Int(gt=0), REQUIRED)]
)
GENERATE_LOGPROB_FIELDS = [
    Field("token_id", Int(), REQUIRED),
    Field("logprob", Float(), REQUIRED),
    Field("rank", _opt(Int())),
]
GENERATE_LOGPROB = Model("GenerateLogProb", GENERATE_LOGPROB_FIELDS)
GENERATE_LOGPROBS = Model(
    "GenerateLogProbs",
    [
        Field(
            "content",
            _opt(
                ListOf(
                    Model(
                        "GenerateLogProbsContent",
                        [*GENERATE_LOGPROB_FIELDS, Field("top_logprobs", ListOf(GENERATE_LOGPROB), [])],
                    )
                )
            ),
        )
    ],
)


def _non_negative_token_ids(value: list[int] | None) -> None:
    """`GenerateChoiceBase.validate_token_ids`."""
    if value is not None and value and min(value) < 0:
        raise ValueError("token_ids must not contain negative values")


def _choice_fields(*, stream: bool) -> list[Field]:
    """`GenerateChoiceBase` / `GenerateStreamChoiceBase`, then the tokens mode's `logprobs`."""
    token_ids: FieldType = _opt(_INT_LIST)
    if not stream:  # only the batch choice has the field validator
        token_ids = After(token_ids, _non_negative_token_ids)
    return [
        Field("index", Int(), REQUIRED),
        Field("finish_reason", _opt(Str()), None if stream else "stop"),
        Field("stop_reason", _opt(Union(Int(), Str()))),
        Field("token_ids", token_ids),
        Field("routed_experts", _opt(Str())),
        Field("sampling_mask", _opt(ListOf(_INT_LIST))),
        Field("weight_versions", _opt(ListOf(WEIGHT_VERSION_SPAN))),
        Field("logprobs", _opt(GENERATE_LOGPROBS)),
    ]


GENERATE_TOKENS_RESPONSE = Model(
    "GenerateTokensResponse",
    [
        Field("request_id", Str()),
        Field("model", _opt(Str())),
        Field("created", _opt(Int())),
        Field("usage", _opt(USAGE_INFO)),
        Field("prompt_logprobs", _opt(ListOf(_opt(DictOf(LOGPROB, key=Int()))))),
        Field("prompt_token_id_logprobs", _opt(Str())),
        Field("prompt_token_ids", _opt(_TOKEN_IDS)),
        Field("mm_placeholders", _opt(DictOf(ListOf(PLACEHOLDER_RANGE_INFO)))),
        Field("metrics", _opt(PER_REQUEST_METRICS)),
        Field("kv_transfer_params", _opt(DictOf())),
        Field("ec_transfer_params", _opt(DictOf())),
        Field("output_mode", Literal("tokens"), "tokens"),
        Field("choices", ListOf(Model("GenerateTokensChoice", _choice_fields(stream=False))), REQUIRED),
    ],
)
GENERATE_TOKENS_STREAM_RESPONSE = Model(
    "GenerateTokensStreamResponse",
    [
        Field("request_id", Str()),
        Field("usage", _opt(USAGE_INFO)),
        Field("prompt_token_ids", _opt(_TOKEN_IDS)),
        Field("mm_placeholders", _opt(DictOf(ListOf(PLACEHOLDER_RANGE_INFO)))),
        Field("metrics", _opt(PER_REQUEST_METRICS)),
        Field("output_mode", Literal("tokens"), "tokens"),
        Field("choices", ListOf(Model("GenerateTokensStreamChoice", _choice_fields(stream=True))), REQUIRED),
    ],
)


# -- DerenderStreamState ---------------------------------------------------------------------------


def _bound_prev_tokens(value: list[str]) -> None:
    if len(value) > PREV_TOKENS_LIMIT:
        raise ValueError(f"prev_tokens length ({len(value)}) exceeds maximum ({PREV_TOKENS_LIMIT})")


def _validate_output_chunk_lens(state: dict[str, Any], loc: Loc) -> None:
    total = sum(state.get("output_chunk_lens") or ())
    count = len(state.get("output_token_ids") or ())
    if total != count:
        raise ValueError(
            f"output_chunk_lens must sum to len(output_token_ids) (got sum={total}, len(output_token_ids)={count})"
        )


STREAM_STATE_DEFAULTS: dict[str, Any] = {
    "prev_tokens": [],
    "prefix_offset": 0,
    "read_offset": 0,
    "role_sent": False,
    "logprob_context_token_ids": [],
    "logprob_text_offset": 0,
    "output_token_ids": [],
    "output_chunk_lens": [],
    "tools_streamed": False,
    "last_tool_call_ids": [],
}


def _stream_state_model(*, echo_vouched: bool) -> Model:
    """`DerenderStreamState`; with `echo_vouched`, the echoed output lists (already checked, see
    `Vouched`) are taken as they are, so a chunk's cost does not grow with the stream."""
    output: FieldType = AnyValue() if echo_vouched else _INT_LIST
    chunk_lens: FieldType = AnyValue() if echo_vouched else ListOf(Int(gt=0))
    return Model(
        "DerenderStreamState",
        [
            Field("prev_tokens", After(ListOf(Str()), _bound_prev_tokens), []),
            Field("prefix_offset", Int(ge=0), 0),
            Field("read_offset", Int(ge=0), 0),
            Field("role_sent", Bool(), False),
            Field("logprob_context_token_ids", ListOf(Int(), max_length=LOGPROB_CONTEXT_LIMIT), []),
            Field("logprob_text_offset", Int(ge=0), 0),
            Field("output_token_ids", output, []),
            Field("output_chunk_lens", chunk_lens, []),
            Field("tools_streamed", Bool(), False),
            Field("last_tool_call_ids", ListOf(Str()), []),
        ],
        after=() if echo_vouched else (_validate_output_chunk_lens,),
    )


DERENDER_STREAM_STATE = _stream_state_model(echo_vouched=False)

# -- the request unions ----------------------------------------------------------------------------

_MODEL = Field("model", _opt(Str()))
_STREAM_STATE = Field("stream_state", _opt(DERENDER_STREAM_STATE))
_PROMPT_TOKEN_IDS = Field("prompt_token_ids", _opt(_TOKEN_IDS))
_GENERATE_CHUNK = Field("generate_chunk", GENERATE_TOKENS_STREAM_RESPONSE, REQUIRED)

DERENDER_CHAT_REQUEST = Model(
    "DerenderChatRequest",
    [
        Field("stream", Literal(False), False),
        _MODEL,
        Field("generate_response", GENERATE_TOKENS_RESPONSE, REQUIRED),
        Field("prompt_tokens", _opt(Int())),
        _PROMPT_TOKEN_IDS,
        Field("chat_request", _opt(requests.CHAT_COMPLETION_REQUEST)),
    ],
    labelled=True,
)


def _chat_stream_model(*, echo_vouched: bool = False, request_vouched: bool = False) -> Model:
    """`DerenderChatStreamRequest`; the `*_vouched` variants take what a snapshot vouches for
    as it is (`Vouched`)."""
    state = Field("stream_state", _opt(_stream_state_model(echo_vouched=True))) if echo_vouched else _STREAM_STATE
    return Model(
        "DerenderChatStreamRequest",
        [
            Field("stream", Literal(True), REQUIRED),
            _MODEL,
            _GENERATE_CHUNK,
            state,
            Field("prompt_tokens", _opt(Int())),
            Field("prompt_token_ids", AnyValue()) if request_vouched else _PROMPT_TOKEN_IDS,
            Field("chat_request", AnyValue() if request_vouched else _opt(requests.CHAT_COMPLETION_REQUEST)),
        ],
        labelled=True,
    )


DERENDER_CHAT_STREAM_REQUEST = _chat_stream_model()


class Vouched(enum.Flag):
    """What of a `full`-mode chunk a snapshot of this service vouches for: the echo is, byte for
    byte (a digest of its JSON), what an earlier answer carried, and the request what an earlier
    chunk sent and passed every check with (derender/pipeline.py `vouch`). Those parts are not
    validated again: they grow with the stream (the echoed ids) or are resent with every chunk
    (the request and its prompt ids). Anything else is validated in full."""

    NOTHING = 0
    ECHO = enum.auto()  # stream_state.output_token_ids and output_chunk_lens
    REQUEST = enum.auto()  # chat_request and prompt_token_ids


_VOUCHED_CHAT_STREAM = {
    Vouched.ECHO: _chat_stream_model(echo_vouched=True),
    Vouched.ECHO | Vouched.REQUEST: _chat_stream_model(echo_vouched=True, request_vouched=True),
}


def _validate_prompt_tokens_length(body: dict[str, Any], loc: Loc) -> None:
    """`DerenderCompletionRequest._validate_prompt_tokens_length`."""
    responses = len(body["generate_responses"])
    for name in ("prompt_tokens", "prompt_token_ids"):
        given = body.get(name)
        if given is not None and len(given) != responses:
            raise ValueError(f"{name} length ({len(given)}) must equal generate_responses length ({responses})")


DERENDER_COMPLETION_REQUEST = Model(
    "DerenderCompletionRequest",
    [
        Field("stream", Literal(False), False),
        _MODEL,
        Field("generate_responses", ListOf(GENERATE_TOKENS_RESPONSE), REQUIRED),
        Field("prompt_tokens", _opt(_INT_LIST)),
        Field("prompt_token_ids", _opt(ListOf(_opt(_TOKEN_IDS)))),
        Field("completion_request", _opt(requests.COMPLETION_REQUEST)),
    ],
    after=(_validate_prompt_tokens_length,),
    labelled=False,  # its model validator's `function-after[...]` label is what pydantic shows
)
DERENDER_COMPLETION_STREAM_REQUEST = Model(
    "DerenderCompletionStreamRequest",
    [
        Field("stream", Literal(True), REQUIRED),
        _MODEL,
        _GENERATE_CHUNK,
        _STREAM_STATE,
        Field("prompt_tokens", _opt(Int())),
        _PROMPT_TOKEN_IDS,
        Field("completion_request", _opt(requests.COMPLETION_REQUEST)),
    ],
    labelled=True,
)

DERENDER_CHAT_REQUEST_UNION = Union(DERENDER_CHAT_REQUEST, DERENDER_CHAT_STREAM_REQUEST)
DERENDER_COMPLETION_REQUEST_UNION = Union(DERENDER_COMPLETION_REQUEST, DERENDER_COMPLETION_STREAM_REQUEST)


def _validate_union(batch: Model, stream: Model, body: Any, vouched_stream: Model | None = None) -> bool:
    """Validate `body` against `batch | stream` as pydantic's smart union does, in place.
    Returns whether the body is a stream request.

    Only one member can match (`stream` is `Literal[False]` in one and `Literal[True]` in the
    other), so the member the body's `stream` names is tried first, and the other only to list
    its errors after a failure (pydantic lists the batch member's first). `vouched_stream`: the
    stream member minus what a snapshot vouches for, tried first; on any error the body is
    validated again in full, so the errors are the same as without it.
    """
    loc: Loc = ("body",)
    if body is None:  # FastAPI: a JSON null body is a missing one
        raise_if_errors([error("missing", loc, "Field required", None)])
    wants_stream = isinstance(body, dict) and stream.by_name["stream"].type.check(body.get("stream"), loc, []) is True
    if wants_stream and vouched_stream is not None:
        result = vouched_stream.check(body, _member_loc(vouched_stream), [])
        if result is not INVALID:
            if result is not body:
                body.update(result)
            _as_vllm_echoes(vouched_stream, body)
            return True
    first, second = (stream, batch) if wants_stream else (batch, stream)
    first_errors: ErrorList = []
    result = first.check(body, _member_loc(first), first_errors)
    if result is not INVALID:
        if result is not body:
            body.update(result)
        _as_vllm_echoes(first, body)
        return wants_stream
    second_errors: ErrorList = []
    second.check(body, _member_loc(second), second_errors)
    raise_if_errors(second_errors + first_errors if wants_stream else first_errors + second_errors)
    raise AssertionError("unreachable: both members failed with errors")


def _as_vllm_echoes(member: Model, body: dict[str, Any]) -> None:
    """What vLLM echoes from the engine's response, as its models dump it: `metrics` with every
    field (extra keys after them); and a non-finite float (from "nan", "inf") refused the way
    vLLM's JSON encoder refuses it when it writes the answer. The engine output is read from the
    fields of the `member` that matched: another member's field name may be an extra key here."""
    if "generate_responses" in member.by_name:
        responses = body["generate_responses"]
    else:
        responses = [body["generate_chunk" if "generate_chunk" in member.by_name else "generate_response"]]
    for gen in responses:
        if gen.get("metrics") is not None:
            gen["metrics"] = model_dump(PER_REQUEST_METRICS, gen["metrics"])
        if not _all_finite(gen.get("metrics"), gen.get("prompt_logprobs"), *_choice_logprobs(gen["choices"])):
            raise BadRequestError("Out of range float values are not JSON compliant")


def model_dump(model: Model, value: dict[str, Any]) -> dict[str, Any]:
    """`model_dump()` of a validated OpenAIBaseModel: declared fields in order (defaults filled,
    nested models dumped), then the extra keys it allows."""
    out: dict[str, Any] = {}
    for spec in model.fields:
        item = value.get(spec.name, spec.default)
        inner = spec.type.inner if isinstance(spec.type, Nullable) else spec.type
        out[spec.name] = model_dump(inner, item) if isinstance(inner, Model) and isinstance(item, dict) else item
    for key, item in value.items():
        out.setdefault(key, item)
    return out


def _choice_logprobs(choices: list[dict[str, Any]]) -> list[Any]:
    return [(choice.get("logprobs") or {}).get("content") for choice in choices]


def _all_finite(*values: Any) -> bool:
    """Whether no float inside `values` is nan or infinite (JSON has no spelling for them)."""
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def _member_loc(member: Model) -> Loc:
    return ("body", member.tag) if member.tag else ("body",)


def validate_chat_derender(body: Any, vouched: Vouched = Vouched.NOTHING) -> bool:
    """`DerenderChatRequest | DerenderChatStreamRequest`, in place; True for a stream request.
    `vouched`: what a snapshot vouches for in a stream request (not checked again)."""
    if type(body) is dict and plain_stream_chunk(body, vouched):
        _as_vllm_echoes(DERENDER_CHAT_STREAM_REQUEST, body)
        return True
    return _validate_union(DERENDER_CHAT_REQUEST, DERENDER_CHAT_STREAM_REQUEST, body, _VOUCHED_CHAT_STREAM.get(vouched))


_NULL_IN_PLAIN_CHUNK = ("usage", "prompt_token_ids", "mm_placeholders", "metrics")
_NULL_IN_PLAIN_CHOICE = ("stop_reason", "routed_experts", "sampling_mask", "weight_versions", "logprobs")
_NON_NEGATIVE_STATE_INTS = ("prefix_offset", "read_offset", "logprob_text_offset")


def plain_stream_chunk(body: dict[str, Any], vouched: Vouched) -> bool:
    """Whether `body` is a stream chunk of the everyday shape whose every value the stream
    member's check (`_validate_union`, with what `vouched` names taken as it is) accepts exactly
    as it is: the same checks, by exact type, on the fields such a chunk carries. A chunk, a
    choice or a state field that holds anything else (a logprobs block, usage, a lax int such as
    `"3"` or `1.0`, a bool where an int goes) answers False and is validated by the full check.

    Streaming derender runs once per token; the generic walk over the ~40 fields of
    `DerenderChatStreamRequest` cost as much as the parser step. tests/derender/
    test_plain_stream_chunk.py holds this to the full check."""
    if body.get("stream") is not True:
        return False
    model = body.get("model")
    if model is not None and type(model) is not str:
        return False
    prompt_tokens = body.get("prompt_tokens")
    if prompt_tokens is not None and type(prompt_tokens) is not int:
        return False
    echo_vouched = Vouched.ECHO in vouched
    if not (echo_vouched and Vouched.REQUEST in vouched):  # else both are taken as they are
        if body.get("prompt_token_ids") is not None or body.get("chat_request") is not None:
            return False
    chunk = body.get("generate_chunk")
    if type(chunk) is not dict:
        return False
    if "request_id" in chunk and type(chunk["request_id"]) is not str:
        return False
    for key in _NULL_IN_PLAIN_CHUNK:
        if chunk.get(key) is not None:
            return False
    if "output_mode" in chunk and not (type(chunk["output_mode"]) is str and chunk["output_mode"] == "tokens"):
        return False
    choices = chunk.get("choices")
    if type(choices) is not list:
        return False
    for choice in choices:
        if type(choice) is not dict or type(choice.get("index")) is not int:
            return False
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            return False
        for key in _NULL_IN_PLAIN_CHOICE:
            if choice.get(key) is not None:
                return False
        ids = choice.get("token_ids")
        if ids is not None and not (type(ids) is list and _all_of_type(ids, int)):
            return False
    state = body.get("stream_state")
    return state is None or (type(state) is dict and _plain_stream_state(state, echo_vouched))


def _plain_stream_state(state: dict[str, Any], echo_vouched: bool) -> bool:
    """`plain_stream_chunk` for `stream_state` (absent fields take their defaults)."""
    if not echo_vouched and ("output_token_ids" in state or "output_chunk_lens" in state):
        return False  # the echo is checked in full, with the lengths' model validator
    for key in _NON_NEGATIVE_STATE_INTS:
        if key in state:
            value = state[key]
            if type(value) is not int or value < 0:
                return False
    for key in ("role_sent", "tools_streamed"):
        if key in state and type(state[key]) is not bool:
            return False
    if "prev_tokens" in state:
        value = state["prev_tokens"]
        if type(value) is not list or len(value) > PREV_TOKENS_LIMIT or not _all_of_type(value, str):
            return False
    if "logprob_context_token_ids" in state:
        value = state["logprob_context_token_ids"]
        if type(value) is not list or len(value) > LOGPROB_CONTEXT_LIMIT or not _all_of_type(value, int):
            return False
    if "last_tool_call_ids" in state:
        value = state["last_tool_call_ids"]
        if type(value) is not list or not _all_of_type(value, str):
            return False
    return True


def _all_of_type(items: list[Any], kind: type) -> bool:
    for item in items:
        if type(item) is not kind:
            return False
    return True


def validate_completion_derender(body: Any) -> bool:
    """`DerenderCompletionRequest | DerenderCompletionStreamRequest`, in place; True for a stream
    request."""
    return _validate_union(DERENDER_COMPLETION_REQUEST, DERENDER_COMPLETION_STREAM_REQUEST, body)


def stream_state(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A validated `stream_state` with every field (defaults filled in), our `rs_*` keys kept."""
    if value is None:
        return None
    state = {name: value.get(name, _fresh(default)) for name, default in STREAM_STATE_DEFAULTS.items()}
    for key, item in value.items():
        if key.startswith("rs_"):
            state[key] = item
    # Ours: vLLM has no such check, and answers a 200 that carries a negative `read_offset`.
    prefix, read, window = state["prefix_offset"], state["read_offset"], len(state["prev_tokens"])
    if not prefix <= read <= window:
        raise BadRequestError(
            "stream_state offsets must satisfy prefix_offset <= read_offset <= len(prev_tokens) "
            f"(got {prefix}, {read}, {window})",
            param="stream_state",
        )
    return state


def _fresh(default: Any) -> Any:
    return list(default) if isinstance(default, list) else default
