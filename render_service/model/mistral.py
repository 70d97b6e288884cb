"""The tokenizer of a Mistral-format model, with vLLM 0.33's `MistralTokenizer` semantics.

vLLM serves a `--tokenizer-mode mistral` model (a folder with `tekken.json` or
`tokenizer.model.v*`) through transformers' `MistralCommonBackend`, which wraps mistral-common's
tokenizer in test validation mode, and adapts it in `vllm/tokenizers/mistral.py`. This module is
that adapter written for this service: the same backend, the same answers to what render,
detokenization and the parsers ask of a tokenizer:

- `encode(text, add_special_tokens)`: mistral-common's encode, BOS only when asked, never EOS,
  and special-token text in the input is plain text;
- `convert_ids_to_tokens(..., skip_special_tokens=True)` keeps `[TOOL_CALLS]`, `[ARGS]` and
  `[THINK]`/`[/THINK]` (the parsers need them); `convert_tokens_to_string` drops every other
  special token and reassembles Tekken byte pieces (which may be `bytes`);
- `get_vocab()`: piece -> lowest id; no added vocabulary.

mistral-common is the optional `mistral` extra; nothing imports this module unless the renderer
is `mistral`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from cachetools import LRUCache

logger = logging.getLogger("render_service.model.mistral")

# The special tokens that survive `skip_special_tokens` (vLLM's `to_decode_special_tokens`).
KEPT_SPECIAL_TOKENS = ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")
REPLACEMENT_CHAR = "\ufffd"
# Distinct tool lists kept converted, and the largest one kept (its JSON, in bytes).
TOOLS_CACHE_ENTRIES = 256
TOOLS_CACHE_MAX_KEY = 1 << 20
# vLLM hands out a Tekken piece that is an incomplete UTF-8 sequence as `bytes`, which its render
# tier then cannot put in a stream_state (a 400 mid-stream). Here such a piece is this marker and
# the bytes in hex: a string the state carries as JSON. U+FDD0 is a noncharacter, not in any piece.
BYTE_PIECE_MARK = "\ufdd0"


def _byte_piece(raw: bytes) -> str:
    return BYTE_PIECE_MARK + raw.hex()


def _piece_bytes(token: Any) -> bytes | None:
    if isinstance(token, bytes):
        return token
    if isinstance(token, str) and token.startswith(BYTE_PIECE_MARK):
        try:
            return bytes.fromhex(token[len(BYTE_PIECE_MARK) :])
        except ValueError:
            return None
    return None


# Text a Mistral prompt holds besides prose: markers that are special tokens elsewhere (plain text
# to Tekken's `encode`), JSON as tools and tool calls are written, long runs, digits, whitespace.
MISTRAL_SELF_TEST_CORPUS = (
    '[INST]hello[/INST] [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>[THINK]x[/THINK]',
    '[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]',
    "\u2581\u2581 sentencepiece marks and <s> </s> <unk> [IMG] [SYSTEM_PROMPT]",
    "x" * 5000,
    "0123456789" * 300,
    " \n" * 700 + "\t" * 300,
)


def tekken_fastokens(
    ranks: dict[bytes, int], pattern: str, shift: int, library_encode: Callable[[str], list[int]]
) -> Callable[[str], list[int]] | None:
    """fastokens over Tekken's BPE ranks, giving the library's shifted ids, or None when it
    cannot load them or differs from `library_encode` on the self-test corpus.

    fastokens wants ids from 0 without gaps, and Tekken's text ids start after its special
    tokens; the gap is filled with two-byte tokens that begin with a byte UTF-8 never uses, so
    text can never produce them (and the self-test would see it if it did).
    """
    import base64
    import tempfile

    from render_service.model.backends import SELF_TEST_CORPUS

    try:
        import fastokens
    except ImportError:
        return None
    fillers: list[bytes] = []
    for lead in range(0xFF, 0xF7, -1):  # 0xF8-0xFF never occur in UTF-8
        fillers.extend(piece for piece in (bytes([lead, low]) for low in range(256)) if piece not in ranks)
        if len(fillers) >= shift:
            break
    if len(fillers) < shift:
        return None
    lines = [f"{base64.b64encode(piece).decode()} {index}" for index, piece in enumerate(fillers[:shift])]
    lines.extend(f"{base64.b64encode(piece).decode()} {rank + shift}" for piece, rank in ranks.items())
    try:
        with tempfile.TemporaryDirectory() as directory:
            ranks_file = Path(directory) / "tekken.tiktoken"
            ranks_file.write_text("\n".join(lines) + "\n", encoding="ascii")
            tokenizer = fastokens.Tokenizer.from_tiktoken(str(ranks_file), pattern=pattern, special_tokens={})
    except Exception as exc:  # a pattern or vocabulary fastokens does not take
        logger.warning("fastokens cannot load this Tekken vocabulary (%s); encoding with tiktoken", exc)
        return None

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode_ordinary(text).ids
        return ids

    for text in (*SELF_TEST_CORPUS, *MISTRAL_SELF_TEST_CORPUS):
        if encode(text) != library_encode(text):
            logger.warning("fastokens differs from mistral-common on %r; encoding with tiktoken", text[:40])
            return None
    return encode


class MistralUnavailableError(RuntimeError):
    """mistral-common (the `mistral` extra) is not installed."""


def _library_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mistral_common")
    except PackageNotFoundError:
        return None


class MistralTokenizer:
    """A Mistral-format tokenizer (Tekken or SentencePiece) as vLLM 0.33 sees it."""

    def __init__(self, path: str | Path) -> None:
        try:
            from mistral_common.protocol.instruct.validator import ValidationMode
            from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer
            from transformers.tokenization_mistral_common import MistralCommonBackend
        except ImportError as exc:
            raise MistralUnavailableError(
                "Mistral-format models render through mistral-common: install render-service[mistral]"
            ) from exc
        # As vLLM loads it: transformers' backend over mistral-common, in test validation mode.
        self.backend = MistralCommonBackend.from_pretrained(str(path), mode=ValidationMode.test)
        self.mistral = self.backend.tokenizer  # mistral_common MistralTokenizer
        self.instruct = self.mistral.instruct_tokenizer
        self.raw = self.instruct.tokenizer  # Tekkenizer or SentencePieceTokenizer
        self.version = int(str(self.raw.version.value).split("v")[-1])
        self.is_tekken = isinstance(self.raw, Tekkenizer)
        if not (self.is_tekken or isinstance(self.raw, SentencePieceTokenizer)):
            raise TypeError(f"unsupported Mistral tokenizer: {type(self.raw).__name__}")
        self.library_version = _library_version()
        self.vocab_size: int = int(self.backend.vocab_size)
        self.special_ids: list[int] = [i for i in range(self.vocab_size) if self.raw.is_special(i)]
        self.special_id_set = frozenset(self.special_ids)
        self.special_tokens: list[str] = [self._special_text(i) for i in self.special_ids]
        self.special_token_set = frozenset(self.special_tokens)
        self._kept_on_skip = frozenset(
            self.raw.get_special_token(token) for token in KEPT_SPECIAL_TOKENS if self._has_special(token)
        )
        vocab: dict[str, int] = {}
        for index in range(self.vocab_size - 1, -1, -1):  # reversed: the lowest id wins
            vocab[self.raw.id_to_piece(index)] = index
        self._vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))
        self.tokenizer_file = Path(self.raw.file_path) if self.is_tekken else None
        self.encoder = "sentencepiece"
        if self.is_tekken:
            self._fast_tekken_encode()
        self._memoize_tool_schema_checks()
        # Tool lists converted to mistral-common's models, by their JSON (`chat_request`).
        self._tools_cache: LRUCache[bytes, list[Any]] = LRUCache(maxsize=TOOLS_CACHE_ENTRIES)
        self._tools_lock = threading.Lock()
        # Their `[AVAILABLE_TOOLS]` blocks, by the identity of the tool objects (`_tools_block`).
        self._tools_blocks: LRUCache[tuple[int, ...], tuple[tuple[Any, ...], list[int]]] = LRUCache(
            maxsize=TOOLS_CACHE_ENTRIES
        )

    def _memoize_tool_schema_checks(self, entries: int = 1024) -> None:
        """The validator checks every tool's parameters against the JSON Schema meta-schema on
        every request (most of a warm render's time); a function that passed once passes again,
        so passing functions are remembered: the very objects `chat_request` reuses for a tool
        list it has seen, and any other by its JSON (failures are checked every time)."""
        validator = self.mistral._chat_completion_request_validator
        check = validator._validate_function
        passed: LRUCache[str, bool] = LRUCache(maxsize=entries)
        # id -> the object itself: holding it keeps the id from being reused by another object.
        passed_objects: LRUCache[int, Any] = LRUCache(maxsize=entries)
        lock = threading.Lock()

        def validate_function(function: Any) -> None:
            with lock:
                if passed_objects.get(id(function)) is function:
                    return
            key = function.model_dump_json()
            with lock:
                if key in passed:
                    passed_objects[id(function)] = function
                    return
            check(function)
            with lock:
                passed[key] = True
                passed_objects[id(function)] = function

        validator._validate_function = validate_function  # this instance only

    def chat_request(
        self, messages: list[Any], tools: list[dict[str, Any]] | None, continue_final: bool, reasoning_effort: Any
    ) -> Any:
        """`ChatCompletionRequest.from_openai(messages, tools, continue_final_message, reasoning_effort)`,
        the library's own steps in its order, minus two per-request costs: a pydantic `TypeAdapter`
        built to check a flag that is already a bool, and the conversion of a tool list this
        tokenizer has converted before (kept by its JSON; tools are read, never changed, by
        validation and encoding)."""
        from mistral_common.protocol.instruct.converters import convert_openai_messages, convert_openai_tools
        from mistral_common.protocol.instruct.request import ChatCompletionRequest, _map_continue_final_message

        converted = _map_continue_final_message(
            messages=convert_openai_messages(messages), continue_final_message=bool(continue_final)
        )
        return ChatCompletionRequest.model_validate(
            {
                "messages": converted,
                "tools": None if tools is None else self._converted_tools(tools, convert_openai_tools),
                "random_seed": None,
                "reasoning_effort": reasoning_effort,
            },
            extra="ignore",
        )

    def _converted_tools(self, tools: list[dict[str, Any]], convert: Callable[[list[Any]], list[Any]]) -> list[Any]:
        try:
            key = orjson.dumps(tools)
        except TypeError:  # not plain JSON: convert it every time
            return convert(tools)
        with self._tools_lock:
            converted = self._tools_cache.get(key)
        if converted is None:
            converted = convert(tools)  # raises for invalid tools, which are not kept
            if len(key) <= TOOLS_CACHE_MAX_KEY:
                with self._tools_lock:
                    self._tools_cache[key] = converted
        return list(converted)

    def _fast_tekken_encode(self, cache_chars: int = 32 * 1024 * 1024) -> None:
        """Tekken's `encode`, same ids, faster. mistral-common encodes with tiktoken and then
        shifts every id past the special tokens in Python; here the same ranks, already shifted,
        go to fastokens (several times faster on text it has not seen), once it has encoded a
        self-test corpus exactly as the library does. Without that, the library's encoder with
        the ids of each text kept (LRU, bounded by `cache_chars` characters: chat history repeats
        from request to request)."""
        raw = self.raw
        model = raw._model
        # Tekken registers no tiktoken special tokens (mistral-common handles them itself), so
        # `encode` and `encode_ordinary` give the same ids; the latter skips the special-token scan.
        bpe = model.encode_ordinary if not model.special_tokens_set else model.encode
        shift = raw.num_special_tokens
        bos_id, eos_id = raw.bos_id, raw.eos_id

        def library_encode(s: str) -> list[int]:
            return [t + shift for t in bpe(s)]

        fast = tekken_fastokens(raw._tekken_token2id_nospecial, model._pat_str, shift, library_encode)
        if fast is not None:

            def fast_encode(s: str, bos: bool, eos: bool) -> list[int]:
                out: list[int] = fast(s)
                if bos:
                    out.insert(0, bos_id)
                if eos:
                    out.append(eos_id)
                return out

            raw.encode = fast_encode  # this instance only; the ids are proven the library's own
            self.encoder = "fastokens"
            return

        cache: LRUCache[str, tuple[int, ...]] = LRUCache(maxsize=cache_chars, getsizeof=lambda ids: len(ids) + 64)
        lock = threading.Lock()

        def encode(s: str, bos: bool, eos: bool) -> list[int]:
            with lock:
                ids = cache.get(s)
            if ids is None:
                ids = tuple(library_encode(s))
                if len(ids) + 64 <= cache_chars:
                    with lock:
                        cache[s] = ids
            out = list(ids)
            if bos:
                out.insert(0, bos_id)
            if eos:
                out.append(eos_id)
            return out

        raw.encode = encode  # this instance only; the ids are the library's own
        self.encoder = "tiktoken"

    def encode_chat(self, request: Any) -> list[int]:
        """`encode_chat_completion(request).tokens`: the library's steps (validate, normalize,
        encode each message with the version's own encoders), without its `Tokenized` result,
        a pydantic model that checks every id again and decodes the whole prompt to text, which
        is never read here (a third of a warm render). Versions whose prompt assembly is not
        the two known loops, and truncation, go through the library's own call."""
        if request.truncate_for_context_length or not self._known_assembly:
            return list(self.mistral.encode_chat_completion(request).tokens)
        validated = self.mistral._chat_completion_request_validator.validate_request(request)
        return self._assemble(self.mistral._instruct_request_normalizer.from_chat_completion_request(validated))

    @property
    def _known_assembly(self) -> bool:
        from mistral_common.tokens.tokenizers.instruct import InstructTokenizerBase, InstructTokenizerV2

        own = type(self.instruct).encode_instruct
        return own is InstructTokenizerBase.encode_instruct or own is InstructTokenizerV2.encode_instruct

    def _assemble(self, request: Any) -> list[int]:
        """mistral-common 1.13's `encode_instruct` (with V2's tool-result check first), keeping
        the ids only: BOS, then each message's ids from the version's encoder, in order."""
        from mistral_common.exceptions import TokenizerException
        from mistral_common.protocol.instruct.messages import (
            AssistantMessage,
            SystemMessage,
            ToolMessage,
            UserMessage,
        )
        from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV2

        instruct = self.instruct
        if isinstance(instruct, InstructTokenizerV2):
            instruct._validate_tool_results(request=request)
        instruct.validate_messages(request.messages)
        first_user, last_user = instruct.find_first_last_user(request)
        last = len(request.messages) - 1
        tools_at = self._tools_position
        parts: list[list[int] | None] = []
        for index, message in enumerate(request.messages):
            ids: list[int] | None
            if isinstance(message, UserMessage):
                is_last, is_first = index == last_user, index == first_user
                # The tools block, when this message carries it, comes from the cache (see below).
                tools_here = tools_at is not None and bool(request.available_tools) and tools_at(is_first, is_last)
                ids, _, _ = instruct.encode_user_message(
                    message,
                    None if tools_here else request.available_tools,
                    is_last,
                    is_first,
                    system_prompt=request.system_prompt,
                    force_img_first=True,
                    settings=request.settings,
                )
                if tools_here:
                    ids = [*self._tools_block(request.available_tools), *ids]
            elif isinstance(message, ToolMessage):
                ids, _, _ = instruct.encode_tool_message(message, index < last_user)
            elif isinstance(message, AssistantMessage):
                ids = instruct.encode_assistant_message(message=message, is_before_last_user_message=index < last_user)
                if message.prefix:
                    assert index == last
            elif isinstance(message, SystemMessage):
                ids, _ = instruct.encode_system_message(message)
            else:
                raise TokenizerException(f"Unknown message type {type(message)}")
            parts.append(ids)
        tokens: list[int] = instruct.start()
        for ids in parts:
            if ids is not None:
                tokens.extend(ids)
        return tokens

    @cached_property
    def _tools_position(self) -> Callable[[bool, bool], bool] | None:
        """Whether a user message (is_first, is_last) carries the tools block, when this version's
        user-message encoder is the library's V7/V2 pair, whose block is
        `[AVAILABLE_TOOLS] json.dumps(tools) [/AVAILABLE_TOOLS]` before the model settings and
        `[INST]`; None for any other encoder (the tools then go to it every time)."""
        from mistral_common.tokens.tokenizers.instruct import (
            InstructTokenizerV2,
            InstructTokenizerV7,
            UserMessagePosition,
        )

        own = type(self.instruct).encode_user_message
        if own is not InstructTokenizerV7.encode_user_message and own is not InstructTokenizerV2.encode_user_message:
            return None
        if self.instruct._message_position_to_encode_tools_settings == UserMessagePosition.first:
            return lambda is_first, is_last: is_first
        return lambda is_first, is_last: is_last

    def _tools_block(self, tools: list[Any]) -> list[int]:
        """`[AVAILABLE_TOOLS] ... [/AVAILABLE_TOOLS]` as the library writes it, once per tool list
        (the same tool objects: `chat_request` reuses them for a list it has seen)."""
        key = tuple(id(tool) for tool in tools)
        with self._tools_lock:
            entry = self._tools_blocks.get(key)
        if entry is not None and all(a is b for a, b in zip(entry[0], tools, strict=True)):
            return entry[1]
        dumped = [tool.model_dump(exclude={"function": {"strict": True}}) for tool in tools]
        ids = [
            self.instruct.BEGIN_AVAILABLE_TOOLS,
            *self.raw.encode(json.dumps(dumped, ensure_ascii=False), bos=False, eos=False),
            self.instruct.END_AVAILABLE_TOOLS,
        ]
        with self._tools_lock:  # the tools are kept with their ids, so no id is reused meanwhile
            self._tools_blocks[key] = (tuple(tools), ids)
        return ids

    def _special_text(self, token_id: int) -> str:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        return str(self.raw.decode([token_id], special_token_policy=SpecialTokenPolicy.KEEP))

    def _has_special(self, token: str) -> bool:
        try:
            return bool(self.raw.is_special(token))
        except Exception:  # older Tekken files raise for a marker they do not define
            return False

    # -- what the rest of the service asks of a tokenizer ------------------------------------------

    @property
    def is_fast(self) -> bool:
        return True  # vLLM's MistralTokenizer says so: detokenization takes the fast path

    @property
    def all_special_ids(self) -> list[int]:
        return self.special_ids

    @property
    def all_special_tokens(self) -> list[str]:
        return self.special_tokens

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {"bos_token": self._special_text(self.bos_token_id), "eos_token": self._special_text(self.eos_token_id)}

    @property
    def bos_token_id(self) -> int:
        return int(self.raw.bos_id)

    @property
    def eos_token_id(self) -> int:
        return int(self.raw.eos_id)

    @property
    def pad_token_id(self) -> int:
        return int(self.raw.pad_id)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def get_added_vocab(self) -> dict[str, int]:
        return {}

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return {}  # Mistral tokenizers have no added vocabulary (the file digest covers the specials)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.raw.encode(text, bos=add_special_tokens, eos=False))

    def decode(self, ids: Sequence[int] | int, skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int], skip_special_tokens: bool = False) -> list[Any]:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        if not skip_special_tokens:
            return [self.raw.id_to_piece(i) for i in ids]
        kept = [i for i in ids if i in self._kept_on_skip or i not in self.special_id_set]
        tokens: list[Any] = [self.raw.id_to_piece(i) for i in kept]
        if self.is_tekken and any(REPLACEMENT_CHAR in t for t in tokens):
            # A piece with an incomplete UTF-8 sequence: hand out its bytes instead.
            tokens = [
                _byte_piece(self.raw.id_to_byte_piece(i, SpecialTokenPolicy.KEEP))
                if i not in self.special_id_set
                else self.raw.decode([i], SpecialTokenPolicy.KEEP)
                for i in kept
            ]
        return tokens

    def convert_tokens_to_string(self, tokens: Sequence[Any]) -> str:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        kept = frozenset(KEPT_SPECIAL_TOKENS)
        if self.is_tekken:
            pieces = [t for t in tokens if t in kept or t not in self.special_token_set]
            as_bytes = [_piece_bytes(t) for t in pieces]
            if any(b is not None for b in as_bytes):
                ids = [self._piece_id(b if b is not None else t) for t, b in zip(pieces, as_bytes, strict=True)]
                return str(self.raw.decode(ids, SpecialTokenPolicy.KEEP))
            return "".join(pieces)
        out: list[str] = []
        regular: list[str] = []
        for token in tokens:
            if token in kept:
                if regular:
                    out.append(self.raw.decode(regular, SpecialTokenPolicy.IGNORE))
                    regular = []
                out.append(token)
            else:
                regular.append(token)
        if regular:
            out.append(self.raw.decode(regular, SpecialTokenPolicy.IGNORE))
        return "".join(out)

    def _piece_id(self, piece: str | bytes) -> int:
        """A Tekken piece (text or raw bytes) back to its id; unknown pieces are `<unk>`."""
        raw_bytes = piece.encode("utf-8") if isinstance(piece, str) else piece
        found = self.raw._tekken_token2id_nospecial.get(raw_bytes)
        if found is not None:
            return int(self.raw.num_special_tokens + found)
        text = raw_bytes.decode("utf-8", errors="replace")
        special = self.raw._special_tokens_reverse_vocab.get(text)
        return int(special) if special is not None else int(self.raw.unk_id)


class MistralBackend:
    """The encode backend for a Mistral model (the loader's `TokenizerBackend`)."""

    name = "mistral-common"

    def __init__(self, tokenizer: MistralTokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens)
