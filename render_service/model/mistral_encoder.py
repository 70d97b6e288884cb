"""Our own chat encoder for the common Mistral request shapes (Tekken v7, v11, v13).

mistral-common turns an OpenAI chat into ids in four passes over pydantic models (convert the
dicts, validate the request, normalize it, encode each message), and most of a render's CPU is
spent building and checking those models, not tokenizing. For the shapes most requests have
(string contents, reasoning history on v13, tool calls with string arguments, tool results,
system/developer messages) this module writes the same ids straight from the dicts, with the
library's rules replayed as plain Python:

- the validator (test mode, as vLLM loads it): message order, the last message, one message
  alone, tool-call/tool-result bookkeeping (counts for v7, id sets for v11+), tool-call and
  tool-result ids (9 alphanumerics for v7/v11, non-empty and not "null" for v13), function and
  tool names; the tools themselves go through the library's own (memoized) checks;
- the normalizer: tool-call arguments re-dumped as JSON, `reasoning` as a closed think chunk
  first, v11+'s reordering of tool results by their calls' order;
- the v7/v11/v13 message encoders (`[AVAILABLE_TOOLS]` at the last user message before v13 and
  the first from v13, `[TOOL_CALLS]` as a JSON list for v7 and `name[CALL_ID]id[ARGS]` /
  `name[ARGS]` from v11/v13, `[TOOL_CONTENT]` with the call id before v13, `[THINK]` on v13).

It fails closed: any shape it does not know (content parts, consecutive user or assistant
messages, which the normalizer merges, anything the library would reject, truncation, other
versions or encoders) makes `encode` return None and the caller renders through mistral-common,
which gives the ids or the error. tests/model/test_mistral_encoder.py checks it against the
library on generated conversations for each fixture version.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import orjson

# The validator's patterns, used with `re.match` as it uses them (so `$` also matches before a
# trailing newline, exactly as in the library).
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CALL_ID_RE = re.compile(r"^[a-zA-Z0-9]{9}$")
_NULL_ID = "null"

# Roles, as small ints (the validator's order table below).
_SYSTEM, _USER, _ASSISTANT, _TOOL = 0, 1, 2, 3
_ROLES = {"system": _SYSTEM, "developer": _SYSTEM, "user": _USER, "assistant": _ASSISTANT, "tool": _TOOL}
# `_validate_message_order`: the roles that may not follow each role.
_BAD_NEXT = {_SYSTEM: (_TOOL,), _USER: (_TOOL,), _ASSISTANT: (_SYSTEM,), _TOOL: (_SYSTEM,)}

# Texts at least this long have their ids kept (chat history repeats from request to request);
# shorter ones cost less to encode than to look up and keep.
TEXT_CACHE_MIN_CHARS = 64
TEXT_CACHE_MAX_IDS = 1_000_000  # ~40 bytes an id (list slot and int object): ~40 MiB at most
# Hashes of texts seen once (a text's ids are kept when it comes again).
SEEN_TEXTS = 1 << 16
# Tool lists kept with their `[AVAILABLE_TOOLS]` block, by their JSON (at most this long).
TOOLS_BLOCKS = 256
TOOLS_BLOCK_MAX_KEY = 1 << 20
# Tool-call groups kept with their ids (by (id, name, arguments) of each call).
CALLS_CACHE_ENTRIES = 4096


class Unsupported(Exception):
    """A shape this encoder does not render (the library renders it, or rejects it)."""


def _tool_args(arguments: str) -> Any:
    """The normalizer's `_normalize_json_content` then the encoder's `_parse_json_content`."""
    if not arguments:
        normalized = "{}"
    else:
        try:
            normalized = json.dumps(json.loads(arguments), ensure_ascii=False)
        except json.JSONDecodeError:
            normalized = arguments
    try:
        return json.loads(normalized)
    except json.JSONDecodeError:
        return normalized


def _text_parts(content: list[Any]) -> list[str]:
    """The texts of content parts that are all `{"type": "text", "text": str}` (mistral-common's
    text chunks); Unsupported for any other part (images, parts without a type, ...)."""
    texts = []
    for part in content:
        if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) is not str:
            raise Unsupported
        texts.append(part["text"])
    return texts


def _aggregate_contents(contents: list[Any]) -> str | list[tuple[bool, str]]:
    """`_aggregate_content_chunks_impl(contents, "\\n\\n", "\\n\\n")` over contents that are
    None, strings or [(is_think, text)] chunk lists: a string when there is no think chunk,
    else the chunks with neighbouring texts joined."""
    chunks: list[tuple[bool, str]] = []
    texts: list[str] = []
    for content in contents:
        needs_separator = bool(texts)
        if not content:
            continue
        if type(content) is str:
            texts.append("\n\n" + content if needs_separator else content)
            continue
        for is_think, text in content:
            if is_think:
                if texts:
                    chunks.append((False, "".join(texts)))
                    texts = []
                chunks.append((True, text))
            elif text:
                texts.append("\n\n" + text if texts else text)  # message and chunk joins are equal
                needs_separator = False
    if not chunks:
        return "".join(texts)
    if texts:
        chunks.append((False, "".join(texts)))
    return chunks


class MistralChatEncoder:
    """Chat ids for the request shapes above, or None (render through mistral-common).

    `tokenizer` is a `render_service.model.mistral.MistralTokenizer`; this reads its instruct
    tokenizer's special ids, its (fast) Tekken encode, and its tool conversion and checks.
    """

    def __init__(self, tokenizer: Any) -> None:
        from mistral_common.protocol.instruct.normalize import InstructRequestNormalizerV7, InstructRequestNormalizerV13
        from mistral_common.protocol.instruct.validator import (
            MistralRequestValidatorV5,
            MistralRequestValidatorV11,
            MistralRequestValidatorV13,
            ValidationMode,
        )
        from mistral_common.tokens.tokenizers.instruct import (
            InstructTokenizerV7,
            InstructTokenizerV11,
            InstructTokenizerV13,
        )

        self.tokenizer = tokenizer
        mistral = tokenizer.mistral
        instruct = tokenizer.instruct
        validator = mistral._chat_completion_request_validator
        normalizer = mistral._instruct_request_normalizer
        # The exact library classes whose rules are replayed here; anything else (a subclass, v15's
        # model settings, SentencePiece, an image or audio encoder) renders through the library.
        expected = {
            7: (InstructTokenizerV7, MistralRequestValidatorV5, InstructRequestNormalizerV7),
            11: (InstructTokenizerV11, MistralRequestValidatorV11, InstructRequestNormalizerV13),
            13: (InstructTokenizerV13, MistralRequestValidatorV13, InstructRequestNormalizerV13),
        }.get(tokenizer.version)
        self.enabled = bool(
            expected is not None
            and tokenizer.is_tekken
            and type(instruct) is expected[0]
            and type(validator) is expected[1]
            and type(normalizer) is expected[2]
            and validator.mode == ValidationMode.test
            and getattr(instruct, "image_encoder", None) is None
            and getattr(instruct, "audio_encoder", None) is None
            and getattr(tokenizer.raw, "model_settings_builder", None) is None
        )
        self.version = tokenizer.version
        self.validator = validator
        self.raw_encode: Callable[..., list[int]] = tokenizer.raw.encode
        self.bos = instruct.tokenizer.bos_id
        self.eos = instruct.tokenizer.eos_id
        self.begin_inst, self.end_inst = instruct.BEGIN_INST, instruct.END_INST
        self.tool_calls = instruct.TOOL_CALLS
        self.begin_results, self.end_results = instruct.BEGIN_TOOL_RESULTS, instruct.END_TOOL_RESULTS
        self.begin_system: Any = getattr(instruct, "BEGIN_SYSTEM", None)
        self.end_system: Any = getattr(instruct, "END_SYSTEM", None)
        self.tool_content: Any = getattr(instruct, "BEGIN_TOOL_CONTENT", None)
        self.args: Any = getattr(instruct, "ARGS", None)  # v11+
        self.call_id: Any = getattr(instruct, "CALL_ID", None)
        self.begin_think: Any = getattr(instruct, "BEGIN_THINK", None)  # None: no [THINK] (v13 only)
        self.end_think: Any = getattr(instruct, "END_THINK", None)
        # Ids of long texts (see TEXT_CACHE_MIN_CHARS), oldest dropped first once over the budget.
        self._texts: dict[str, list[int]] = {}
        self._text_ids = 0
        self._seen: dict[int, None] = {}
        self._blocks: dict[bytes, list[int]] = {}
        self._calls: dict[tuple[tuple[str, str, str], ...], list[int]] = {}
        self._lock = threading.Lock()

    # -- text ids ----------------------------------------------------------------------------

    def text(self, text: str) -> list[int]:
        """`Tekkenizer.encode(text, bos=False, eos=False)`: each message text is encoded alone by
        the library too, so the ids of a text are the same wherever it appears. A text's ids are
        kept the second time it is seen (chat history is sent again every turn): keeping every
        text would make the garbage collector walk the ids of texts never seen again, which
        costs fresh conversations more than the cache saves. The kept lists are never changed
        (callers copy them into the prompt)."""
        if len(text) < TEXT_CACHE_MIN_CHARS:
            return self.raw_encode(text, False, False)
        found = self._texts.get(text)
        if found is not None:
            return found
        ids = self.raw_encode(text, False, False)
        digest = hash(text)  # computed by the lookup above already
        seen = self._seen
        if digest not in seen:
            seen[digest] = None  # ints only: the collector leaves this dict alone
            if len(seen) > SEEN_TEXTS:
                with self._lock:
                    while len(seen) > SEEN_TEXTS:
                        seen.pop(next(iter(seen)), None)
        elif len(ids) <= TEXT_CACHE_MAX_IDS // 4:
            self._texts[text] = ids  # one dict store: atomic, no lock needed to add
            self._text_ids += len(ids)  # approximate under threads: it only paces the eviction
            if self._text_ids > TEXT_CACHE_MAX_IDS:
                self._evict()
        return ids

    def _evict(self) -> None:
        """Drop the oldest texts until the kept ids fit the budget again."""
        with self._lock:
            texts = self._texts
            while self._text_ids > TEXT_CACHE_MAX_IDS and texts:
                self._text_ids -= len(texts.pop(next(iter(texts))))

    # -- the request ---------------------------------------------------------------------------

    def encode(self, messages: Any, tools: list[dict[str, Any]] | None, continue_final: bool) -> list[int] | None:
        """The prompt ids mistral-common gives `ChatCompletionRequest.from_openai(messages, tools,
        continue_final)` encoded, or None when this encoder does not render the request."""
        if not self.enabled:
            return None
        try:
            return self._encode(messages, tools, continue_final)
        except Unsupported:
            return None
        except Exception:  # anything unexpected: the library decides (ids or its own error)
            return None

    def _parse(self, messages: Any, continue_final: bool) -> list[tuple[Any, ...]]:
        """The messages as (role, ...) tuples after `from_openai` and the normalizer, checked
        as the validator checks them; Unsupported for anything else."""
        if type(messages) is not list or not messages:
            raise Unsupported
        v13 = self.version >= 13
        parsed: list[tuple[Any, ...]] = []
        last = len(messages) - 1
        for index, message in enumerate(messages):
            if type(message) is not dict:
                raise Unsupported
            role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise Unsupported
            if role == _ASSISTANT:
                content = message.get("content")
                if type(content) is list:  # text parts: text chunks, joined by the normalizer
                    content = [(False, text) for text in _text_parts(content)]
                elif content is not None and type(content) is not str:
                    raise Unsupported
                reasoning, reasoning_content = message.get("reasoning"), message.get("reasoning_content")
                thinking = reasoning if reasoning is not None else reasoning_content
                if thinking is not None:
                    if type(thinking) is not str or not v13 or self.begin_think is None:
                        raise Unsupported  # v7 rejects think chunks, v11 cannot encode them
                    if reasoning is not None and reasoning_content is not None and reasoning != reasoning_content:
                        raise Unsupported
                calls = message.get("tool_calls")
                parsed_calls: list[tuple[str, str, str]] = []
                if calls is not None:
                    if type(calls) is not list:
                        raise Unsupported
                    for call in calls:
                        parsed_calls.append(self._call(call))
                # `from_openai`'s content: a string, or a closed think chunk then the text.
                chunks: str | list[tuple[bool, str]] | None = content
                if thinking is not None:
                    if content is None:
                        chunks = [(True, thinking)]
                    elif type(content) is str:
                        chunks = [(True, thinking), (False, content)]
                    else:
                        chunks = [(True, thinking), *content]
                parsed.append((_ASSISTANT, chunks, parsed_calls, continue_final and index == last))
            else:
                if "content" not in message:
                    raise Unsupported
                text = message["content"]
                if type(text) is list:  # text parts: the normalizer joins the non-empty ones
                    text = "\n\n".join(part for part in _text_parts(text) if part)
                elif type(text) is not str:
                    raise Unsupported
                if role == _TOOL:
                    call_id, name = message.get("tool_call_id"), message.get("name")
                    if type(call_id) is not str or (name is not None and type(name) is not str):
                        raise Unsupported
                    if name is not None and not _NAME_RE.match(name):
                        raise Unsupported
                    if not self._valid_id(call_id):
                        raise Unsupported
                    parsed.append((_TOOL, text, call_id))
                else:
                    parsed.append((role, text))
        if continue_final and parsed[-1][0] != _ASSISTANT:
            raise Unsupported
        self._check_structure(parsed)
        return parsed

    def _call(self, call: Any) -> tuple[str, str, str]:
        """One tool call as (id, name, arguments), as `ToolCall.from_openai` and the validator
        take it."""
        if type(call) is not dict:
            raise Unsupported
        call_id, function = call.get("id"), call.get("function")
        if type(call_id) is not str or call.get("type", "function") != "function" or type(function) is not dict:
            raise Unsupported
        if not function.keys() <= {"name", "arguments"}:
            raise Unsupported
        name, arguments = function.get("name"), function.get("arguments")
        if type(arguments) is dict:  # `FunctionCall`'s validator writes a dict as JSON
            arguments = json.dumps(arguments)
        if type(name) is not str or type(arguments) is not str:
            raise Unsupported
        if not self._valid_id(call_id) or not _NAME_RE.match(name):
            raise Unsupported
        return call_id, name, arguments

    def _valid_id(self, call_id: str) -> bool:
        if self.version >= 13:
            return bool(call_id) and call_id != _NULL_ID
        return bool(_CALL_ID_RE.match(call_id))

    def _check_structure(self, parsed: list[tuple[Any, ...]]) -> None:
        """`_validate_message_list_structure` (test mode), on the messages before the normalizer
        merges them."""
        roles = [message[0] for message in parsed]
        if len(roles) == 1 and roles[0] not in (_USER, _SYSTEM):
            raise Unsupported
        if len(roles) > 1 and roles[-1] == _ASSISTANT and not parsed[-1][3]:
            raise Unsupported  # the last message must be user or tool (or a prefix assistant)
        for before, after in pairwise(roles):
            if after in _BAD_NEXT[before]:
                raise Unsupported
        # Tool calls followed by their results (the first message is skipped, as in the library).
        if self.version >= 11:
            expected: set[str] = set()
            observed: set[str] = set()
            for message in parsed[1:]:
                if message[0] == _TOOL:
                    if message[2] in observed or message[2] not in expected:
                        raise Unsupported
                    observed.add(message[2])
                elif message[0] == _ASSISTANT:
                    if len(expected) != len(observed):
                        raise Unsupported
                    expected.clear()
                    observed.clear()
                    for call in message[2]:
                        if call[0] in expected:
                            raise Unsupported
                        expected.add(call[0])
        else:
            pending = 0
            for message in parsed[1:]:
                if message[0] == _TOOL:
                    pending -= 1
                elif message[0] == _ASSISTANT:
                    if pending != 0:
                        raise Unsupported
                    pending = len(message[2])

    def _normalized(self, parsed: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The normalizer's `_aggregate_messages`: a run of user messages is one message (the
        non-empty texts joined by a blank line), a run of assistant messages one message (its
        contents aggregated as `_aggregate_content_chunks_impl` does, its tool calls in order,
        a prefix if any is), and on v11+ each run of tool results is sorted by the order of the
        calls made since the previous run (`_inplace_sort_tool_messages`)."""
        out: list[tuple[Any, ...]] = []
        latest: list[str] = []
        index = 0
        while index < len(parsed):
            role = parsed[index][0]
            end = index + 1
            while end < len(parsed) and parsed[end][0] == role and role != _SYSTEM:
                end += 1
            run = parsed[index:end]
            index = end
            if role == _USER:
                out.append(run[0] if len(run) == 1 else (_USER, "\n\n".join(m[1] for m in run if m[1])))
            elif role == _ASSISTANT:
                content = _aggregate_contents([m[1] for m in run]) if len(run) > 1 else _aggregate_contents([run[0][1]])
                calls = [call for m in run for call in m[2]]
                # The encoder's "neither content nor tool calls" error.
                if not content and not calls:
                    raise Unsupported
                out.append((_ASSISTANT, content, calls, any(m[3] for m in run)))
                latest.extend(call[0] for call in calls)
            elif role == _TOOL:
                if self.version >= 11 and len(run) > 1:
                    call_index = {call_id: i for i, call_id in enumerate(latest)}
                    result_index = {m[2]: i for i, m in enumerate(run)}
                    run.sort(key=lambda m: (call_index.get(m[2] or _NULL_ID, float("inf")), result_index[m[2]]))
                out.extend(run)
                latest.clear()
            else:
                out.extend(run)
        return out

    def _encode(self, messages: Any, tools: list[dict[str, Any]] | None, continue_final: bool) -> list[int]:
        parsed = self._parse(messages, continue_final)
        block = self._tools(tools) if tools is not None else []
        parsed = self._normalized(parsed)
        users = [i for i, message in enumerate(parsed) if message[0] == _USER]
        tools_at = -1
        if block and users:
            tools_at = users[0] if self.version >= 13 else users[-1]
        text = self.text
        out = [self.bos]
        for index, message in enumerate(parsed):
            role = message[0]
            if role == _USER:
                if index == tools_at:
                    out += block
                out.append(self.begin_inst)
                out += text(message[1])
                out.append(self.end_inst)
            elif role == _ASSISTANT:
                _, content, calls, prefix = message
                if type(content) is str:
                    if content:
                        out += text(content.rstrip(" "))
                else:  # chunks: think chunks are closed; text chunks are not right-stripped
                    for is_think, chunk in content:
                        if is_think:
                            out.append(self.begin_think)
                            out += text(chunk)
                            out.append(self.end_think)
                        else:
                            out += text(chunk)
                if calls:
                    self._encode_calls(out, calls)
                if not prefix:
                    out.append(self.eos)
            elif role == _TOOL:
                out.append(self.begin_results)
                if self.version < 13:
                    out += text(message[2])
                    out.append(self.tool_content)
                out += text(message[1])
                out.append(self.end_results)
            else:
                out.append(self.begin_system)
                out += text(message[1])
                out.append(self.end_system)
        return out

    def _tools(self, tools: list[dict[str, Any]]) -> list[int]:
        """The `[AVAILABLE_TOOLS]` block of a tool list ([] for an empty one), converted and
        checked by the library the first time, then kept by the list's JSON (an agent sends the
        same tools with every request). A list the library rejects raises, and is not kept."""
        key = orjson.dumps(tools)
        block = self._blocks.get(key)
        if block is not None:
            return block
        from mistral_common.protocol.instruct.converters import convert_openai_tools

        available = self.tokenizer._converted_tools(tools, convert_openai_tools)
        self.validator._validate_tools(available)  # the library's checks (memoized per function)
        block = self.tokenizer._tools_block(available) if available else []
        if len(key) <= TOOLS_BLOCK_MAX_KEY:
            with self._lock:
                while len(self._blocks) >= TOOLS_BLOCKS:
                    self._blocks.pop(next(iter(self._blocks)), None)
                self._blocks[key] = block
        return block

    def _encode_calls(self, out: list[int], calls: list[tuple[str, str, str]]) -> None:
        """An assistant message's tool calls; their ids are kept by (id, name, arguments), as
        an agent's history sends the same calls again on every turn."""
        key = tuple(calls)
        found = self._calls.get(key)
        if found is None:
            found = self._calls_ids(calls)
            if len(self._calls) >= CALLS_CACHE_ENTRIES:
                with self._lock:
                    while len(self._calls) >= CALLS_CACHE_ENTRIES:
                        self._calls.pop(next(iter(self._calls)), None)
            self._calls[key] = found
        out += found

    def _calls_ids(self, calls: list[tuple[str, str, str]]) -> list[int]:
        out: list[int] = []
        if self.version < 11:  # one JSON list of {name, arguments, id}
            prepared = []
            for call_id, name, arguments in calls:
                entry: dict[str, Any] = {"name": name, "arguments": _tool_args(arguments)}
                if call_id and call_id != _NULL_ID:
                    entry["id"] = call_id
                prepared.append(entry)
            out.append(self.tool_calls)
            out += self.raw_encode(json.dumps(prepared, ensure_ascii=False), False, False)
            return out
        for call_id, name, arguments in calls:
            out.append(self.tool_calls)
            out += self.raw_encode(name, False, False)
            if self.version < 13 and call_id and call_id != _NULL_ID:
                out.append(self.call_id)
                out += self.raw_encode(call_id, False, False)
            out.append(self.args)
            out += self.raw_encode(json.dumps(_tool_args(arguments), ensure_ascii=False), False, False)
        return out
