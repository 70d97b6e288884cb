"""Token-identical continuation: turn N+1's prompt reuses the ids the engine generated at turn N.

Re-rendering a conversation does not give back what the engine saw: Qwen3's template drops the
thinking of earlier replies, and re-tokenized text can differ from the generated ids. With
`--preserve-generated-tokens` and `"preserve_generated_tokens": true` in a chat request, derender
returns a signed handle with each assistant message (derender/generated.py keeps the ids), and a
later render splices those ids back in:

    prompt(N+1) = prompt(N) + generated(N) + suffix(N)

where suffix(N) is what the template renders after the assistant message (for Qwen3
`\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`; the `<|im_end|>` the model
generated is not repeated). Nothing about the template is assumed; the splice is worked out and
proven on every request:

1. the conversation is rendered once with each handled assistant message replaced by a sentinel
   (plain text, no reasoning, no tool calls); each sentinel must occur exactly once, in order. The
   text between two sentinels is what the template puts between those two replies.
2. the ids before each handled reply are rebuilt (earlier replies spliced in) and must have the
   length and digest of the prompt the engine saw for it (recorded in its handle). When the
   template's header for an earlier reply differs from its generation prompt (`enable_thinking:
   false` adds an empty think block), the generation prompt is tried in its place, and proven the
   same way.
3. the text after the last handled reply must end the ordinary render's ids too (what follows a
   reply does not depend on the reply).

Anything unproven falls back to the ordinary render (the vLLM-identical prompt), and the response
says why (`Continuation.reason`).

The next turn of a conversation on the same worker does less: the continued prompt of each request
is kept (`PromptMemo`, by the digest of its messages and template inputs), so turn N+1 takes turn
N's prompt when it has the digest the reply's handle names, appends the reply's ids, and renders
only the suffix, from a short anchor (the messages templates look back at), checked as in 3.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from render_service.render.history import anchor_indices

REQUEST_FIELD = "preserve_generated_tokens"  # chat request (render, and the derender's chat_request)
MESSAGE_FIELD = "generated_tokens_handle"  # assistant message (derender response; sent back by the client)
HEADER = "X-Render-Continuation"
BODY_FIELD = "continuation"  # the render response's report, only when the request asked for it

# Why a prompt does not extend the previous turn's prompt + output (metric label and `reason`).
FIRST_TURN = "first_turn"  # no assistant message yet
NO_HANDLE = "no_handle"  # the latest assistant message carries no handle
FOREIGN = "foreign"  # a handle signed with another key or for another configuration (model, template, ...)
MESSAGE_CHANGED = "message_changed"  # the message is not the one the handle was issued for
NOT_FOUND = "not_found"  # the ids are gone (expired, evicted, another replica without Redis)
PROMPT_MISMATCH = "prompt_mismatch"  # the rebuilt prompt before a reply is not the one the engine saw
UNPROVEN = "unproven"  # the template's rendering could not be split around the replies
UNSUPPORTED = "unsupported"  # a request the splice does not handle (see pipeline._continuation_blocker)
REASONS = (FIRST_TURN, NO_HANDLE, FOREIGN, MESSAGE_CHANGED, NOT_FOUND, PROMPT_MISMATCH, UNPROVEN, UNSUPPORTED)

_DIGEST_SIZE = 16


def asked(body: Any) -> bool:
    """Whether a chat request asks for continuation (the field is exactly `true`)."""
    return isinstance(body, dict) and body.get(REQUEST_FIELD) is True


def _text(value: Any) -> Any:
    """A message's content as text: None and "" alike; a list of text parts joined (as templates see
    it); without surrounding whitespace (where vLLM's streamed and batch parses differ: a stream's
    content may start with the blank line after `</think>`, the batch message's not)."""
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        value = "".join(str(p.get("text", "")) for p in value)
    return value.strip() if isinstance(value, str) else value


def message_digest(message: Mapping[str, Any]) -> bytes | None:
    """What a handle is bound to: content, reasoning and the tool calls' names and arguments, as
    the client sends the message back (tool-call ids and types are not the model's output here and
    clients rewrite them; surrounding whitespace is not compared, see `_text`). None for what JSON
    cannot hold."""
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    calls = message.get("tool_calls") or []
    try:
        wire_calls = [
            [call.get("function", {}).get("name"), call.get("function", {}).get("arguments")]
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
            else call
            for call in (calls if isinstance(calls, list) else [calls])
        ]
        encoded = orjson.dumps([_text(message.get("content")), _text(reasoning), wire_calls])
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.blake2b(encoded, digest_size=_DIGEST_SIZE).digest()


def _hasher() -> Any:
    return hashlib.blake2b(digest_size=_DIGEST_SIZE)


def _packed(ids: Sequence[int]) -> bytes:
    """Ids as little-endian uint32 (a digest over them extends id by id). OverflowError outside."""
    packed = array("I", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def pack_ids(ids: Sequence[int]) -> bytes | None:
    """Ids as 4 bytes each (how they are kept and hashed); None: not token ids."""
    try:
        return _packed(ids)
    except (OverflowError, TypeError):
        return None


def packed_digest(packed: bytes) -> bytes:
    hasher = _hasher()
    hasher.update(packed)
    return bytes(hasher.digest())


def unpack_ids(packed: bytes) -> list[int]:
    return _unpacked(packed)


def _unpacked(packed: bytes) -> list[int]:
    ids = array("I")
    ids.frombytes(packed)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids.tolist()


def ids_digest(ids: Sequence[int]) -> bytes | None:
    """The digest of a list of token ids (None: not ids)."""
    packed = pack_ids(ids)
    return None if packed is None else packed_digest(packed)


@dataclass(frozen=True)
class Generated:
    """One assistant turn as the engine saw it: its prompt (length and digest) and the ids it generated."""

    prompt_len: int
    prompt_digest: bytes
    ids: list[int]


@dataclass(frozen=True)
class Continuation:
    """The render's report: whether the prompt extends the previous turn's prompt + generated ids,
    how many leading ids it shares with ids the engine already saw, and why not."""

    prefix_extends: bool
    shared_tokens: int = 0
    spliced_turns: int = 0
    reason: str | None = None

    def header(self) -> str:
        """`prefix_extends=true; shared_tokens=812; spliced_turns=3` (`; reason=...` when false)."""
        fields = [
            f"prefix_extends={'true' if self.prefix_extends else 'false'}",
            f"shared_tokens={self.shared_tokens}",
            f"spliced_turns={self.spliced_turns}",
        ]
        if self.reason is not None:
            fields.append(f"reason={self.reason}")
        return "; ".join(fields)

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix_extends": self.prefix_extends,
            "shared_tokens": self.shared_tokens,
            "spliced_turns": self.spliced_turns,
            "reason": self.reason,
        }


@dataclass
class Lookup:
    """What the handler found for a request before rendering: per message index, the turn's ids or
    why there are none (one of REASONS). Filled in by derender/generated.py."""

    turns: dict[int, Generated | str]
    result: Continuation | None = None  # set by the render


def last_assistant(messages: Sequence[Any]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return index
    return -1


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    limit = min(len(a), len(b))
    low, high = 0, limit  # the longest equal prefix, by halving (slices compare in C)
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class MemoKeys:
    """Digests of a request's template inputs with its messages: all of them (`current`, what its
    prompt is kept under) and those before the latest reply (`previous`: the previous turn's)."""

    previous: bytes
    current: bytes


class PromptMemo:
    """Per worker: the prompt ids each recent continued request got, packed, by `MemoKeys.current`.
    The next turn of the conversation starts from its predecessor's instead of rebuilding every
    earlier turn (still proven: the ids must have the digest of the prompt the engine saw)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._prompts: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            packed = self._prompts.get(key)
            if packed is not None:
                self._prompts.move_to_end(key)
            return packed

    def clear(self) -> None:
        with self._lock:
            self._prompts.clear()
            self._bytes = 0

    def put(self, key: bytes, packed: bytes) -> None:
        if len(packed) > self.max_bytes // 4:
            return
        with self._lock:
            old = self._prompts.pop(key, None)
            self._bytes += len(packed) - (len(old) if old is not None else 0)
            self._prompts[key] = packed
            while self._bytes > self.max_bytes:
                _, evicted = self._prompts.popitem(last=False)
                self._bytes -= len(evicted)


def splice(
    messages: Sequence[dict[str, Any]],
    lookup: Lookup,
    ordinary_ids: list[int],
    render_text: Callable[[list[dict[str, Any]], bool], str],
    encode: Callable[[str], list[int]],
    added_tokens: Mapping[int, str],
    memo: PromptMemo | None = None,
    keys: MemoKeys | None = None,
) -> tuple[list[int], Continuation]:
    """The prompt ids with the generated ids of every handled reply spliced in, or `ordinary_ids`
    (the template's own render) with the reason when that cannot be proven.

    `render_text(messages, add_generation_prompt)`: the template's text for a message list with
    this request's tools and kwargs; `added_tokens`: id -> text of the tokenizer's added tokens;
    `memo`, `keys`: where the previous turn's prompt may be, and where this one's goes."""
    found = None
    if memo is not None and keys is not None:
        found = _from_previous(
            messages, lookup, ordinary_ids, render_text, encode, added_tokens, memo.get(keys.previous)
        )
    ids, result = found or _splice_all(messages, lookup, ordinary_ids, render_text, encode, added_tokens)
    if memo is not None and keys is not None:
        memo.put(keys.current, _packed(ids))
    return ids, result


def _from_previous(
    messages: Sequence[dict[str, Any]],
    lookup: Lookup,
    ordinary_ids: list[int],
    render_text: Callable[[list[dict[str, Any]], bool], str],
    encode: Callable[[str], list[int]],
    added_tokens: Mapping[int, str],
    previous: bytes | None,
) -> tuple[list[int], Continuation] | None:
    """The fast path: the previous turn's prompt (this worker's, for exactly the messages before
    the latest reply) when it is the one the reply's handle names, + the reply's ids + the suffix,
    rendered from a short anchor (history.anchor_indices) and proven against the ordinary render."""
    last = last_assistant(messages)
    turn = lookup.turns.get(last)
    if previous is None or not isinstance(turn, Generated) or len(previous) != 4 * turn.prompt_len:
        return None
    digest = _hasher()
    digest.update(previous)
    if digest.digest() != turn.prompt_digest:
        return None
    sentinel = f"RSGENERATED{secrets.token_hex(8)}N{last}E"
    part = [messages[i] for i in anchor_indices(messages, last)]
    part += [{"role": "assistant", "content": sentinel}, *messages[last + 1 :]]
    try:
        pieces = _split(render_text(part, True), [sentinel])
    except Exception:  # the full path gives the verdict
        return None
    if pieces is None:
        return None
    tail_ids = encode(pieces[1])
    if not tail_ids or ordinary_ids[len(ordinary_ids) - len(tail_ids) :] != tail_ids:
        return None
    ids = _unpacked(previous)
    shared = len(ids) + len(turn.ids)
    ids += turn.ids
    ids += encode(_after_reply(pieces[1], turn, added_tokens))
    spliced = sum(isinstance(value, Generated) for value in lookup.turns.values())
    return ids, Continuation(True, shared, spliced)


def _splice_all(
    messages: Sequence[dict[str, Any]],
    lookup: Lookup,
    ordinary_ids: list[int],
    render_text: Callable[[list[dict[str, Any]], bool], str],
    encode: Callable[[str], list[int]],
    added_tokens: Mapping[int, str],
) -> tuple[list[int], Continuation]:
    """Every handled reply spliced in, each turn's prompt rebuilt and proven (module docstring)."""
    last = last_assistant(messages)
    if last < 0:
        return ordinary_ids, Continuation(False, reason=FIRST_TURN)
    handled = sorted(i for i, turn in lookup.turns.items() if isinstance(turn, Generated))
    # The first handled reply that failed stops everything after it: later prompts contain it.
    failed = sorted(i for i, turn in lookup.turns.items() if isinstance(turn, str))
    first_failure = failed[0] if failed else None
    if first_failure is not None:
        handled = [i for i in handled if i < first_failure]
    # Why the latest reply is not spliced, when it is not.
    missing = str(lookup.turns[first_failure]) if first_failure is not None else NO_HANDLE
    if not handled:
        return ordinary_ids, Continuation(False, reason=missing)

    nonce = secrets.token_hex(8)
    sentinels = {index: f"RSGENERATED{nonce}N{index}E" for index in handled}
    stand_ins = [
        {"role": "assistant", "content": sentinels[i]} if i in sentinels else message
        for i, message in enumerate(messages)
    ]
    try:
        text = render_text(stand_ins, True)
    except Exception:  # a template that needs what the stand-in lacks: not provable
        return ordinary_ids, Continuation(False, reason=UNPROVEN)
    pieces = _split(text, [sentinels[i] for i in handled])
    if pieces is None:
        return ordinary_ids, Continuation(False, reason=UNPROVEN)

    ids: list[int] = []
    digest = _hasher()  # of `ids`, extended as they grow (each turn's check costs its new ids only)
    generation: list[str | None] = []  # the generation prompt, worked out on first need
    for position, index in enumerate(handled):
        turn = lookup.turns[index]
        assert isinstance(turn, Generated)
        before = pieces[position]
        if position > 0:
            before = _after_reply(before, lookup.turns[handled[position - 1]], added_tokens)
        added = _rebuilt_prompt(
            len(ids), digest, before, turn, encode, lambda: _generation_prompt(generation, stand_ins, render_text)
        )
        if added is None:
            return ordinary_ids, Continuation(False, _common_prefix(ordinary_ids, ids), position, PROMPT_MISMATCH)
        ids += added
        ids += turn.ids
        digest.update(_packed(added))
        digest.update(_packed(turn.ids))
    proven = len(ids)  # leading ids known to be ids the engine saw
    tail = pieces[-1]
    tail_ids = encode(tail)
    # What follows the last reply is the template's, whatever the reply: the ordinary render ends with it too.
    if not tail_ids or ordinary_ids[len(ordinary_ids) - len(tail_ids) :] != tail_ids:
        return ordinary_ids, Continuation(False, _common_prefix(ordinary_ids, ids), len(handled), UNPROVEN)
    ids.extend(encode(_after_reply(tail, lookup.turns[handled[-1]], added_tokens)))
    if handled[-1] != last:  # earlier replies are spliced, the latest is not
        return ids, Continuation(False, proven, len(handled), missing)
    return ids, Continuation(True, proven, len(handled))


def _split(text: str, sentinels: list[str]) -> list[str] | None:
    """[before the first, between each two, after the last], when each occurs once and in order."""
    pieces = []
    start = 0
    for sentinel in sentinels:
        if text.count(sentinel) != 1:
            return None
        at = text.find(sentinel, start)
        if at < 0:
            return None
        pieces.append(text[start:at])
        start = at + len(sentinel)
    pieces.append(text[start:])
    return pieces


def _after_reply(text: str, turn: Generated | str, added_tokens: Mapping[int, str]) -> str:
    """The text after a reply, without the closing token the model already generated (`<|im_end|>`)."""
    if isinstance(turn, Generated) and turn.ids:
        closing = added_tokens.get(turn.ids[-1])
        if closing and text.startswith(closing):
            return text[len(closing) :]
    return text


def _rebuilt_prompt(
    count: int,
    digest: Any,
    before: str,
    turn: Generated,
    encode: Callable[[str], list[int]],
    generation_prompt: Callable[[], str | None],
) -> list[int] | None:
    """The ids of the text before the reply, when the ids so far (`count` of them, hashed into
    `digest`) followed by them are exactly the prompt the engine saw; else those of the text with
    the reply's header replaced by the generation prompt (templates whose history header differs)."""
    added = encode(before)
    if _is_prompt(count, digest, added, turn):
        return added
    prompt = generation_prompt()
    if not prompt or before.endswith(prompt):
        return None
    for cut in range(len(prompt) - 1, 0, -1):  # the longest end of `before` that starts the generation prompt
        if before.endswith(prompt[:cut]):
            added = encode(before[: len(before) - cut] + prompt)
            return added if _is_prompt(count, digest, added, turn) else None
    return None


def _is_prompt(count: int, digest: Any, added: list[int], turn: Generated) -> bool:
    if count + len(added) != turn.prompt_len:
        return False
    extended = digest.copy()
    extended.update(_packed(added))
    return bool(extended.digest() == turn.prompt_digest)


def _generation_prompt(
    memo: list[str | None],
    messages: list[dict[str, Any]],
    render_text: Callable[[list[dict[str, Any]], bool], str],
) -> str | None:
    """What add_generation_prompt appends to this conversation (None: not a plain append)."""
    if not memo:
        try:
            with_prompt, without = render_text(messages, True), render_text(messages, False)
        except Exception:
            memo.append(None)
        else:
            memo.append(with_prompt[len(without) :] if with_prompt.startswith(without) else None)
    return memo[0]
