"""The OpenAI request tables: chat, completions, /tokenize and /detokenize.

Each table lists vLLM 0.33's fields in declaration order with their pydantic types (schema.py),
and each model validator is a named function run where pydantic runs it: `before` validators on
the raw dict, vLLM's last-defined first (pydantic wraps them in definition order). Sources:
entrypoints/openai/chat_completion/protocol.py (`ChatCompletionRequest`),
entrypoints/openai/completion/protocol.py (`CompletionRequest`),
entrypoints/generate/base/protocol.py (shared types), serve/tokenize/protocol.py.
"""

from __future__ import annotations

from typing import Any

from render_service.api import generated, structured
from render_service.api.protocol import INT64_MAX, INT64_MIN, MAX_STOP_STRINGS, check_count, handler_error
from render_service.api.schema import (
    INVALID,
    REQUIRED,
    AnyValue,
    Bool,
    Check,
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
    legacy,
    raise_if_errors,
)

MAX_COMPLETION_PROMPTS = 1024  # VLLM_MAX_COMPLETION_PROMPTS
# Ours (vLLM has none): far above real conversations and tool lists (OpenAI accepts 128 tools), they
# cap the work of one request before any per-item validation.
MAX_MESSAGES = 100_000
MAX_TOOLS = 10_000

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _opt(kind: FieldType) -> Nullable:
    return Nullable(kind)


# -- shared types (generate/base/protocol.py, sampling_params.py) --------------------------------

# `str | Annotated[list[str], Field(max_length=VLLM_MAX_STOP_STRINGS)] | None`
STOP = Nullable(Union(Str(), ListOf(Str(), max_length=MAX_STOP_STRINGS)))
INT64 = Int(ge=INT64_MIN, le=INT64_MAX)


def top_logprobs(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`TopLogprobsParam`: null means 0 (a BeforeValidator), then `int`."""
    return Int().check(0 if value is None else value, loc, errors)


def _thinking_token_budget(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`validate_thinking_token_budget` (a BeforeValidator raising VLLMValidationError)."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int) or (value < 0 and value != -1):
        raise handler_error(
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
            "thinking_token_budget",
            value,
        )
    return value


STREAM_OPTIONS = Model(
    "StreamOptions",
    [Field("include_usage", _opt(Bool()), False), Field("continuous_usage_stats", _opt(Bool()), False)],
)


def _repetition_detection_post_init(values: dict[str, Any], loc: Loc) -> None:
    """`RepetitionDetectionParams.__post_init__` (its VLLMValidationError escapes pydantic)."""
    max_size = values.get("max_pattern_size", 0)
    min_size = values.get("min_pattern_size", 0)
    if max_size < 0 or min_size < 0 or min_size > max_size:
        raise handler_error(
            "max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= max_pattern_size. "
            "Set both to 0 to disable repetitive pattern detection."
        )
    if max_size > 0 and values.get("min_count", 0) < 2:
        raise handler_error(
            "min_count must be >= 2 to detect repetitive patterns in engine output. If you do not wish to "
            "detect repetitive patterns, set max_pattern_size to 0."
        )


REPETITION_DETECTION = Model(
    "RepetitionDetectionParams",
    [Field("max_pattern_size", Int(), 0), Field("min_pattern_size", Int(), 0), Field("min_count", Int(), 0)],
    kind="dataclass",
    after=(_repetition_detection_post_init,),
)


def _structured_outputs_post_init(values: dict[str, Any], loc: Loc) -> None:
    """`StructuredOutputsParams.__post_init__`: exactly one constraint."""
    structured.make_structured_outputs(**{k: values[k] for k in structured.SO_FIELDS if k in values})


STRUCTURED_OUTPUTS = Model(
    "StructuredOutputsParams",
    [
        Field("json", _opt(Union(Str(), DictOf()))),
        Field("regex", _opt(Str())),
        Field("choice", _opt(ListOf(Str()))),
        Field("grammar", _opt(Str())),
        Field("json_object", _opt(Bool())),
        Field("disable_any_whitespace", Bool(), False),
        Field("disable_additional_properties", Bool(), False),
        Field("whitespace_pattern", _opt(Str())),
        Field("structural_tag", _opt(Str())),
    ],
    kind="dataclass",
    after=(_structured_outputs_post_init,),
)

JSON_SCHEMA_RESPONSE_FORMAT = Model(
    "JsonSchemaResponseFormat",
    [
        Field("name", Str(), REQUIRED),
        Field("description", _opt(Str())),
        Field("schema", _opt(DictOf())),  # `json_schema`, alias "schema"
        Field("strict", _opt(Bool())),
    ],
)
RESPONSE_FORMAT = Nullable(
    Union(
        Model(
            "ResponseFormat",
            [
                Field("type", Literal("text", "json_object", "json_schema"), REQUIRED),
                Field("json_schema", _opt(JSON_SCHEMA_RESPONSE_FORMAT)),
            ],
        ),
        Model(
            "StructuralTagResponseFormat",
            [Field("type", Literal("structural_tag"), REQUIRED), Field("format", AnyValue(), REQUIRED)],
        ),
        Model(
            "LegacyStructuralTagResponseFormat",
            [
                Field("type", Literal("structural_tag"), REQUIRED),
                Field(
                    "structures",
                    ListOf(
                        Model(
                            "LegacyStructuralTag",
                            [
                                Field("begin", Str(), REQUIRED),
                                Field("schema", _opt(DictOf())),
                                Field("end", Str(), REQUIRED),
                            ],
                        )
                    ),
                    REQUIRED,
                ),
                Field("triggers", ListOf(Str()), REQUIRED),
            ],
        ),
    )
)

FUNCTION_DEFINITION = Model(
    "FunctionDefinition",
    [
        Field("name", Str(), REQUIRED),
        Field("description", _opt(Str())),
        Field("parameters", _opt(DictOf())),
        Field("strict", _opt(Bool())),
        Field("defer_loading", _opt(Bool())),
    ],
)
TOOL = Model(
    "ChatCompletionToolsParam",
    [
        Field("type", Literal("function"), "function"),
        Field("function", FUNCTION_DEFINITION, REQUIRED),
        Field("defer_loading", _opt(Bool())),
    ],
)


def _bounded(limit: int, noun: str, inner: ListOf) -> Check:
    """A list field with our bound on its length (vLLM has none), checked before its items."""

    def check(value: Any, loc: Loc, errors: ErrorList) -> Any:
        if isinstance(value, list):
            check_count(value, limit, noun, noun)
        return inner.check(value, loc, errors)

    check.__name__ = f"bounded_{noun}"
    return Check(check, inner)


TOOLS = Nullable(_bounded(MAX_TOOLS, "tools", ListOf(TOOL)))
TOOL_CHOICE = Nullable(
    Union(
        Literal("none"),
        Literal("auto"),
        Literal("required"),
        Model(
            "ChatCompletionNamedToolChoiceParam",
            [
                Field("function", Model("ChatCompletionNamedFunction", [Field("name", Str(), REQUIRED)]), REQUIRED),
                Field("type", Literal("function"), "function"),
            ],
        ),
    )
)
VLLM_XARGS = Nullable(DictOf(Union(Str(), Int(), Float(), ListOf(Union(Str(), Int(), Float())))))


def plain_message(message: Any) -> bool:
    """Whether vLLM's message union takes `message` as it is, in its strict pass, with a member
    whose fields it holds as their exact types: a system, developer or user message with text
    content; an assistant message with text or no content and a list of tool calls or none;
    a tool message with text content and a text `tool_call_id` (optional fields absent or of
    their declared type; other keys are not read). The union's strict pass returns the first
    member that validates, which is then the role's own (the members before it require another
    `role`), and a member that coerces nothing returns the message itself: so for these the
    union's answer is known without walking it. Anything else goes through the union."""
    if type(message) is not dict:
        return False
    role = message.get("role")
    if type(role) is not str:
        return False
    content = message.get("content")
    if "name" in message and type(message["name"]) is not str:
        return False
    if role in _TEXT_ROLES:
        return type(content) is str
    if role == "assistant":
        calls = message.get("tool_calls", _ABSENT)
        return (
            (content is None or type(content) is str)
            and (calls is _ABSENT or type(calls) is list)
            and message.get("audio") is None
            and message.get("function_call") is None
            and (message.get("refusal") is None or type(message["refusal"]) is str)
        )
    if role == "tool":
        return type(content) is str and type(message.get("tool_call_id")) is str
    return False


_TEXT_ROLES = frozenset({"system", "developer", "user"})
_ABSENT: Any = object()


def _check_messages(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`list[ChatCompletionMessageParam]` as vLLM's schema validates it (every error of every
    member of the message union: api/generated.py), after our bound on the count; then the
    checks that stand in for what vLLM validates lazily while it reads the messages (tool calls
    and content parts are `Iterable`s: their first error)."""
    from render_service.render.pipeline import check_messages

    if isinstance(value, list):
        check_count(value, MAX_MESSAGES, "messages", "messages")
    if isinstance(value, list) and all(map(plain_message, value)):
        result = value  # what the union gives these (tests/api/test_plain_messages.py)
    else:
        result = generated.field_type("chat.messages").check(value, loc, errors)
    if result is INVALID:
        return INVALID
    return legacy(lambda messages, _: check_messages(messages))(result, loc, errors)


MESSAGES = Check(
    _check_messages,
    {"type": "array", "items": {"type": "object", "properties": {"role": {"type": "string"}}, "required": ["role"]}},
)


def _sampling_fields(*, chat: bool) -> dict[str, Field]:
    """Fields chat and completions declare alike (their order differs: see the tables)."""
    return {
        f.name: f
        for f in (
            Field("model", _opt(Str())),
            Field("frequency_penalty", _opt(Float())),
            Field("logit_bias", _opt(DictOf(Float()))),
            Field("presence_penalty", _opt(Float())),
            Field("response_format", RESPONSE_FORMAT),
            Field("seed", _opt(INT64)),
            Field("stop", STOP, []),
            Field("stream", _opt(Bool()), False),
            Field("stream_options", _opt(STREAM_OPTIONS)),
            Field("temperature", _opt(Float())),
            Field("top_p", _opt(Float())),
            Field("user", _opt(Str())),
            Field("use_beam_search", Bool(), False),
            Field("top_k", _opt(Int())),
            Field("min_p", _opt(Float())),
            Field("repetition_penalty", _opt(Float())),
            Field("watermarking", _opt(Bool())),
            Field("length_penalty", Float(), 1.0),
            Field("stop_token_ids", _opt(ListOf(Int())), []),
            Field("include_stop_str_in_output", Bool(), False),
            Field("ignore_eos", Bool(), False),
            Field("min_tokens", Int(), 0),
            Field("skip_special_tokens", _opt(Bool())),
            Field("spaces_between_special_tokens", Bool(), True),
            Field("truncate_prompt_tokens", _opt(Int(ge=-1, le=INT64_MAX))),
            Field("truncation_side", _opt(Literal("left", "right"))),
            Field("prompt_logprobs", _opt(Int())),
            Field("logprob_token_ids", _opt(ListOf(Int()))),
            Field("allowed_token_ids", _opt(ListOf(Int()))),
            Field("bad_words", ListOf(Str()), []),
            Field("structured_outputs", _opt(STRUCTURED_OUTPUTS)),
            Field("priority", INT64, 0),
            Field("request_id", Str()),
            Field("session_id", _opt(Str())),
            Field("return_tokens_as_token_ids", _opt(Bool())),
            Field("return_token_ids", _opt(Bool())),
            Field("return_weight_versions", Bool(), False),
            Field("routed_experts_prompt_start", Int(ge=0), 0),
            Field("return_token_offsets", _opt(Bool()), False),
            Field("mm_payload", Literal("tensors", "none"), "tensors"),
            Field("return_mm_kwargs", _opt(Bool())),
            Field("cache_salt", _opt(Str(min_length=1, max_length=1024))),
            Field("kv_transfer_params", _opt(DictOf())),
            Field("ec_transfer_params", _opt(DictOf())),
            Field("vllm_xargs", VLLM_XARGS),
            Field("repetition_detection", _opt(REPETITION_DETECTION)),
            Field("thinking_token_budget", Check(_thinking_token_budget, _opt(Int(ge=-1)))),
            Field("stream_interval", _opt(Int(ge=1))),
            Field("echo", Bool(), False) if chat else Field("echo", _opt(Bool()), False),
            Field("add_special_tokens", Bool(), not chat),
        )
    }


# -- model validators shared by chat and completions --------------------------------------------


def apply_return_mm_kwargs_alias(data: dict[str, Any], loc: Loc) -> None:
    """`resolve_return_mm_kwargs_alias`: `return_mm_kwargs: false` means `mm_payload: "none"`."""
    if data.get("return_mm_kwargs") is False and "mm_payload" not in data:
        data["mm_payload"] = "none"


def check_cache_salt_support(data: dict[str, Any], loc: Loc) -> None:
    """`validate_cache_salt` on the raw value."""
    salt = data.get("cache_salt")
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise handler_error("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > 128 or any(ch in salt for ch in "@/\\\x00"):
        raise handler_error(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def validate_response_format(data: dict[str, Any], loc: Loc) -> None:
    structured.validate_response_format(data)


def validate_stream_options(data: dict[str, Any], loc: Loc) -> None:
    if data.get("stream_options") and not data.get("stream"):
        raise handler_error("Stream options can only be defined when `stream=True`.", "stream_options")


def _not_a_number(data: dict[str, Any], names: tuple[str, ...]) -> None:
    # vLLM compares these raw values with ints: anything but a number is refused first.
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise handler_error(f"`{name}` must be an integer.", name, value)


# -- chat -----------------------------------------------------------------------------------------


def chat_check_system_message_content_type(data: dict[str, Any], loc: Loc) -> None:
    """Logs only (vLLM warns about non-text system content and accepts it)."""


def chat_drop_prompt_token_ids_with_media(data: dict[str, Any], loc: Loc) -> None:
    """Forwarded prompt ids would drop the media in `messages`: vLLM ignores them then."""
    from render_service.render.templating import has_non_text_content

    kv = data.get("kv_transfer_params")
    if isinstance(kv, dict) and kv.get("prompt_token_ids") is not None and has_non_text_content(data.get("messages")):
        kv.pop("prompt_token_ids")


def check_generation_prompt(data: dict[str, Any], loc: Loc) -> None:
    if data.get("continue_final_message") and data.get("add_generation_prompt"):
        raise handler_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")


def chat_check_tool_usage(data: dict[str, Any], loc: Loc) -> None:
    """`check_tool_usage`, including its "auto" default. vLLM reads `tools[i]["function"]["name"]`
    from the raw body (a 500 on a malformed tool): we validate the tools first (a 400)."""
    if data.get("tools") == []:
        raise handler_error(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "tools"
        )
    if "tool_choice" not in data and data.get("tools"):
        data["tool_choice"] = "auto"
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return
    tools = data.get("tools")
    if tools is None:
        raise handler_error("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise handler_error(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or "required" are supported.',
            "tool_choice",
        )
    if not isinstance(choice, dict):
        return
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    function = choice.get("function")
    if not isinstance(function, dict):
        raise handler_error(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}", "tool_choice.function"
        )
    if "name" not in function:
        raise handler_error(
            f"Expected field `name` in `function` in `tool_choice`! {usage}", "tool_choice.function.name"
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise handler_error(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}", "tool_choice.function.name"
        )
    errors: ErrorList = []
    if TOOLS.check(tools, (*loc, "tools"), errors) is INVALID:
        from render_service.api.schema import validation_error

        raise validation_error(errors)
    if not any(tool["function"]["name"] == name for tool in tools):
        raise handler_error(
            "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice"
        )


def chat_check_structured_outputs_count(data: dict[str, Any], loc: Loc) -> None:
    structured.check_structured_outputs_count(data, chat=True)


def chat_check_logprobs(data: dict[str, Any], loc: Loc) -> None:
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise handler_error("`logprob_token_ids` is not supported with beam search.", "logprob_token_ids")
    if data.get("logprob_token_ids") and not data.get("logprobs"):
        raise handler_error("when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids")
    _not_a_number(data, ("prompt_logprobs", "top_logprobs"))
    prompt_logprobs = data.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise handler_error("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise handler_error("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", prompt_logprobs)
    top_logprobs = data.get("top_logprobs")
    if top_logprobs is not None:
        if top_logprobs < 0 and top_logprobs != -1:
            raise handler_error("`top_logprobs` must be a positive value or -1.", "top_logprobs", top_logprobs)
        if (top_logprobs == -1 or top_logprobs > 0) and not data.get("logprobs"):
            raise handler_error("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")


def chat_normalize_messages(data: dict[str, Any], loc: Loc) -> None:
    """`_normalize_messages_before`: the deprecated `reasoning_content` becomes `reasoning`."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        reasoning_content = message.pop("reasoning_content", None)
        if reasoning_content is not None and message.get("reasoning") is None:
            message["reasoning"] = reasoning_content


def _chat_fields() -> list[Field]:
    shared = _sampling_fields(chat=True)
    fields = [
        Field("messages", MESSAGES, REQUIRED),
        shared["model"],
        shared["frequency_penalty"],
        shared["logit_bias"],
        Field("logprobs", _opt(Bool()), False),
        Field("top_logprobs", Check(top_logprobs, Int()), 0),
        Field("max_tokens", _opt(Int())),
        Field("max_completion_tokens", _opt(Int())),
        Field("n", _opt(Int()), 1),
    ]
    fields += [shared[name] for name in ("presence_penalty", "response_format", "seed", "stop", "stream")]
    fields += [shared[name] for name in ("stream_options", "temperature", "top_p")]
    fields += [
        Field("tools", TOOLS),
        Field("tool_choice", TOOL_CHOICE, "none"),
        Field("reasoning_effort", _opt(Literal(*REASONING_EFFORTS))),
        shared["thinking_token_budget"],
        Field("include_reasoning", Bool(), True),
        Field("parallel_tool_calls", _opt(Bool()), True),
    ]
    fields += [
        shared[name]
        for name in (
            "user",
            "use_beam_search",
            "top_k",
            "min_p",
            "repetition_penalty",
            "watermarking",
            "length_penalty",
            "stop_token_ids",
            "include_stop_str_in_output",
            "ignore_eos",
            "min_tokens",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "truncate_prompt_tokens",
            "truncation_side",
            "prompt_logprobs",
            "logprob_token_ids",
            "allowed_token_ids",
            "bad_words",
            "echo",
        )
    ]
    fields += [
        Field("add_generation_prompt", Bool(), True),
        Field("continue_final_message", Bool(), False),
        shared["add_special_tokens"],
        Field("documents", _opt(ListOf(DictOf(Str())))),
        Field("chat_template", _opt(Str())),
        Field("chat_template_kwargs", _opt(DictOf())),
        Field("media_io_kwargs", _opt(DictOf(DictOf()))),
        Field("mm_processor_kwargs", _opt(DictOf())),
    ]
    fields += [
        shared[name]
        for name in (
            "structured_outputs",
            "priority",
            "request_id",
            "session_id",
            "return_tokens_as_token_ids",
            "return_token_ids",
            "return_weight_versions",
            "routed_experts_prompt_start",
            "return_token_offsets",
        )
    ]
    fields.append(Field("return_prompt_text", _opt(Bool())))
    fields += [
        shared[name]
        for name in (
            "mm_payload",
            "return_mm_kwargs",
            "cache_salt",
            "kv_transfer_params",
            "ec_transfer_params",
            "vllm_xargs",
            "repetition_detection",
            "stream_interval",
        )
    ]
    return fields


CHAT_COMPLETION_REQUEST = Model(
    "ChatCompletionRequest",
    _chat_fields(),
    before=(
        chat_check_system_message_content_type,
        chat_drop_prompt_token_ids_with_media,
        check_generation_prompt,
        chat_check_tool_usage,
        chat_check_structured_outputs_count,
        chat_check_logprobs,
        validate_stream_options,
        validate_response_format,
        chat_normalize_messages,
        check_cache_salt_support,
        apply_return_mm_kwargs_alias,
    ),
)


def validate_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """`ChatCompletionRequest.model_validate(body)`, in place."""
    return CHAT_COMPLETION_REQUEST.validate(body)


# -- completions ------------------------------------------------------------------------------


def completion_validate_prompt_list_length(data: dict[str, Any], loc: Loc) -> None:
    prompt = data.get("prompt")
    if (
        isinstance(prompt, list)
        and prompt
        and not all(isinstance(p, int) for p in prompt)
        and len(prompt) > MAX_COMPLETION_PROMPTS
    ):
        raise handler_error(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {MAX_COMPLETION_PROMPTS}. "
            "To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            "prompt",
        )
    embeds = data.get("prompt_embeds")
    if isinstance(embeds, list) and len(embeds) > MAX_COMPLETION_PROMPTS:
        raise handler_error(
            f"prompt_embeds list length {len(embeds)} exceeds the maximum allowed count of {MAX_COMPLETION_PROMPTS}. "
            "To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            "prompt_embeds",
        )


def completion_validate_prompt_and_prompt_embeds(data: dict[str, Any], loc: Loc) -> None:
    prompt = data.get("prompt")
    embeds = data.get("prompt_embeds")
    if (prompt is None or prompt == "") and (embeds is None or embeds == []):
        raise handler_error("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")


def completion_check_logprobs(data: dict[str, Any], loc: Loc) -> None:
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise handler_error("`logprob_token_ids` is not supported with beam search.", "logprob_token_ids")
    if data.get("use_beam_search") and data.get("echo") and data.get("logprobs") is not None:
        raise handler_error(
            "`echo` with `logprobs` is not supported with beam search because beam search does not compute "
            "prompt logprobs.",
            "echo",
        )
    if data.get("logprob_token_ids") and data.get("echo") and data.get("max_tokens") == 0:
        raise handler_error(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output tokens "
            "are generated.",
            "logprob_token_ids",
        )
    if data.get("logprob_token_ids") and data.get("logprobs") is None:
        raise handler_error("when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids")
    _not_a_number(data, ("prompt_logprobs", "logprobs"))
    prompt_logprobs = data.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise handler_error("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise handler_error("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", prompt_logprobs)
    logprobs = data.get("logprobs")
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise handler_error("`logprobs` must be a positive value or -1.", "logprobs", logprobs)


def completion_check_structured_outputs_count(data: dict[str, Any], loc: Loc) -> None:
    structured.check_structured_outputs_count(data, chat=False)


def completion_normalize_null_max_tokens(data: dict[str, Any], loc: Loc) -> None:
    if data.get("max_tokens") is None:
        data["max_tokens"] = 16


_TOKEN_ID = Int(ge=0)
PROMPT = Nullable(Union(ListOf(_TOKEN_ID), ListOf(ListOf(_TOKEN_ID)), Str(), ListOf(Str())))


def _completion_fields() -> list[Field]:
    shared = _sampling_fields(chat=False)
    fields = [shared["model"], Field("prompt", PROMPT), shared["echo"], shared["frequency_penalty"]]
    fields += [shared["logit_bias"], Field("logprobs", _opt(Int())), Field("max_tokens", _opt(Int()), 16)]
    fields += [Field("n", Int(), 1), shared["presence_penalty"], shared["seed"], shared["stop"], shared["stream"]]
    fields += [shared["stream_options"], Field("suffix", _opt(Str())), shared["temperature"], shared["top_p"]]
    fields += [
        shared[name]
        for name in (
            "user",
            "use_beam_search",
            "top_k",
            "min_p",
            "repetition_penalty",
            "watermarking",
            "length_penalty",
            "stop_token_ids",
            "include_stop_str_in_output",
            "ignore_eos",
            "min_tokens",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "truncate_prompt_tokens",
            "truncation_side",
            "allowed_token_ids",
            "prompt_logprobs",
            "logprob_token_ids",
            "bad_words",
        )
    ]
    fields.append(
        Field("prompt_embeds", _opt(Union(AnyValue({"type": "string"}), ListOf(AnyValue({"type": "string"})))))
    )
    fields += [
        shared[name]
        for name in (
            "add_special_tokens",
            "response_format",
            "structured_outputs",
            "priority",
            "request_id",
            "session_id",
            "return_tokens_as_token_ids",
            "return_token_ids",
            "return_weight_versions",
            "routed_experts_prompt_start",
            "return_token_offsets",
            "mm_payload",
            "return_mm_kwargs",
            "cache_salt",
            "kv_transfer_params",
            "ec_transfer_params",
            "vllm_xargs",
            "repetition_detection",
            "thinking_token_budget",
            "stream_interval",
        )
    ]
    return fields


COMPLETION_REQUEST = Model(
    "CompletionRequest",
    _completion_fields(),
    before=(
        completion_validate_prompt_list_length,
        completion_validate_prompt_and_prompt_embeds,
        validate_stream_options,
        completion_check_logprobs,
        completion_check_structured_outputs_count,
        validate_response_format,
        completion_normalize_null_max_tokens,
        check_cache_salt_support,
        apply_return_mm_kwargs_alias,
    ),
)


def validate_completion_request(body: dict[str, Any]) -> dict[str, Any]:
    """`CompletionRequest.model_validate(body)`, in place."""
    return COMPLETION_REQUEST.validate(body)


# -- /tokenize, /detokenize --------------------------------------------------------------------

TOKENIZE_COMPLETION_REQUEST = Model(
    "TokenizeCompletionRequest",
    [
        Field("model", _opt(Str())),
        Field("prompt", Str(), REQUIRED),
        Field("add_special_tokens", Bool(), True),
        Field("return_token_strs", _opt(Bool()), False),
    ],
)
TOKENIZE_CHAT_REQUEST = Model(
    "TokenizeChatRequest",
    [
        Field("model", _opt(Str())),
        Field("messages", MESSAGES, REQUIRED),
        Field("add_generation_prompt", Bool(), True),
        Field("return_token_strs", _opt(Bool()), False),
        Field("continue_final_message", Bool(), False),
        Field("add_special_tokens", Bool(), False),
        Field("chat_template", _opt(Str())),
        Field("chat_template_kwargs", _opt(DictOf())),
        Field("media_io_kwargs", _opt(DictOf(DictOf()))),
        Field("mm_processor_kwargs", _opt(DictOf())),
        Field("tools", _opt(_bounded(MAX_TOOLS, "tools", ListOf(TOOL)))),
    ],
    before=(check_generation_prompt,),
)
TOKENIZE_REQUEST_MEMBERS = (TOKENIZE_COMPLETION_REQUEST, TOKENIZE_CHAT_REQUEST)
TOKENIZE_REQUEST = Union(*TOKENIZE_REQUEST_MEMBERS)
DETOKENIZE_REQUEST = Model(
    "DetokenizeRequest",
    [Field("model", _opt(Str())), Field("tokens", ListOf(Int(ge=0, le=INT64_MAX)), REQUIRED)],
)


def validate_tokenize_request(body: dict[str, Any]) -> Model:
    """`TokenizeCompletionRequest | TokenizeChatRequest` (FastAPI's body union), in place: the
    member that validated (a body with both a valid `prompt` and `messages` is a completion)."""
    errors: ErrorList = []
    index, result = TOKENIZE_REQUEST.match(body, ("body",), errors)
    raise_if_errors(errors)
    for key, item in result.items():
        body[key] = item
    assert index is not None
    return TOKENIZE_REQUEST_MEMBERS[index]


def validate_detokenize_request(body: dict[str, Any]) -> dict[str, Any]:
    return DETOKENIZE_REQUEST.validate(body)
