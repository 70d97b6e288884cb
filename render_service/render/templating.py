"""Message normalisation and chat-template rendering with vLLM's and HF's semantics.

The conversation is normalised as vLLM's `parse_chat_messages` does for text requests
(content parts joined with "\\n" for "string" templates, wrapped dicts for "openai" ones,
assistant tool-call arguments parsed to objects), then rendered by transformers'
`apply_chat_template` with the kwargs vLLM lets through. Templates compile once
(transformers caches the compiled template by its text).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeVar, cast

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
import orjson

from render_service.api.protocol import handler_error
from render_service.exceptions import BadRequestError, TemplateTimeoutError

logger = logging.getLogger("render_service.render.templating")

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
_TEXT_KEY = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
# Fields of the OpenAI content-part TypedDicts; anything else rides along in "openai" format.
_KNOWN_PART_FIELDS = frozenset(
    {
        "type",
        "text",
        "refusal",
        "thinking",
        "image_url",
        "input_audio",
        "audio_url",
        "video_url",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "image_pil",
        "uuid",
        "data",
        "name",
        "detail",
        "file_id",
        "signature",
    }
)
_MEDIA_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "image_pil",
        "audio_url",
        "input_audio",
        "video_url",
        "prompt_embeds",
    }
)
# The parameters of HF's `apply_chat_template`: always accepted as template kwargs.
_HF_BASE_PARAMS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
_UNEXPECTED_KWARGS = frozenset({"chat_template", "tokenize"})
_CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"


_EMBEDS_TYPES = frozenset({"image_embeds", "audio_embeds", "video_embeds"})
# vLLM skips these part types when their text is null; the other text types pass null on.
_SKIP_NONE_TEXT_TYPES = frozenset({"text", "refusal"})


class UnsupportedContentError(BadRequestError):
    """A content part this text-only render path cannot turn into a prompt."""


# -- content format detection (a port of vLLM renderers/hf.py, Apache-2.0) -------------------


def _is_var_access(node: jinja2.nodes.Node, varname: str) -> bool:
    if isinstance(node, jinja2.nodes.Name):
        return node.ctx == "load" and node.name == varname
    if isinstance(node, jinja2.nodes.Getattr) and "." in varname:
        base, _, attr = varname.rpartition(".")
        return node.attr == attr and _is_var_access(node.node, base)
    return False


def _is_attr_access(node: jinja2.nodes.Node, varname: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node: jinja2.nodes.Node, varname: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _attr_dotted_name(node: jinja2.nodes.Node) -> str | None:
    if isinstance(node, jinja2.nodes.NSRef):
        return f"{node.name}.{node.attr}"
    parts = []
    while isinstance(node, jinja2.nodes.Getattr):
        parts.append(node.attr)
        node = node.node
    if isinstance(node, jinja2.nodes.Name):
        parts.append(node.name)
        return ".".join(reversed(parts))
    return None


def _iter_assign_var_or_elems(root: jinja2.nodes.Node, varname: str):
    yield root, varname
    seen = {varname}
    related = deque([varname])
    while related:
        name = related.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            lhs, rhs = assign.target, assign.node
            if isinstance(lhs, jinja2.nodes.Name) and _is_var_or_elems_access(rhs, name):
                yield assign, lhs.name
                if lhs.name != name and lhs.name not in seen:
                    seen.add(lhs.name)
                    related.append(lhs.name)
            aliases: list[str] = []
            if (
                isinstance(lhs, jinja2.nodes.Name)
                and isinstance(rhs, jinja2.nodes.Call)
                and isinstance(rhs.node, jinja2.nodes.Name)
                and rhs.node.name == "namespace"
            ):
                aliases = [f"{lhs.name}.{kw.key}" for kw in rhs.kwargs if _is_var_or_elems_access(kw.value, name)]
            elif isinstance(lhs, (jinja2.nodes.Getattr, jinja2.nodes.NSRef)) and _is_var_or_elems_access(rhs, name):
                dotted = _attr_dotted_name(lhs)
                aliases = [dotted] if dotted is not None else []
            for alias in aliases:
                yield assign, alias
                if alias != name and alias not in seen:
                    seen.add(alias)
                    related.append(alias)


def _iter_assign_messages_item(root: jinja2.nodes.Node):
    names = [name for _, name in _iter_assign_var_or_elems(root, "messages")]
    for loop in root.find_all(jinja2.nodes.For):
        for name in names:
            if _is_var_or_elems_access(loop.iter, name):
                yield loop, cast(jinja2.nodes.Name, loop.target).name
                break


def _iter_assign_content_item(root: jinja2.nodes.Node):
    message_names = [name for _, name in _iter_assign_messages_item(root)]
    macro_params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name:
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and any(_is_var_or_elems_access(arg, n, "content") for n in message_names):
                        content_params.add(macro.args[i].name)
                for kw in call.kwargs:
                    if kw.key in param_names and any(
                        _is_var_or_elems_access(kw.value, n, "content") for n in message_names
                    ):
                        content_params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            loops_in_macros.add(id(loop))
            if content_params:
                macro_params_by_loop[id(loop)] = content_params
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems_access(loop.iter, n, "content") for n in message_names):
            yield loop, cast(jinja2.nodes.Name, loop.target).name
            continue
        params = macro_params_by_loop.get(id(loop))
        if isinstance(loop.iter, jinja2.nodes.Name) and params is not None and loop.iter.name in params:
            yield loop, cast(jinja2.nodes.Name, loop.target).name
            continue
        if id(loop) not in loops_in_macros and isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
            yield loop, cast(jinja2.nodes.Name, loop.target).name


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )


class _GenerationTag(jinja2.ext.Extension):
    """HF's `{% generation %}` block, needed only to parse templates that use it."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it as a plain set attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

    def _support(self, caller: Any) -> str:
        return caller()


@lru_cache(maxsize=32)
def detect_content_format(chat_template: str) -> str:
    try:
        ast = _environment().parse(chat_template)
    except Exception:
        return "string"
    try:
        next(_iter_assign_content_item(ast))
    except StopIteration:
        return "string"
    except Exception:
        return "string"
    return "openai"


@lru_cache(maxsize=32)
def template_variables(chat_template: str) -> frozenset[str]:
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(chat_template)))


def supports_developer_role(chat_template: str) -> bool:
    return '"developer"' in chat_template or "'developer'" in chat_template


# -- conversation ---------------------------------------------------------------------------


def has_non_text_content(messages: Any) -> bool:
    """Whether any message carries media (then forwarded prompt ids are ignored)."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and (part.get("type") in _MEDIA_TYPES or _MEDIA_TYPES & part.keys()):
                    return True
    return False


def _part_text(part: Any) -> tuple[str, Any]:
    """(part_type, content) as vLLM's `parse_chat_message_content_mm_part` returns them."""
    if isinstance(part, str):
        return "text", part
    if not isinstance(part, dict):
        raise handler_error("Invalid 'type' field in multimodal part.", "type")
    part_type = part.get("type")
    if isinstance(part_type, str) and part_type in _TEXT_KEY and part.get("uuid") is None:
        return part_type, part.get(_TEXT_KEY[part_type])
    if part_type is None or part.get("uuid") is not None:
        for key in (
            "image_url",
            "image_pil",
            "image_embeds",
            "audio_embeds",
            "video_embeds",
            "prompt_embeds",
            "audio_url",
            "input_audio",
            "video_url",
            "tool_reference",
        ):
            if key in part:
                return key, None
        raise handler_error("Missing 'type' field in multimodal part.", "type")
    if not isinstance(part_type, str):
        raise handler_error("Invalid 'type' field in multimodal part.", "type")
    return part_type, None


class MediaCollector:
    """Collects the image parts of a conversation, in order, for a model with an image processor.

    `placeholder` is the model's image placeholder text (what vLLM's "string" content format
    puts in front of the text); in "openai" format the template gets `{"type": "image"}`.
    """

    def __init__(self, placeholder: str, model_name: str) -> None:
        self.placeholder = placeholder
        self.model_name = model_name
        self.image_urls: list[str] = []

    def add(self, part_type: str, part: dict[str, Any]) -> None:
        if part_type in ("image_embeds", "audio_embeds", "video_embeds"):
            # vLLM's answer without --enable-mm-embeds (its default; this service has no embeds input)
            raise handler_error(f"You must set `--enable-mm-embeds` to input `{part_type}`", part_type)
        if part_type not in ("image_url", "input_image"):
            raise UnsupportedContentError(
                f"{part_type} content is not supported by this render tier for {self.model_name} "
                "(image_url images only).",
                param="messages",
            )
        value = part.get("image_url")
        if isinstance(value, dict):
            value = value.get("url")
        if not isinstance(value, str):
            raise handler_error("image_url part must carry a URL string.", "messages")
        self.image_urls.append(value)


def _joinable_text(value: Any, position: int) -> bool:
    """Whether a text-like part's value joins a "string"-format message: vLLM drops empty and null
    values (its `if parse_res`), and `"\\n".join` fails on anything but a string (a TypeError vLLM
    answers with a 400 carrying its text)."""
    if isinstance(value, str):
        return bool(value)
    if value is None:
        return False
    raise BadRequestError(_join_type_error(position, value))


def _join_type_error(position: int, value: Any) -> str:
    return f"sequence item {position}: expected str instance, {type(value).__name__} found"


def _parse_content(
    content: Any, role: str, wrap_dicts: bool, media: MediaCollector | None = None, model_name: str = "model"
) -> Any:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = list(content)
    if role == "system":
        parts = _strip_billing_header(parts)
    out: list[Any] = []
    images = 0
    for part in parts:
        part_type, text = _part_text(part)
        if part_type in TEXT_PART_TYPES or isinstance(part, str):
            if text is None and part_type in _SKIP_NONE_TEXT_TYPES:
                continue
            if wrap_dicts:
                item: dict[str, Any] = {"type": "text", "text": text}
                if isinstance(part, dict):
                    item.update({k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS})
                out.append(item)
            elif _joinable_text(text, len(out)):
                out.append(text)
        elif part_type == "tool_reference":
            name = part.get("name")
            if wrap_dicts:
                out.append({"type": "tool_reference", "name": name})
            elif _joinable_text(name, len(out)):
                out.append(name)
        elif part_type == "prompt_embeds" and not part.get("data"):
            raise handler_error(
                "prompt_embeds content part requires a non-empty `data` field with base64-encoded tensor bytes.",
                "prompt_embeds",
            )
        elif part_type in _MEDIA_TYPES and media is not None:
            media.add(part_type, part)
            images += 1
            if wrap_dicts:
                image: dict[str, Any] = {"type": "image"}
                image.update({k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS})
                out.append(image)
        elif part_type in _EMBEDS_TYPES:
            # vLLM's embeds parsers ask the model config for its multimodal config first.
            raise UnsupportedContentError("The model is not multimodal.")
        elif part_type in _MEDIA_TYPES:
            # vLLM's text-only models fail in MULTIMODAL_REGISTRY.create_processor; so does this build.
            raise UnsupportedContentError(f"{model_name} is not a multimodal model")
        else:
            supported = sorted(_MEDIA_TYPES | TEXT_PART_TYPES | {"tool_reference"})
            raise handler_error(
                f"Unsupported chat content part type: {part_type!r}. Supported types: {', '.join(supported)}.",
                "type",
                part_type,
            )
    if wrap_dicts:
        return out
    text = "\n".join(out)
    if images and media is not None:
        # vLLM's get_full_multimodal_text_prompt: placeholders the text lacks go in front.
        missing = images - text.count(media.placeholder)
        if missing < 0:
            raise handler_error(
                "Found more image placeholders in input prompt than actual multimodal data items.", "messages"
            )
        return "\n".join([media.placeholder] * missing + [text])
    return text


def _join_texts(texts: list[Any]) -> str:
    """Text parts merged into one string (tool results, merged system messages), failing on a part
    whose text is not a string (e.g. a null `thinking`) as vLLM's join does: a 400 with its text."""
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequestError(_join_type_error(position, text))
    return "\n".join(texts)


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    out = []
    for part in parts:
        text = (
            part
            if isinstance(part, str)
            else part.get("text")
            if (isinstance(part, dict) and part.get("type") == "text")
            else None
        )
        if not (isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def build_conversation(
    messages: list[dict[str, Any]],
    content_format: str,
    media: MediaCollector | None = None,
    *,
    model_name: str = "model",
) -> list[dict[str, Any]]:
    """vLLM's `parse_chat_messages` + `_postprocess_messages`; media parts go to `media`; without one
    (a text-only model) they are a 400 naming `model_name` (the first served name), as in vLLM."""
    wrap = content_format == "openai"
    conversation = []
    for message in messages:
        role = message["role"]
        entry: dict[str, Any] = {
            "role": role,
            "content": _parse_content(message.get("content"), role, wrap, media, model_name),
        }
        if role == "assistant":
            tool_calls = message.get("tool_calls")
            if tool_calls is not None:
                entry["tool_calls"] = [dict(call) if isinstance(call, dict) else call for call in tool_calls]
            reasoning = message.get("reasoning")
            if reasoning is None:
                reasoning = message.get("reasoning_content")
            if reasoning is not None:
                entry["reasoning"] = reasoning
                entry["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in message:
                entry["tool_call_id"] = message["tool_call_id"]
            content = entry["content"]
            if isinstance(content, list):
                if any(isinstance(i, dict) and i.get("type") != "text" for i in content):
                    pass
                else:
                    texts = [i.get("text", "") for i in content if isinstance(i, dict) and i.get("type") == "text"]
                    entry["content"] = _join_texts(texts) if texts else ""
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        if isinstance(message.get("task"), str):
            entry["task"] = message["task"]
        if role == "developer":
            entry["tools"] = message.get("tools")
        conversation.append(entry)
    _postprocess_tool_calls(conversation)
    return conversation


def _postprocess_tool_calls(conversation: list[dict[str, Any]]) -> None:
    """Tool-call arguments become objects, as HF templates expect them."""
    for message in conversation:
        if message["role"] != "assistant" or "tool_calls" not in message:
            continue
        tool_calls = message["tool_calls"]
        if not isinstance(tool_calls, list):
            continue
        if not tool_calls:
            message.pop("tool_calls")
            continue
        for index, item in enumerate(tool_calls):
            if not isinstance(item, dict):
                raise handler_error("assistant tool_calls entries must be objects.", "tool_calls")
            function = item.get("function")
            if item.get("type", "function") != "function" or not isinstance(function, dict):
                raise handler_error(
                    "chat completions only support assistant tool_calls of type 'function'.", "tool_calls"
                )
            function = dict(function)
            item["function"] = function
            tool_calls[index] = item
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
                continue
            if isinstance(arguments, dict):
                continue
            parsed: Any = None
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    logger.warning(
                        "Tool call has arguments that are not valid JSON (%d chars); coercing to an empty object.",
                        len(arguments),
                    )
            else:
                parsed = arguments
            function["arguments"] = parsed if isinstance(parsed, dict) else {}


def _convert_developer(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    converted = []
    for msg in conversation:
        if msg["role"] == "developer":
            msg = {k: v for k, v in msg.items() if k != "tools"}
            msg["role"] = "system"
        converted.append(msg)
    system_contents: list[str] = []
    rest = []
    needs = False
    for index, msg in enumerate(converted):
        if msg["role"] == "system":
            if index > 0 or system_contents:
                needs = True
            content = msg.get("content", "")
            if isinstance(content, list):
                content = _join_texts(
                    [
                        p["text"] if isinstance(p, dict) else p
                        for p in content
                        if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
                    ]
                )
            if content:
                system_contents.append(content)
        else:
            rest.append(msg)
    if not needs:
        return converted
    return [{"role": "system", "content": "\n\n".join(system_contents)}, *rest]


def resolve_template_kwargs(chat_template: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `resolve_chat_template_kwargs`: only what the template or HF accepts gets through."""
    unexpected = _UNEXPECTED_KWARGS & kwargs.keys()
    if unexpected:
        raise handler_error(f"Found unexpected chat template kwargs from request: {set(unexpected)}")
    accepted = (template_variables(chat_template) | _HF_BASE_PARAMS) - _UNEXPECTED_KWARGS
    return {k: v for k, v in kwargs.items() if k in accepted}


def render_prompt(
    hf_tokenizer: Any,
    chat_template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    """The prompt text, exactly as `tokenizer.apply_chat_template(tokenize=False)` renders it.

    minijinja renders it when this template passed the start-up parity check against jinja2
    (2-6x faster); jinja2, through transformers, is the reference and renders everything else,
    including any request minijinja fails on (so errors read exactly as HF's). Either way the
    render stops at vLLM's time limit (`VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT`) with a 504.
    """
    return WATCHDOG.run(_render_prompt, hf_tokenizer, chat_template, conversation, tools, kwargs)


def render_template(
    hf_tokenizer: Any,
    chat_template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    """The template rendered as a bare `tokenizer.apply_chat_template(tokenize=False)` renders it:
    no developer-role folding and no kwarg filtering (those are vLLM's HF renderer's). For
    renderers that hand the conversation to the tokenizer themselves (Kimi K3)."""
    return WATCHDOG.run(_render_template, hf_tokenizer, chat_template, conversation, tools, kwargs)


def _render_template(
    hf_tokenizer: Any,
    chat_template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    fast = fast_template(chat_template, _special_tokens(hf_tokenizer))
    if fast is not None and not kwargs.get("continue_final_message"):
        try:
            return fast.render(conversation, tools, kwargs)
        except Exception:  # the reference renderer gives HF's exact result or error
            pass
    return _reference_render(hf_tokenizer, chat_template, conversation, tools, kwargs)


def _render_prompt(
    hf_tokenizer: Any,
    chat_template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    if any(m["role"] == "developer" for m in conversation) and not supports_developer_role(chat_template):
        conversation = _convert_developer(conversation)
    resolved = resolve_template_kwargs(chat_template, kwargs)
    resolved.pop("return_dict", None)
    fast = fast_template(chat_template, _special_tokens(hf_tokenizer))
    if fast is not None and not resolved.get("continue_final_message"):
        try:
            return fast.render(conversation, tools, resolved)
        except Exception:  # the reference renderer gives HF's exact result or error
            pass
    return _reference_render(hf_tokenizer, chat_template, conversation, tools, resolved)


def _reference_render(
    hf_tokenizer: Any,
    chat_template: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    resolved: dict[str, Any],
) -> str:
    try:
        return hf_tokenizer.apply_chat_template(
            conversation, tools=tools, chat_template=chat_template, tokenize=False, **resolved
        )
    except jinja2.TemplateError as exc:
        raise handler_error(str(exc)) from exc
    except Exception as exc:
        reason = _template_error_reason(exc)
        raise handler_error(reason) from exc


# -- the render time limit ----------------------------------------------------------------------

_T = TypeVar("_T")


class _RenderDeadline(BaseException):
    """Raised inside a render by the watchdog. A BaseException, so that no `except Exception` in
    jinja2, transformers or a template's own code swallows it."""


class RenderWatchdog:
    """Stops a chat-template render that runs past its deadline, in the thread that runs it.

    A render runs inline on the worker's event loop (it costs 0.05-2 ms; handing it to a thread
    would cost about as much), so a runaway template (a loop over loops, a quadratic template on a
    huge conversation) would hold the worker. One watchdog thread per process checks the renders in
    progress and raises `_RenderDeadline` inside a late one (`PyThreadState_SetAsyncExc`, delivered
    between two bytecodes of the template's compiled Python). Unlike vLLM, which abandons the stuck
    thread ("may continue consuming CPU until the process exits"), the render really stops.
    The normal path costs one lock round trip. Not interruptible: one long C call (e.g. a
    multi-GB string repetition); minijinja renders are bounded by their fuel instead.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._active: dict[int, list[Any]] = {}  # thread id -> [deadline, fired at]
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        timeout = self.timeout
        if timeout <= 0:
            return fn(*args)
        ident = threading.get_ident()
        entry = [time.monotonic() + timeout, 0.0]
        with self._lock:
            self._active[ident] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="render-watchdog", daemon=True)
                self._thread.start()
        try:
            try:
                return fn(*args)
            finally:
                self._disarm(ident, entry)
        except _RenderDeadline:
            self._disarm(ident, entry)  # in case it landed inside the first disarm
            logger.warning("chat template render stopped after %.1fs (VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT)", timeout)
            raise TemplateTimeoutError(
                f"Chat template rendering timed out after {timeout}s. This may indicate a malicious or "
                "excessively complex template. Adjust VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT to override."
            ) from None

    def _disarm(self, ident: int, entry: list[Any]) -> None:
        with self._lock:
            if self._active.get(ident) is entry:
                del self._active[ident]
            if entry[1]:
                # A deadline raised after the render returned must not escape elsewhere.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, max(0.01, self.timeout / 10)))
            now = time.monotonic()
            with self._lock:
                for ident, entry in self._active.items():
                    # Fire at the deadline, and again each second if the first one was swallowed.
                    if now >= entry[0] and now - entry[1] >= 1.0:
                        entry[1] = now
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(ident), ctypes.py_object(_RenderDeadline)
                        )


def _render_timeout() -> float:
    try:
        return float(os.environ.get("VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT", "30"))
    except ValueError:
        return 30.0


WATCHDOG = RenderWatchdog(_render_timeout())


def _special_tokens(hf_tokenizer: Any) -> tuple[tuple[str, Any], ...]:
    cached = getattr(hf_tokenizer, "_render_special_tokens", None)
    if cached is None:
        cached = tuple((k, v if isinstance(v, str) else tuple(v)) for k, v in hf_tokenizer.special_tokens_map.items())
        hf_tokenizer._render_special_tokens = cached
    return cached


class FastTemplate:
    """A chat template compiled with minijinja, with HF's globals and `tojson`."""

    # Bounds the work of one render (minijinja's fuel: instructions executed).
    FUEL = 50_000_000

    def __init__(self, chat_template: str, special_tokens: dict[str, Any]) -> None:
        import minijinja

        env = minijinja.Environment()
        env.trim_blocks = True
        env.lstrip_blocks = True
        env.keep_trailing_newline = True
        env.pycompat = True
        env.fuel = self.FUEL
        env.add_filter("tojson", _hf_tojson)
        # minijinja-py has add_function; its stubs do not declare it
        env.add_function("raise_exception", _raise_template_error)  # type: ignore[attr-defined]
        env.add_function("strftime_now", _strftime_now)  # type: ignore[attr-defined]
        env.add_template("chat", chat_template)
        self._env = env
        self._special = dict(special_tokens)

    def render(
        self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> str:
        # What transformers' render_jinja_template passes: special tokens, kwargs, and the
        # conversation; `continue_final_message` is consumed there, never a template variable.
        variables = {**self._special, **kwargs}
        variables.pop("continue_final_message", None)
        variables.update(
            messages=conversation,
            tools=tools,
            documents=kwargs.get("documents"),
            add_generation_prompt=kwargs.get("add_generation_prompt", False),
        )
        return self._env.render_template("chat", **variables)


# HF's `tojson` with its defaults, built once (json.dumps builds an encoder per call for non-default options).
_TOJSON = json.JSONEncoder(ensure_ascii=False)
# Objects (tool definitions, above all: every render writes them all) by their orjson encoding, which
# tells apart every two JSON values that json.dumps writes differently; ~10x cheaper than json.dumps.
_TOJSON_MEMO: dict[bytes, str] = {}
_TOJSON_MEMO_ENTRIES = 1024


# The tool definitions `SharedTools` hands out, by identity: their text without even the orjson key.
# Each entry keeps its object, so its id cannot be reused while it is here.
_TOJSON_BY_ID: dict[int, tuple[Any, str]] = {}


def _hf_tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    if ensure_ascii or indent is not None or separators is not None or sort_keys:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    shared = _TOJSON_BY_ID.get(id(value))
    if shared is not None and shared[0] is value:
        return shared[1]
    if type(value) is not dict:
        return _TOJSON.encode(value)
    try:
        key = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # non-string keys, big ints, lone surrogates: no memo
        return _TOJSON.encode(value)
    if b"null" in key:  # orjson writes NaN and infinities as null, json.dumps does not: no memo
        return _TOJSON.encode(value)
    text = _TOJSON_MEMO.get(key)
    if text is None:
        text = _TOJSON.encode(value)
        if len(_TOJSON_MEMO) >= _TOJSON_MEMO_ENTRIES:
            _TOJSON_MEMO.clear()
        _TOJSON_MEMO[key] = text
    return text


# A null value in orjson's compact output (a string holding "null" has quotes around it; one holding
# ":null," only costs the sharing).
_NULL_LITERAL = re.compile(rb"[:\[,]null[,\]}]")


def _has_null_literal(key: bytes) -> bool:
    """`_NULL_LITERAL.search(key)`, by memchr-speed `find` (re scans 13 KB of tools in ~100 µs)."""
    at = key.find(b"null")
    while at >= 0:
        if at > 0 and key[at - 1] in b":[," and key[at + 4 : at + 5] in (b",", b"]", b"}"):
            return True
        at = key.find(b"null", at + 4)
    return False


class SharedTools:
    """A request's dumped tool definitions, shared with earlier requests that sent the same tools.

    An agent sends the same tools every turn, and every render writes each of them with `tojson`:
    a list seen before (same orjson encoding, which tells apart every two JSON values that
    json.dumps writes differently) comes back as the same dict objects, whose `tojson` text is then
    found by identity. Shared objects are read-only by contract: only the chat render uses them (the
    template, the prompt fingerprint, `parse_context`), none of which writes to them.
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self._lists: OrderedDict[bytes, list[dict[str, Any]]] = OrderedDict()
        # id(first dict of a shared list) -> (that list, its orjson encoding), for `encoding`.
        self._encodings: dict[int, tuple[list[dict[str, Any]], bytes]] = {}
        # key_of(tools) -> the tool names, for tool lists that passed request validation unchanged.
        self._validated: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key_of(tools: Any) -> bytes | None:
        """The bytes that tell `tools` apart from every other JSON value (None: a value they cannot:
        no list, empty, not encodable, or a null that may have been NaN; see _hf_tojson)."""
        if not isinstance(tools, list) or not tools:
            return None
        try:
            key = orjson.dumps(tools)
        except (TypeError, orjson.JSONEncodeError):
            return None
        return None if _has_null_literal(key) else key

    def validated_names(self, key: bytes) -> tuple[str, ...] | None:
        """The names of the tools encoded as `key`, when such a list passed request validation
        unchanged before (validation is a function of the JSON value: it would pass again)."""
        with self._lock:
            return self._validated.get(key)

    def remember_validated(self, key: bytes, tools: list[dict[str, Any]]) -> None:
        """`tools` (encoded as `key`) passed request validation and came out unchanged."""
        names = tuple(tool["function"]["name"] for tool in tools)
        with self._lock:
            self._validated[key] = names
            while len(self._validated) > self.max_entries:
                self._validated.popitem(last=False)

    def get(
        self, tools: Any, dump: Callable[[Any], list[dict[str, Any]] | None], key: bytes | None = None
    ) -> list[dict[str, Any]] | None:
        """`dump(tools)`, or the list it returned for the same tools before (a new list object
        holding the same dicts). `key`: `key_of(tools)` when the caller has it."""
        if key is None:
            key = self.key_of(tools)
        if key is None:
            return dump(tools)
        with self._lock:
            shared = self._lists.get(key)
            if shared is not None:
                self._lists.move_to_end(key)
                return list(shared)
        dumped = dump(tools)
        if dumped is None or any(type(tool) is not dict for tool in dumped):
            return dumped
        texts = [_TOJSON.encode(tool) for tool in dumped]
        encoding = orjson.dumps(dumped)
        with self._lock:
            if key not in self._lists:
                self._lists[key] = dumped
                for tool, text in zip(dumped, texts, strict=True):
                    _TOJSON_BY_ID[id(tool)] = (tool, text)
                self._encodings[id(dumped[0])] = (dumped, encoding)
                while len(self._lists) > self.max_entries:
                    _, evicted = self._lists.popitem(last=False)
                    for tool in evicted:
                        _TOJSON_BY_ID.pop(id(tool), None)
                    self._encodings.pop(id(evicted[0]), None)
        return list(dumped)

    def encoding(self, tools: Any) -> bytes:
        """`orjson.dumps(tools)`; kept for a list `get` returned (the same dicts, read-only by
        contract), so the prompt fingerprint does not encode the same tools on every turn."""
        if isinstance(tools, list) and tools:
            with self._lock:
                shared = self._encodings.get(id(tools[0]))
            if shared is not None:
                kept, encoding = shared
                if len(kept) == len(tools) and all(a is b for a, b in zip(kept, tools, strict=True)):
                    return encoding
        return orjson.dumps(tools)


SHARED_TOOLS = SharedTools()


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(fmt)


_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <for> a city & 'place'",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Paris, 东京"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
_PROBES: tuple[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]], ...] = (
    ([{"role": "user", "content": "Hello!"}], None, {"add_generation_prompt": True}),
    (
        [{"role": "system", "content": "Be brief.\n"}, {"role": "user", "content": "  spaced  \n\n"}],
        None,
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    (
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "Weather? 🌦️"},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "think\nmore",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": '{"t": 21}'},
            {"role": "assistant", "content": "<think>\nold\n</think>\n\nIt is sunny."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        _PROBE_TOOLS,
        {"add_generation_prompt": True},
    ),
    (
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        _PROBE_TOOLS,
        {"add_generation_prompt": False},
    ),
)


@lru_cache(maxsize=32)
def fast_template(chat_template: str, special_tokens: tuple[tuple[str, Any], ...]) -> FastTemplate | None:
    """The minijinja version of a template, only if it renders every probe exactly as jinja2 does."""
    try:
        fast = FastTemplate(chat_template, dict(special_tokens))
    except Exception as exc:
        logger.info("chat template not supported by minijinja (%s); rendering with jinja2", exc)
        return None
    from transformers.utils.chat_template_utils import render_jinja_template

    variables = template_variables(chat_template)
    for conversation, tools, kwargs in _PROBES:
        kwargs = {k: v for k, v in kwargs.items() if k in variables or k in _HF_BASE_PARAMS}
        try:
            expected = render_jinja_template(
                conversations=[conversation],
                tools=cast(Any, tools),
                chat_template=chat_template,
                **{**dict(special_tokens), **kwargs},
            )[0][0]
        except Exception:
            continue  # the template rejects this probe; nothing to compare
        try:
            got = fast.render(conversation, tools, kwargs)
        except Exception as exc:
            logger.info("minijinja fails on a probe (%s); rendering with jinja2", exc)
            return None
        if got != expected:
            logger.info("minijinja output differs from jinja2 on a probe; rendering with jinja2")
            return None
    return fast


def _template_error_reason(exc: BaseException) -> str:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, jinja2.TemplateError):
            return str(current)
        current = current.__cause__ or current.__context__
    return str(exc)
