"""Incremental detokenization with vLLM 0.33's semantics, without vLLM or torch.

Ports of:
- `vllm/tokenizers/detokenizer_utils.py`: `convert_prompt_ids_to_tokens` (seeding from the
  last 7 prompt ids, `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5`) and
  `detokenize_incrementally` (prefix/read offsets, U+FFFD pending rule, skip_special_tokens,
  spaces_between_special_tokens);
- `vllm/renderers/online_derenderer.py`: `_detokenize_delta` (one `detokenize_incrementally`
  call per token, then trim the window to `[prefix_offset:]` and rebase), `_seed_stream_state`,
  `_decode_params`, `_drop_stop_token`, `_decode_output` and `_stop_strings`;
- `vllm/v1/engine/detokenizer.py`: `check_stop_strings`.

The streaming state (`DetokState`) holds exactly the three fields vLLM's `DerenderStreamState`
carries for the plain path (`prev_tokens`, `prefix_offset`, `read_offset`), so a state can be
handed to or taken from a vLLM replica unchanged. It stays a handful of token strings: it only
grows while a multi-byte character is pending.

The tokenizer is duck-typed: a `transformers` fast tokenizer (`TokenizersBackend` /
`PreTrainedTokenizerFast`) or a raw `tokenizers.Tokenizer`. `TokenizerInfo` caches what the hot
loop needs (the Rust `id_to_token` and decoder, the special-id set, the vocabulary size) and
calls exactly what transformers' methods call, so results are identical to vLLM's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
DETOK_STATE_VERSION = 1
REPLACEMENT_CHAR = "\ufffd"


# -- tokenizer view ----------------------------------------------------------------------------


class TokenizerInfo:
    """The few tokenizer operations detokenization and the parsers need, cached.

    Use `TokenizerInfo.of(tokenizer)`: one instance per tokenizer object per process, kept on
    the tokenizer itself so that it (and the parsers built on it, `parsers`) lives exactly as
    long as the tokenizer does: a process-wide table keyed by id kept every tokenizer ever seen
    alive (~100 MB each for a Qwen-size vocabulary).
    """

    _ATTR = "_render_service_tokenizer_info"
    # Only for tokenizer objects that take no attributes (`__slots__`): the most recent few.
    _FALLBACK_MAX = 4
    _fallback: dict[int, tuple[Any, TokenizerInfo]] = {}  # noqa: RUF012  (process-wide, bounded)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        raw = backend is None and hasattr(tokenizer, "id_to_token") and hasattr(tokenizer, "decoder")
        if raw:  # a bare tokenizers.Tokenizer
            backend = tokenizer
        self._backend = backend
        self._raw = raw
        self.is_fast: bool = True if raw else bool(getattr(tokenizer, "is_fast", True))
        if raw:
            added = tokenizer.get_added_tokens_decoder()
            specials = sorted((tid, tok.content) for tid, tok in added.items() if tok.special)
            self.special_ids: list[int] = [tid for tid, _ in specials]
            self.special_tokens: list[str] = [content for _, content in specials]
            self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
            self.added_vocab: dict[str, int] = {tok.content: tid for tid, tok in sorted(added.items())}
        else:
            self.special_ids = list(tokenizer.all_special_ids)
            self.special_tokens = list(tokenizer.all_special_tokens)
            self.vocab_size = len(tokenizer)
            self.added_vocab = dict(tokenizer.get_added_vocab()) if not self.is_fast else {}
        self.special_id_set: frozenset[int] = frozenset(self.special_ids)
        self.special_token_set: frozenset[str] = frozenset(self.special_tokens)
        self._id_to_token = backend.id_to_token if backend is not None else None
        self._decoder = backend.decoder if backend is not None else None
        self._decode_one: dict[int, str] = {}
        # Parsers built for this tokenizer (`parsers.chat.get_parser`, `parsers.harmony.get_parser`),
        # by configuration: a small set per server config, freed with the tokenizer.
        self.parsers: dict[tuple[Any, ...], Any] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerInfo:
        if isinstance(tokenizer, TokenizerInfo):
            return tokenizer
        found = getattr(tokenizer, "__dict__", {}).get(cls._ATTR)
        if isinstance(found, TokenizerInfo) and found.tokenizer is tokenizer:
            return found
        hit = cls._fallback.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        info = cls(tokenizer)
        try:  # the tokenizer <-> info cycle is freed with the tokenizer (gc)
            object.__setattr__(tokenizer, cls._ATTR, info)
        except (AttributeError, TypeError):
            cls._fallback[id(tokenizer)] = (tokenizer, info)
            while len(cls._fallback) > cls._FALLBACK_MAX:
                del cls._fallback[next(iter(cls._fallback))]
        return info

    def ids_to_tokens(self, ids: Sequence[int], skip_special_tokens: bool = False) -> list[str | None]:
        """`convert_ids_to_tokens(list)`: None for ids the vocabulary does not have."""
        if self._id_to_token is None:
            return list(self.tokenizer.convert_ids_to_tokens(list(ids), skip_special_tokens=skip_special_tokens))
        id_to_token = self._id_to_token
        if skip_special_tokens:
            skip = self.special_id_set
            return [id_to_token(int(i)) for i in ids if int(i) not in skip]
        return [id_to_token(int(i)) for i in ids]

    def tokens_to_string(self, tokens: list[str]) -> str:
        """`convert_tokens_to_string` of a fast tokenizer: the backend decoder."""
        if self._backend is None:
            return self.tokenizer.convert_tokens_to_string(tokens)
        if self._decoder is None:
            return " ".join(tokens)
        return self._decoder.decode(tokens)

    def decode_one(self, token_id: int) -> str:
        """`tokenizer.decode([token_id])`, cached (vLLM's TokenIDScanner does the same)."""
        text = self._decode_one.get(token_id)
        if text is None:
            if self._raw:
                out = self.tokenizer.decode([token_id], skip_special_tokens=False)
            else:
                out = self.tokenizer.decode([token_id])
            text = out if isinstance(out, str) else ""
            self._decode_one[token_id] = text
        return text

    def token_to_id(self, token: str) -> int | None:
        if self._backend is not None:
            return self._backend.token_to_id(token)
        return self.tokenizer.get_vocab().get(token)


def _none_to_empty(tokens: list[str | None]) -> list[str]:
    return [t if t is not None else "" for t in tokens]


# -- vLLM's detokenizer_utils -------------------------------------------------------------------


def _convert_tokens_to_string_with_added_encoders(
    info: TokenizerInfo, output_tokens: list[str], skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> str:
    # Slow-tokenizer path of vLLM; unused with fast tokenizers but kept for parity.
    sub_texts: list[str] = []
    current: list[str] = []
    added = info.added_vocab
    specials = info.special_token_set if skip_special_tokens else frozenset()
    for token in output_tokens:
        if token in specials:
            continue
        if token in added:
            if current:
                sub_texts.append(info.tokens_to_string(current))
                current = []
            sub_texts.append(token)
        else:
            current.append(token)
    if current:
        sub_texts.append(info.tokens_to_string(current))
    return (" " if spaces_between_special_tokens else "").join(sub_texts)


def convert_prompt_ids_to_tokens(
    tokenizer: Any, prompt_ids: Sequence[int], skip_special_tokens: bool = False
) -> tuple[list[str], int, int]:
    """Seed window from the prompt tail: (tokens, prefix_offset, read_offset)."""
    info = TokenizerInfo.of(tokenizer)
    tail = list(prompt_ids[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET - 2 :])
    new_tokens = info.ids_to_tokens(tail, skip_special_tokens=skip_special_tokens)
    read_offset = len(new_tokens)
    prefix_offset = max(read_offset - INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
    return _none_to_empty(new_tokens), prefix_offset, read_offset


def detokenize_incrementally(
    tokenizer: Any,
    all_input_ids: Sequence[int],
    prev_tokens: list[str] | None,
    prefix_offset: int,
    read_offset: int,
    skip_special_tokens: bool = False,
    spaces_between_special_tokens: bool = True,
) -> tuple[list[str], str, int, int]:
    """Port of vLLM's `detokenize_incrementally`: (new_tokens, new_text, prefix, read)."""
    info = TokenizerInfo.of(tokenizer)
    new_token_id = all_input_ids[-1]
    is_first_iter = prev_tokens is None
    if prev_tokens is None:
        prev_tokens, prefix_offset, read_offset = convert_prompt_ids_to_tokens(
            info, all_input_ids[:-1], skip_special_tokens=skip_special_tokens
        )

    if 0 <= new_token_id < info.vocab_size:
        new_tokens = _none_to_empty(info.ids_to_tokens([new_token_id], skip_special_tokens=skip_special_tokens))
    else:
        new_tokens = [""]
    output_token_count = len(prev_tokens) + len(new_tokens)
    window_start = 0 if is_first_iter else min(prefix_offset, read_offset, len(prev_tokens))
    output_tokens = (prev_tokens[window_start:] if window_start else prev_tokens) + new_tokens
    if is_first_iter:
        new_tokens = output_tokens

    lo = prefix_offset - window_start
    hi = read_offset - window_start
    if info.is_fast or not info.added_vocab:
        prefix_text = info.tokens_to_string(output_tokens[lo:hi])
        new_text = info.tokens_to_string(output_tokens[lo:])
    else:
        prefix_text = _convert_tokens_to_string_with_added_encoders(
            info, output_tokens[lo:hi], skip_special_tokens, spaces_between_special_tokens
        )
        new_text = _convert_tokens_to_string_with_added_encoders(
            info, output_tokens[lo:], skip_special_tokens, spaces_between_special_tokens
        )

    # A trailing U+FFFD may be an unfinished byte sequence: hold it back.
    if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
        return new_tokens, "", prefix_offset, read_offset
    return new_tokens, new_text[len(prefix_text) :], read_offset, output_token_count


# -- streaming state ---------------------------------------------------------------------------


@dataclass(slots=True)
class DetokState:
    """The trailing decode window: vLLM's `prev_tokens` / `prefix_offset` / `read_offset`."""

    prev_tokens: list[str] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"v": DETOK_STATE_VERSION, "t": list(self.prev_tokens), "p": self.prefix_offset, "r": self.read_offset}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetokState:
        if data.get("v") != DETOK_STATE_VERSION:
            raise ValueError(f"unsupported detokenizer state version {data.get('v')!r}")
        return cls(list(data["t"]), int(data["p"]), int(data["r"]))

    def copy(self) -> DetokState:
        return DetokState(list(self.prev_tokens), self.prefix_offset, self.read_offset)


def seed_state(tokenizer: Any, prompt_token_ids: Sequence[int] | None, skip_special_tokens: bool) -> DetokState:
    """`_seed_stream_state`: the window primed from the prompt tail; empty without a prompt."""
    if not prompt_token_ids:
        return DetokState()
    tokens, prefix_offset, read_offset = convert_prompt_ids_to_tokens(
        tokenizer, prompt_token_ids, skip_special_tokens=skip_special_tokens
    )
    return DetokState(tokens, prefix_offset, read_offset)


def step(
    tokenizer: Any,
    state: DetokState,
    token_id: int,
    *,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> str:
    """Decode one token, updating `state` in place (trim and rebase as `_detokenize_delta`)."""
    prev = state.prev_tokens
    new_toks, text, prefix_offset, read_offset = detokenize_incrementally(
        tokenizer,
        (token_id,),
        prev,
        state.prefix_offset,
        state.read_offset,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
    )
    # Everything before prefix_offset is dead: keep the window bounded.
    window = prev + new_toks
    state.prev_tokens = window[prefix_offset:] if prefix_offset else window
    state.read_offset = read_offset - prefix_offset
    state.prefix_offset = 0
    return text


def detokenize_delta(
    tokenizer: Any,
    delta_token_ids: Sequence[int],
    state: DetokState,
    *,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> tuple[str, DetokState]:
    """`_detokenize_delta`: the text of a chunk and the new state (the input is not modified)."""
    new_state = state.copy()
    info = TokenizerInfo.of(tokenizer)
    parts = [
        step(
            info,
            new_state,
            tid,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )
        for tid in delta_token_ids
    ]
    return "".join(parts), new_state


def decode_params(
    skip_special_tokens: bool | None = None,
    spaces_between_special_tokens: bool = True,
    *,
    preserve_special: bool = False,
    fast_detokenizer: bool = True,
) -> tuple[bool, bool]:
    """`_decode_params`: (skip_special_tokens, spaces_between_special_tokens).

    `skip_special_tokens=None` means "no request" (or a request without the field): skip.
    """
    skip = False if preserve_special else skip_special_tokens is not False
    spaces = spaces_between_special_tokens
    if skip and fast_detokenizer:  # only the fast detokenizer forces spaces on
        spaces = True
    return skip, spaces


# -- batch decode (stop token, stop strings) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class StopParams:
    """What `_drop_stop_token` / `_decode_output` read from the request (defaults = no request)."""

    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    min_tokens: int = 0

    @staticmethod
    def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        """`_stop_strings`: the request's `stop` as SamplingParams normalizes it."""
        if not stop:
            return ()
        return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)


def drop_stop_token(
    token_ids: Sequence[int],
    finish_reason: str | None,
    stop_reason: int | str | None,
    *,
    eos_token_id: int | None,
    model_eos_token_ids: frozenset[int] | set[int] = frozenset(),
    params: StopParams | None = None,
) -> tuple[list[int], int | str | None]:
    """`_drop_stop_token`: the ids to decode and the (possibly inferred) `stop_reason`.

    `model_eos_token_ids` is the generation config's `eos_token_id` set plus `eos_token_id`.
    """
    ids = list(token_ids)
    if finish_reason != "stop" or isinstance(stop_reason, str) or not ids:
        return ids, stop_reason
    p = params or StopParams()
    last = ids[-1]
    if stop_reason is None:
        honor_eos = not p.ignore_eos
        if honor_eos and last == eos_token_id:
            stopped = True
        elif last in p.stop_token_ids or (honor_eos and last in model_eos_token_ids):
            stopped = True
            stop_reason = last
        else:
            stopped = False
    else:
        stopped = last == stop_reason
    if not stopped or p.include_stop_str_in_output:
        return ids, stop_reason
    return ids[:-1], stop_reason


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """vLLM's `check_stop_strings`: (stop_string, truncate_to or -1) or None."""
    if not new_char_count or not stop:
        return None
    best_stop: str | None = None
    best_index = 0
    best_end = sys.maxsize
    for stop_str in stop:
        n = len(stop_str)
        index = output_text.find(stop_str, 1 - new_char_count - n)
        if index == -1:
            continue
        end = index + n
        if end < best_end:
            best_stop, best_index, best_end = stop_str, index, end
    if best_stop is None:
        return None
    if include_in_output:
        if best_end >= len(output_text):
            return best_stop, -1
        return best_stop, best_end
    return best_stop, best_index


def decode_output(
    tokenizer: Any,
    token_ids: Sequence[int],
    finish_reason: str | None,
    stop_reason: int | str | None,
    seed: DetokState,
    *,
    eos_token_id: int | None,
    model_eos_token_ids: frozenset[int] | set[int] = frozenset(),
    params: StopParams | None = None,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> tuple[str, int | str | None]:
    """`_decode_output`: the text the engine would return for a whole output, and `stop_reason`.

    Drops the stop token, then cuts at the stop string that ended generation (the reported
    string `stop_reason`, or else the request's `stop` list), counting only matches that end
    past the first `min_tokens` tokens.
    """
    p = params or StopParams()
    reported = stop_reason
    ids, stop_reason = drop_stop_token(
        token_ids,
        finish_reason,
        stop_reason,
        eos_token_id=eos_token_id,
        model_eos_token_ids=model_eos_token_ids,
        params=p,
    )
    if finish_reason != "stop" or isinstance(reported, int):
        stop_strings: tuple[str, ...] = ()
    elif isinstance(reported, str):
        stop_strings = (reported,)
    else:
        stop_strings = p.stop
    min_tokens = p.min_tokens
    kw = {"skip_special_tokens": skip_special_tokens, "spaces_between_special_tokens": spaces_between_special_tokens}
    # vLLM slices `token_ids[:min_tokens]`; a negative min_tokens slices from the end the same way.
    head, state = detokenize_delta(tokenizer, ids[:min_tokens], seed, **kw)
    tail, _ = detokenize_delta(tokenizer, ids[min_tokens:], state, **kw)
    text = head + tail
    match = check_stop_strings(text, len(tail), stop_strings, p.include_stop_str_in_output)
    if match is None:
        return text, stop_reason
    stop_reason, truncate_to = match
    return (text if truncate_to == -1 else text[:truncate_to]), stop_reason
