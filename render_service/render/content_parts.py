"""Chat content parts checked as vLLM 0.33's request schema checks them, without pydantic.

vLLM validates `messages` against a union of OpenAI's message TypedDicts and its own
`CustomChatCompletionMessageParam`. OpenAI's members declare `content` as a lazy `Iterable[...]`
(a pydantic `ValidatorIterator`: each part is validated only when the renderer reaches it), vLLM's
member as an eager `list[...]` of a wide union in which several members have no required field
(so every dict passes it, stripped to the fields that member declares). pydantic's smart union
then keeps the member that set the most fields: vLLM's member when a part keeps at least one field
there, else OpenAI's role member, whose lazy validation fails on the part with a 400 listing every
union member's errors ("N validation errors for ValidatorIterator").

This module answers, per part, what that does: `check_part` raises the same 400 (message,
type and status as vLLM's) for a part OpenAI's member refuses when vLLM's member would not keep it.
It covers the content of `user`, `system`, `developer`, `assistant` and `tool` messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from render_service.exceptions import BadRequestError

_PYDANTIC_DOCS = "https://errors.pydantic.dev/2.14/v/"

# A field check returns None when the value is valid, else a list of (loc suffix, type, msg, value).
_Error = tuple[tuple[str, ...], str, str, Any]
_Check = Callable[[Any], list[_Error] | None]


def _literal(*values: str) -> _Check:
    if len(values) == 1:
        expected = f"'{values[0]}'"
    else:
        expected = ", ".join(f"'{v}'" for v in values[:-1]) + f" or '{values[-1]}'"

    def check(value: Any) -> list[_Error] | None:
        if isinstance(value, str) and value in values:
            return None
        return [((), "literal_error", f"Input should be {expected}", value)]

    return check


def _string(value: Any) -> list[_Error] | None:
    return None if isinstance(value, str) else [((), "string_type", "Input should be a valid string", value)]


def _optional_string(value: Any) -> list[_Error] | None:
    return None if value is None or isinstance(value, str) else _string(value)


def _boolean(value: Any) -> list[_Error] | None:
    # pydantic's lax bool: true/false, 0/1 and the usual strings
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
        return None
    if isinstance(value, str) and value.lower() in (
        "0",
        "1",
        "true",
        "false",
        "yes",
        "no",
        "on",
        "off",
        "t",
        "f",
        "y",
        "n",
    ):
        return None
    return [((), "bool_parsing" if isinstance(value, str) else "bool_type", "Input should be a valid boolean", value)]


def _embeds(value: Any) -> list[_Error] | None:
    """`str | dict[str, str | list[int | float]] | None` (only validity matters here)."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, dict) and all(
        isinstance(v, str)
        or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))  # lax: bools are ints
        for v in value.values()
    ):
        return None
    return [((), "union", "invalid embeds", value)]


def _never(value: Any) -> list[_Error] | None:
    """A PIL image: no JSON value is one; null is allowed by the field's `| None`."""
    return None if value is None else [((), "is_instance_of", "Input should be an instance of Image", value)]


class _TypedDict:
    """One TypedDict of the schema: fields in declaration order, each (name, required, check)."""

    def __init__(self, name: str, fields: list[tuple[str, bool, _Check]]) -> None:
        self.name = name
        self.fields = fields

    def errors(self, value: Any) -> list[_Error]:
        if not isinstance(value, dict):
            return [((), "dict_type", "Input should be a valid dictionary", value)]
        out: list[_Error] = []
        for field, required, check in self.fields:
            if field not in value:
                if required:
                    out.append(((field,), "missing", "Field required", value))
                continue
            for loc, kind, msg, bad in check(value[field]) or ():
                out.append(((field, *loc), kind, msg, bad))
        return out

    def kept_fields(self, value: dict[str, Any]) -> int:
        """How many fields pydantic sets when `value` validates as this TypedDict (-1: it does not)."""
        if self.errors(value):
            return -1
        return sum(1 for field, _, _ in self.fields if field in value)

    def __call__(self, value: Any) -> list[_Error] | None:
        return self.errors(value) or None


_CACHE_BREAKPOINT = _TypedDict(
    "PromptCacheBreakpoint", [("mode", True, _literal("explicit")), ("ttl", False, _literal("30m", "12h"))]
)
_IMAGE_URL = _TypedDict(
    "ImageURL", [("url", True, _string), ("detail", False, _literal("auto", "low", "high", "original"))]
)
_INPUT_AUDIO = _TypedDict("InputAudio", [("data", True, _string), ("format", True, _literal("wav", "mp3"))])
_FILE = _TypedDict(
    "FileFile", [("file_data", False, _string), ("file_id", False, _string), ("filename", False, _string)]
)
_URL = _TypedDict("URL", [("url", True, _string)])

TEXT = _TypedDict(
    "ChatCompletionContentPartTextParam",
    [("text", True, _string), ("type", True, _literal("text")), ("prompt_cache_breakpoint", False, _CACHE_BREAKPOINT)],
)
IMAGE = _TypedDict(
    "ChatCompletionContentPartImageParam",
    [
        ("image_url", True, _IMAGE_URL),
        ("type", True, _literal("image_url")),
        ("prompt_cache_breakpoint", False, _CACHE_BREAKPOINT),
    ],
)
INPUT_AUDIO = _TypedDict(
    "ChatCompletionContentPartInputAudioParam",
    [
        ("input_audio", True, _INPUT_AUDIO),
        ("type", True, _literal("input_audio")),
        ("prompt_cache_breakpoint", False, _CACHE_BREAKPOINT),
    ],
)
FILE = _TypedDict(
    "File",
    [("file", True, _FILE), ("type", True, _literal("file")), ("prompt_cache_breakpoint", False, _CACHE_BREAKPOINT)],
)
REFUSAL = _TypedDict(
    "ChatCompletionContentPartRefusalParam", [("refusal", True, _string), ("type", True, _literal("refusal"))]
)

# vLLM's `ChatCompletionContentPartParam` (renderers/chat_utils/types.py), without `str`.
_VLLM_PARTS = (
    TEXT,
    IMAGE,
    INPUT_AUDIO,
    FILE,
    _TypedDict(
        "ChatCompletionContentPartAudioParam", [("audio_url", True, _URL), ("type", True, _literal("audio_url"))]
    ),
    _TypedDict(
        "ChatCompletionContentPartVideoParam", [("video_url", True, _URL), ("type", True, _literal("video_url"))]
    ),
    REFUSAL,
    _TypedDict(
        "CustomChatCompletionContentPILImageParam", [("image_pil", False, _never), ("uuid", False, _optional_string)]
    ),
    _TypedDict(
        "CustomChatCompletionContentSimpleImageParam",
        [("image_url", False, _optional_string), ("uuid", False, _optional_string)],
    ),
    _TypedDict(
        "ChatCompletionContentPartImageEmbedsParam",
        [("image_embeds", False, _embeds), ("type", True, _literal("image_embeds")), ("uuid", False, _optional_string)],
    ),
    _TypedDict(
        "ChatCompletionContentPartAudioEmbedsParam",
        [("audio_embeds", False, _embeds), ("type", True, _literal("audio_embeds")), ("uuid", False, _optional_string)],
    ),
    _TypedDict(
        "ChatCompletionContentPartVideoEmbedsParam",
        [
            ("video_embeds", False, _embeds),
            ("audio_embeds", False, _embeds),
            ("type", True, _literal("video_embeds")),
            ("uuid", False, _optional_string),
        ],
    ),
    _TypedDict(
        "ChatCompletionContentPartPromptEmbedsParam",
        [("data", True, _string), ("type", True, _literal("prompt_embeds"))],
    ),
    _TypedDict("CustomChatCompletionContentSimpleAudioParam", [("audio_url", False, _optional_string)]),
    _TypedDict(
        "CustomChatCompletionContentSimpleVideoParam",
        [("video_url", False, _optional_string), ("uuid", False, _optional_string)],
    ),
    _TypedDict(
        "CustomChatCompletionContentToolReferenceParam",
        [("name", False, _string), ("type", False, _literal("tool_reference"))],
    ),
    _TypedDict(
        "CustomThinkCompletionContentParam",
        [("thinking", True, _string), ("closed", False, _boolean), ("type", True, _literal("thinking"))],
    ),
)

# The part union of each OpenAI message member (by role); a single member has no name in the loc.
_ROLE_PARTS: dict[str, tuple[_TypedDict, ...]] = {
    "user": (TEXT, IMAGE, INPUT_AUDIO, FILE),
    "system": (TEXT,),
    "developer": (TEXT,),
    "tool": (TEXT,),
    "assistant": (TEXT, REFUSAL),
}


def kept_fields(part: Any) -> int:
    """The most fields any member of vLLM's part union keeps of a dict `part` (-1: none accepts it)."""
    if not isinstance(part, dict):
        return -1
    return max(member.kept_fields(part) for member in _VLLM_PARTS)


# Fields of OpenAI's message member for each role, and of vLLM's `CustomChatCompletionMessageParam`.
_OPENAI_MESSAGE_FIELDS = {
    "user": ("role", "content", "name"),
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "tool": ("role", "content", "tool_call_id"),
    "assistant": ("role", "audio", "content", "function_call", "name", "refusal", "tool_calls"),
}
_CUSTOM_MESSAGE_FIELDS = ("role", "content", "name", "tool_call_id", "tool_calls", "reasoning", "tools", "task")


def lazily_validated(message: dict[str, Any]) -> bool:
    """Whether pydantic keeps OpenAI's member for this message, so that its content parts are
    validated lazily against OpenAI's part union for the role (`check_part`).

    Both members are tried; when both validate, the one that set more fields wins (ties: OpenAI's,
    the first). OpenAI's lazy content sets nothing inside; vLLM's counts the fields its part union
    keeps of each part (a plain string sets none)."""
    role = message.get("role")
    content = message.get("content")
    if role not in _ROLE_PARTS or not isinstance(content, list):
        return False
    name = message.get("name", "")
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            return False  # OpenAI's tool member needs it
    elif not isinstance(name, str):
        return False
    if not isinstance(name, str):
        return True  # vLLM's member needs a string name
    openai_count = sum(1 for field in _OPENAI_MESSAGE_FIELDS[role] if field in message)
    custom_count = sum(1 for field in _CUSTOM_MESSAGE_FIELDS if field in message)
    for part in content:
        kept = 0 if isinstance(part, str) else kept_fields(part)
        if kept < 0:
            return True  # vLLM's member fails on this part
        custom_count += kept
    return custom_count <= openai_count


_RESPONSE_INPUT_IMAGE = _TypedDict(
    "ResponseInputImageParam",
    [
        ("detail", True, _literal("low", "high", "auto", "original")),
        ("type", True, _literal("input_image")),
        ("file_id", False, _optional_string),
        ("image_url", False, _optional_string),
        ("prompt_cache_breakpoint", False, _CACHE_BREAKPOINT),
    ],
)
# The parts vLLM's MM_PARSER_MAP validates with a pydantic TypeAdapter before using them.
_MEDIA_PARTS = {
    "image_url": IMAGE,
    "audio_url": _VLLM_PARTS[4],
    "video_url": _VLLM_PARTS[5],
    "input_image": _RESPONSE_INPUT_IMAGE,
}


def check_media_part(part_type: str, part: dict[str, Any]) -> None:
    """vLLM's `TypeAdapter(...).validate_python(part)` for an image, audio or video URL part."""
    member = _MEDIA_PARTS.get(part_type)
    if member is None:
        return
    errors = [(".".join(loc), kind, msg, value) for loc, kind, msg, value in member.errors(part)]
    if errors:
        raise BadRequestError(_pydantic_message(errors, member.name))


def check_part(role: str, index: int, part: Any) -> None:
    """The lazy validation of part `index` against OpenAI's part union for `role`."""
    members = _ROLE_PARTS[role]
    errors: list[tuple[str, str, str, Any]] = []
    for member in members:
        prefix = (str(index),) if len(members) == 1 else (str(index), member.name)
        for loc, kind, msg, value in member.errors(part):
            errors.append((".".join((*prefix, *loc)), kind, msg, value))
    if errors:
        raise BadRequestError(_pydantic_message(errors))


def _pydantic_message(errors: list[tuple[str, str, str, Any]], title: str = "ValidatorIterator") -> str:
    count = len(errors)
    lines = [f"{count} validation error{'s' if count != 1 else ''} for {title}"]
    for loc, kind, msg, value in errors:
        lines.append(loc)
        lines.append(f"  {msg} [type={kind}, input_value={_repr(value)}, input_type={type(value).__name__}]")
        lines.append(f"    For further information visit {_PYDANTIC_DOCS}{kind}")
    return "\n".join(lines)


def _repr(value: Any) -> str:
    """pydantic-core's input repr: Python's repr, long ones cut to 25 + '...' + 24 characters."""
    text = repr(value)
    return text if len(text) <= 50 else f"{text[:25]}...{text[-24:]}"


def check_messages(messages: list[dict[str, Any]]) -> None:
    """The content parts of a chat request's messages as vLLM's schema validates them when its
    renderer iterates them (`/v1/chat/completions/render`, `/tokenize`); converted requests
    (Messages, Responses) build their parts themselves and are not checked."""
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        lazy = lazily_validated(message)
        for index, part in enumerate(message["content"]):
            if lazy:
                check_part(message["role"], index, part)
            if isinstance(part, dict) and part.get("uuid") is None and isinstance(part.get("type"), str):
                check_media_part(part["type"], part if lazy else _as_kept(part))


def _as_kept(part: dict[str, Any]) -> dict[str, Any]:
    """A part as vLLM's own member hands it on: the fields of the union member that kept the most
    first (pydantic builds the dict from that member's declaration), then the others."""
    best = max(_VLLM_PARTS, key=lambda member: member.kept_fields(part))
    declared = [field for field, _, _ in best.fields if field in part]
    return {**{field: part[field] for field in declared}, **{k: v for k, v in part.items() if k not in declared}}
