"""The prefix-stability guard: does this turn's prompt extend the previous turn's prompt + output?

Prefix caching and bidirectional KV transfer assume turn N+1's prompt starts with turn N's
prompt followed by what the model generated. Re-rendering breaks that silently when the
template drops history (Qwen3 drops the thinking of every turn before the latest user message),
when the template or its inputs change (tools, kwargs), or when re-tokenized text merges across
the old end of the prompt. This guard notices it, per worker and cheaply:

- every chat render records its prompt under a digest of its messages (a bounded LRU);
- the next turn's request carries those messages, then the assistant reply and new input, so the
  digest of the messages before its last assistant message finds the previous prompt;
- the new prompt text must start with the previous one, and the new ids with the previous ids
  (checked on the ids after the previous prompt's last added token only: up to there, ids follow
  from the text, see segments.py); the previous reply's thinking must appear after it.

The result travels as a response header (`X-Render-Prefix`, see `PrefixCheck.header`), so the JSON
body stays vLLM's; `/metrics` counts checks by status and breaks by cause. It cannot see the ids the
engine generated (only the text the client sends back), so drift inside the reply's own tokens is
not detected here.
"""

from __future__ import annotations

import secrets
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from render_service.render.history import HistoryFacts
from render_service.render.segments import Marks, SegmentEncoder, Segmenter, head_of

HEADER = "X-Render-Prefix"

EXTENDS = "extends"
BREAKS = "breaks"
FIRST = "first"  # no assistant message yet: nothing to extend
UNKNOWN = "unknown"  # the previous turn was not rendered by this worker (or was evicted)
SKIPPED = "skipped"  # not checked: prompt ids forwarded, images, continuation of the last message

TEMPLATE_CHANGED = "template_changed"  # template, tools or template kwargs differ from the previous turn
THINKING_DROPPED = "thinking_dropped"  # a reply's thinking is not in the new prompt
RETOKENIZATION = "retokenization"  # same text, different ids at the old end of the prompt
HISTORY_CHANGED = "history_changed"  # the earlier prompt's text was rendered differently (other reasons)
CAUSES = (TEMPLATE_CHANGED, THINKING_DROPPED, RETOKENIZATION, HISTORY_CHANGED)
STATUSES = (EXTENDS, BREAKS, FIRST, UNKNOWN, SKIPPED)

_RECORD_OVERHEAD = 200
_BYTES_PER_ID = 36


@dataclass(frozen=True)
class PrefixCheck:
    status: str
    cause: str | None = None
    shared_tokens: int | None = None  # ids this prompt shares with the start of the previous one
    previous_tokens: int | None = None

    def header(self) -> str:
        """`status=breaks; cause=thinking_dropped; shared_tokens=812; previous_tokens=4096`."""
        fields = [f"status={self.status}"]
        if self.cause is not None:
            fields.append(f"cause={self.cause}")
        if self.shared_tokens is not None:
            fields.append(f"shared_tokens={self.shared_tokens}")
        if self.previous_tokens is not None:
            fields.append(f"previous_tokens={self.previous_tokens}")
        return "; ".join(fields)


SKIP = PrefixCheck(SKIPPED)


@dataclass
class PromptRecord:
    """One rendered prompt, as the next turn needs it. `ids` holds the whole prompt's ids when a
    later prompt may copy them (the segment cache is on) or when ids do not follow from text."""

    text: str
    head: str  # text up to the end of its last added token
    head_ids: int
    tail_ids: list[int]  # the ids after the head
    token_count: int
    fingerprint: int
    ids: list[int] = field(default_factory=list)
    validated: bool = False  # see Turn.validated
    messages: bytes = b""  # the request's messages as `history_key` encodes them (a hit is compared to them)
    ids_json: bytes = b""  # the JSON of `ids` (encoded_ids.py), or empty
    json_head: int = 0  # bytes of `ids_json` that write ids[:head_ids] (no comma or bracket after); 0: none
    facts: HistoryFacts | None = None  # what the render read from every message (history.py)
    marks: Marks | None = (
        None  # where each added token ends (segments.py), for a later prompt that shares less than the head
    )

    @property
    def size(self) -> int:
        ids = len(self.ids) + len(self.tail_ids)
        held = len(self.messages) + len(self.ids_json)
        if self.facts is not None:
            held += 8 * len(self.facts.users) + 100 * len(self.facts.kinds)
        if self.marks is not None:
            held += 16 * len(self.marks.chars)
        return sys.getsizeof(self.text) + held + _RECORD_OVERHEAD + _BYTES_PER_ID * ids


# The digests only find a record; a hit is then compared byte for byte with the messages (`lookup`),
# so a collision can never hand out another conversation's prompt. Seeded per process: no one can
# aim requests at one slot.
_DIGEST_SEED = secrets.randbits(64)


@dataclass(frozen=True)
class HistoryKey:
    """Digests of a request's messages: all of them (`key`, what its prompt is recorded under) and
    those before the latest assistant reply (`previous_key`, the previous turn's `key`)."""

    key: bytes
    previous_key: bytes
    reply_index: int  # -1: no assistant message
    encoded: bytes = b""  # the messages' orjson encoding (`orjson.dumps(messages)`, closing bracket included)
    previous_length: int = (
        0  # bytes of `encoded` before the latest reply: the previous turn's `encoded` without its "]"
    )

    def extends(self, previous: bytes) -> bool:
        """Whether `previous` (an earlier request's `encoded`) is the encoding of exactly the messages
        before the latest reply: its bytes but the closing bracket start `encoded` (a memcmp, no copy)."""
        return len(previous) - 1 == self.previous_length and self.encoded.startswith(memoryview(previous)[:-1])


def history_key(messages: Any) -> HistoryKey | None:
    """The digests, or None when the messages are not a list of JSON objects (validation answers)."""
    if not isinstance(messages, list):
        return None
    reply_index = -1
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict):
            return None
        if message.get("role") == "assistant":
            reply_index = index
            break
    # The list's encoding starts with the encoding of each of its prefixes without the closing
    # bracket, and an encoding of whole JSON values ends where a message ends. So one orjson call
    # encodes the messages, a second one the few from the reply on, which tells where the history
    # ends; both digests are taken over views of that one buffer (no copies of ~100 KB).
    split = max(reply_index, 0)
    try:
        encoded = orjson.dumps(messages)
        after = orjson.dumps(messages[split:]) if split else encoded
    except (TypeError, orjson.JSONEncodeError):
        return None
    # "[" + history + "," + rest + "]" against "[" + rest + "]": the difference is "[" + history.
    history_length = len(encoded) - len(after) if split else 1
    view = memoryview(encoded)
    hasher = xxhash.xxh3_128(view[:history_length], _DIGEST_SEED)
    previous_key = hasher.digest()
    if history_length == len(encoded) - 1:  # nothing after the history
        return HistoryKey(previous_key, previous_key, reply_index, encoded, history_length)
    hasher.update(view[history_length:-1])
    return HistoryKey(hasher.digest(), previous_key, reply_index, encoded, history_length)


@dataclass
class Turn:
    """What `PrefixGuard.begin` found for a request, handed back to `finish`."""

    key: bytes  # the digest this turn's prompt is stored under
    fingerprint: int
    previous: PromptRecord | None
    status: str | None  # FIRST/UNKNOWN/SKIPPED decided before rendering, else None
    reply: dict[str, Any] | None  # the assistant message that answered the previous prompt
    history: list[dict[str, Any]]  # messages up to and including that reply
    check: PrefixCheck | None = None  # the verdict, once rendered
    validated: bool = False  # its messages passed chat validation unchanged (a later turn may skip them)
    messages: bytes = b""  # HistoryKey.encoded: what the record is compared with when found
    facts: HistoryFacts | None = None  # of the messages, once read (`facts` in pipeline.py)


class PrefixGuard:
    """Per-worker records of recent prompts, and the check of each new prompt against its predecessor."""

    def __init__(
        self,
        segmenter: Segmenter | None,
        encode: Any,
        max_bytes: int = 32 << 20,
        max_entries: int = 4096,
        keep_ids: bool = False,
    ) -> None:
        # Ids follow from text up to an added token only when the tokenizer passed the segment self-test.
        self._segmenter = segmenter if segmenter is not None and not segmenter.nested else None
        self._encode = encode
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._keep_ids = keep_ids or self._segmenter is None
        self._records: OrderedDict[bytes, PromptRecord] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.statuses = dict.fromkeys(STATUSES, 0)
        self.causes = dict.fromkeys(CAUSES, 0)

    # -- before rendering -------------------------------------------------------------------

    def begin(
        self,
        messages: Sequence[dict[str, Any]],
        fingerprint: int,
        checkable: bool = True,
        key: HistoryKey | None = None,
    ) -> Turn | None:
        """Find the previous turn of this conversation. None: the request is not recorded at all.
        `key`: the messages' digests when the caller took them already (before validation)."""
        if key is None:
            key = history_key(messages)
            if key is None:
                return None
        if not checkable:
            return Turn(key.key, fingerprint, None, SKIPPED, None, [], messages=key.encoded)
        if key.reply_index < 0:
            return Turn(key.key, fingerprint, None, FIRST, None, [], messages=key.encoded)
        previous = self.lookup(key)
        status = None if previous is not None else UNKNOWN
        reply_index = key.reply_index
        history = list(messages[: reply_index + 1])
        return Turn(key.key, fingerprint, previous, status, messages[reply_index], history, messages=key.encoded)

    def lookup(self, key: HistoryKey) -> PromptRecord | None:
        """The prompt of the request made of the messages before the latest assistant reply."""
        if key.reply_index < 0:
            return None
        with self._lock:
            previous = self._records.get(key.previous_key)
            if previous is not None:
                self._records.move_to_end(key.previous_key)
        # The digest found it; the messages themselves decide (a memcmp, no copy).
        if previous is None or not key.extends(previous.messages):
            return None
        return previous

    # -- after rendering --------------------------------------------------------------------

    def head_of(self, text: str, ids: list[int]) -> tuple[int, int]:
        """(characters, ids) up to the end of the prompt's last added token, for a prompt encoded whole."""
        if self._segmenter is None:
            return 0, 0
        return head_of(self._segmenter, text, ids, self._encode)

    def finish(
        self,
        turn: Turn,
        text: str,
        ids: list[int],
        head_chars: int,
        head_ids: int,
        ids_json: bytes = b"",
        json_head: int = 0,
        marks: Marks | None = None,
        copied: int = 0,
    ) -> PrefixCheck:
        """Check the new prompt against the previous one, record it, count the outcome.
        `ids_json`: the JSON of `ids`, whose first `json_head` bytes write `ids[:head_ids]` (see
        encoded_ids.py), for the next turn; `marks`: where its added tokens end (segments.py);
        `copied`: its first ids are copies of the previous prompt's (the shared count is no less)."""
        check = self._check(turn, text, ids, copied) if turn.status is None else PrefixCheck(turn.status)
        if turn.status != SKIPPED:
            self._store(
                turn.key,
                PromptRecord(
                    text=text,
                    head=text[:head_chars],
                    head_ids=head_ids,
                    tail_ids=ids[head_ids:],
                    token_count=len(ids),
                    fingerprint=turn.fingerprint,
                    ids=ids if self._keep_ids else [],
                    validated=turn.validated,
                    messages=turn.messages,
                    ids_json=ids_json if json_head else b"",
                    json_head=json_head,
                    marks=marks,
                    facts=turn.facts,
                ),
            )
        self.count(check)
        return check

    def count(self, check: PrefixCheck) -> None:
        with self._lock:
            self.statuses[check.status] += 1
            if check.cause is not None:
                self.causes[check.cause] += 1

    def _check(self, turn: Turn, text: str, ids: list[int], copied: int = 0) -> PrefixCheck:
        previous = turn.previous
        assert previous is not None
        count = previous.token_count
        if text.startswith(previous.text) and self._ids_extend(previous, text, ids):
            if _thinking_dropped([turn.reply] if turn.reply else [], text[len(previous.text) :]):
                return PrefixCheck(BREAKS, THINKING_DROPPED, count, count)
            return PrefixCheck(EXTENDS, None, count, count)
        shared = self._shared_tokens(previous, text, ids, copied)
        if turn.fingerprint != previous.fingerprint:
            cause = TEMPLATE_CHANGED
        elif text.startswith(previous.text):
            cause = RETOKENIZATION
        elif _thinking_dropped(turn.history, text, previous.text):
            cause = THINKING_DROPPED
        else:
            cause = HISTORY_CHANGED
        return PrefixCheck(BREAKS, cause, shared, count)

    def _ids_extend(self, previous: PromptRecord, text: str, ids: list[int]) -> bool:
        if len(ids) < previous.token_count:
            return False
        if self._segmenter is None:  # ids do not follow from text: compare them all
            return ids[: previous.token_count] == previous.ids
        # The text starts with previous.head, so the ids start with its head ids (segments.py).
        return ids[previous.head_ids : previous.token_count] == previous.tail_ids

    def _shared_tokens(self, previous: PromptRecord, text: str, ids: list[int], copied: int = 0) -> int:
        """How many ids the two prompts share at the start (on a break only: it re-encodes).
        `copied`: the first ids are copies of `previous.ids`' (the search starts there)."""
        before = previous.ids if previous.ids else self._encode(previous.text, False)
        limit = min(len(before), len(ids))
        low = copied if previous.ids and copied <= limit else 0
        high = limit  # the longest equal prefix, by halving (list slices compare in C)
        while low < high:
            middle = (low + high + 1) // 2
            if ids[low:middle] == before[low:middle]:
                low = middle
            else:
                high = middle - 1
        return low

    def _store(self, key: bytes, record: PromptRecord) -> None:
        size = record.size
        if size > self.max_bytes // 4:
            return
        with self._lock:
            old = self._records.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._records[key] = record
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._records) > self.max_entries:
                _, evicted = self._records.popitem(last=False)
                self._bytes -= evicted.size

    def stats(self) -> tuple[dict[str, int], dict[str, int], int, int]:
        """(checks by status, breaks by cause, records held, their bytes)."""
        with self._lock:
            return dict(self.statuses), dict(self.causes), len(self._records), self._bytes


def _thinking_dropped(messages: Sequence[dict[str, Any]], text: str, before: str | None = None) -> bool:
    """Whether the thinking of an assistant message is missing from `text` (and, when given, was in `before`).

    Latest message first: the answer is the same in any order, and where a template drops thinking
    it drops that of the replies just before the new user message too, so the first dropped one is
    found after a search or two instead of a search of the whole prompt per earlier reply (Qwen3 at
    turn 31 of the agent benchmark: 20 replies whose thinking was already gone from both prompts)."""
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        reasoning = message.get("reasoning")
        if not isinstance(reasoning, str):
            reasoning = message.get("reasoning_content")
        if not isinstance(reasoning, str) or not reasoning.strip():
            continue
        needle = reasoning.strip()
        if needle not in text and (before is None or needle in before):
            return True
    return False


def guard_for(segments: SegmentEncoder | None, segmenter: Segmenter | None, encode: Any) -> PrefixGuard:
    """The guard for a context: it keeps whole prompts' ids when the segment cache can copy them."""
    if segments is not None:
        return PrefixGuard(segments.segmenter, encode, max_bytes=segments.max_bytes, keep_ids=segments.reuses_prefixes)
    return PrefixGuard(segmenter, encode)


# A conversation that grows the way agents and chats grow: a reply with thinking and a tool call,
# its result, then a new user message (where templates such as Qwen3's drop earlier thinking).
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Look a word up.", "parameters": {"type": "object"}},
}
_PROBE_TURNS: tuple[tuple[str, list[dict[str, Any]]], ...] = (
    ("first turn", [{"role": "user", "content": "Look up 'prefix' for me."}]),
    (
        "after a tool call with thinking",
        [
            {
                "role": "assistant",
                "content": "",
                "reasoning": "The user wants a definition; I will call lookup.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"w": "prefix"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "prefix: a beginning"},
        ],
    ),
    (
        "after a reply with thinking and a new user message",
        [
            {"role": "assistant", "content": "A prefix is a beginning.", "reasoning": "The tool answered; summarise."},
            {"role": "user", "content": "Thanks. And 'suffix'?"},
        ],
    ),
)


def history_probe(render_chat: Any, guard: PrefixGuard) -> list[tuple[str, PrefixCheck]]:
    """Each probe turn's verdict: where the template does not extend the previous prompt + reply
    (`render_chat(body, prefix_checks=...)`: the render, e.g. `functools.partial(pipeline.render_chat, ctx)`)."""
    messages: list[dict[str, Any]] = []
    verdicts = []
    for label, added in _PROBE_TURNS:
        messages = [*messages, *added]
        checks: list[PrefixCheck] = []
        body = {"messages": [dict(m) for m in messages], "tools": [_PROBE_TOOL], "tool_choice": "none"}
        render_chat(body, prefix_checks=checks)
        if checks:
            verdicts.append((label, checks[0]))
    return verdicts
