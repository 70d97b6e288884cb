"""Incremental templating: turn N+1 re-templates only what it adds to turn N's conversation.

An agent re-sends its whole history every turn. When this worker rendered the previous turn
(the prefix guard holds its prompt, found by a digest of the messages before the latest assistant
reply), the new prompt is that prompt without its generation prompt, followed by the text the
template renders for the new messages. That text is rendered from a short *anchor* instead of the
whole history: the leading system message, the user messages before the new ones, and the
message right before them (what templates look back at: a system block, the last user query, a
tool-result group), then the new messages:

    prompt = previous_prompt[:-len(generation_prompt)] + render(anchor + new)[len(render(anchor)):]

Whether that equals a full render depends on the template (Qwen3 drops earlier thinking when a new
user message arrives; some templates number messages or look at the last index). So nothing is
assumed: for each template fingerprint (template, tools, kwargs) and each *shape* of turn (the kind
of each new message and of the message before them, and the set of kinds in the history; a kind is
role, tool calls or not, thinking or not, markup `<` in the content or not), the first incremental
render is checked against a full render and the verdict kept; a shape that differed always renders
in full. Every `verify_every`-th incremental render is checked again, and a difference revokes the
verdict (counted in `HistoryStats.mismatches`). This is evidence, not a proof: a template whose
output for the new messages depends on history content that no kind captures could pass the first
check of a shape and differ later (until the next periodic check); the property test over the
fixtures' templates (tests/render/test_history.py) found none. Requests with media, developer
messages the template folds, offsets, BOS/EOS, or a renderer that tokenizes itself render in full.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("render_service.render.history")

# Render(conversation, add_generation_prompt) -> prompt text, with everything else fixed.
RenderFn = Callable[[list[dict[str, Any]], bool], str]
Convert = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]

_MAX_VERDICTS = 4096


@dataclass(frozen=True)
class HistoryStats:
    incremental: int  # prompts rendered from the previous prompt + the new messages
    full: int  # prompts with a previous prompt that were rendered in full (no verdict, or a negative one)
    verified: int  # incremental renders checked against a full render
    mismatches: int  # of those, the ones that differed (the shape then renders in full)


class HistoryRenderer:
    """Per-worker verdicts and counters; the previous prompts themselves are the prefix guard's."""

    def __init__(self, verify_every: int = 64) -> None:
        self.verify_every = verify_every
        self._verdicts: OrderedDict[tuple[Any, ...], bool] = OrderedDict()
        # The generation prompt per fingerprint (what add_generation_prompt appends).
        self._generation: dict[int, str] = {}
        self._lock = threading.Lock()
        self._since_check = 0
        self.incremental = self.full = self.verified = self.mismatches = 0

    def render(
        self,
        fingerprint: int,
        previous_prompt: str,
        messages: Sequence[dict[str, Any]],
        start: int,
        convert: Convert,
        render: RenderFn,
        render_full: Callable[[], str],
        add_generation_prompt: bool,
        known: HistoryFacts | None = None,
    ) -> str:
        """The prompt of `messages`, whose first `start` messages were the previous turn's request
        (rendered as `previous_prompt`). `render_full()` is the reference full render. `known`: the
        facts of those `start` messages (kept with the previous prompt), else they are read here."""
        if known is not None and known.count != start:
            known = None
        anchor = anchor_indices(messages, start, known.users if known is not None else None)
        shape = (fingerprint, add_generation_prompt, *_shape(messages, start, known.kinds if known else None))
        with self._lock:
            verdict = self._verdicts.get(shape)
            if verdict is True:
                self._since_check += 1
                check = self._since_check >= self.verify_every
                if check:
                    self._since_check = 0
            else:
                check = verdict is None
        if verdict is False:
            return self._count_full(render_full())
        try:
            incremental = self._incremental(
                fingerprint, previous_prompt, messages, start, anchor, convert, render, add_generation_prompt
            )
        except Exception:  # the full render gives the exact result or error
            incremental = None
        if incremental is None:
            return self._count_full(render_full())
        if not check:
            with self._lock:
                self.incremental += 1
            return incremental
        expected = render_full()
        same = expected == incremental
        with self._lock:
            self.verified += 1
            self.full += 1
            if not same:
                self.mismatches += 1
            self._verdicts[shape] = same
            self._verdicts.move_to_end(shape)
            while len(self._verdicts) > _MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        if not same and verdict is True:
            logger.warning("incremental templating differed from a full render on a verified shape; turned off for it")
        return expected

    def _count_full(self, prompt: str) -> str:
        with self._lock:
            self.full += 1
        return prompt

    def _incremental(
        self,
        fingerprint: int,
        previous_prompt: str,
        messages: Sequence[dict[str, Any]],
        start: int,
        anchor: list[int],
        convert: Convert,
        render: RenderFn,
        add_generation_prompt: bool,
    ) -> str | None:
        conversation = convert([messages[i] for i in anchor] + list(messages[start:]))
        if len(conversation) != len(anchor) + len(messages) - start:
            return None  # the conversion merged or dropped messages: positions no longer line up
        anchor_text = render(conversation[: len(anchor)], False)
        rendered = render(conversation, add_generation_prompt)
        if not rendered.startswith(anchor_text):
            return None
        generation = self._generation_prompt(fingerprint, conversation, render, rendered, add_generation_prompt)
        if generation is None or not previous_prompt.endswith(generation):
            return None
        history = previous_prompt[: len(previous_prompt) - len(generation)] if generation else previous_prompt
        return history + rendered[len(anchor_text) :]

    def _generation_prompt(
        self,
        fingerprint: int,
        conversation: list[dict[str, Any]],
        render: RenderFn,
        rendered: str,
        add_generation_prompt: bool,
    ) -> str | None:
        """What add_generation_prompt=True appended to the previous prompt (learned once per fingerprint)."""
        with self._lock:
            known = self._generation.get(fingerprint)
        if known is not None:
            return known
        plain = render(conversation, False)
        with_prompt = rendered if add_generation_prompt else render(conversation, True)
        if not with_prompt.startswith(plain):
            return None
        generation = with_prompt[len(plain) :]
        with self._lock:
            if len(self._generation) >= _MAX_VERDICTS:
                self._generation.clear()
            self._generation[fingerprint] = generation
        return generation

    def stats(self) -> HistoryStats:
        with self._lock:
            return HistoryStats(self.incremental, self.full, self.verified, self.mismatches)


@dataclass(frozen=True)
class HistoryFacts:
    """What a render reads from every message of a request, kept with its prompt (prefix.PromptRecord)
    so that the next turn, whose history is byte for byte that request's messages, reads only the
    messages it adds: the kinds of messages (see `_kind`), where the user messages are (the anchor),
    and how many tool calls the assistant made (`parse_context.history_tool_call_cnt`)."""

    count: int  # messages described
    kinds: frozenset[tuple[Any, ...]]
    users: tuple[int, ...]
    tool_calls: int


def history_facts(messages: Sequence[dict[str, Any]], known: HistoryFacts | None = None) -> HistoryFacts:
    """The facts of `messages`; `known`: those of its first `known.count` messages (the caller
    proved them the same messages), so only the rest are read."""
    start = 0 if known is None or known.count > len(messages) else known.count
    kinds = set() if start == 0 or known is None else set(known.kinds)
    users = [] if start == 0 or known is None else list(known.users)
    calls = 0 if start == 0 or known is None else known.tool_calls
    for index in range(start, len(messages)):
        message = messages[index]
        kinds.add(_kind(message))
        role = message.get("role")
        if role == "user":
            users.append(index)
        elif role == "assistant":
            tool_calls = message.get("tool_calls")
            if tool_calls is not None:
                calls += len(tool_calls) if isinstance(tool_calls, list) else 1
    return HistoryFacts(len(messages), frozenset(kinds), tuple(users), calls)


def anchor_indices(messages: Sequence[dict[str, Any]], start: int, users: Sequence[int] | None = None) -> list[int]:
    """The leading system/developer message, every user message before `start`, and the message
    right before `start`: what templates look back at when they render the new messages (a system
    block, the last user query, which Qwen3 finds by skipping tool results sent as user messages,
    a tool-result group). `users`: the indices of the user messages before `start`, when known."""
    if users is None:
        indices = [i for i in range(start) if messages[i].get("role") == "user"]
    else:
        indices = list(users)
    if start > 0 and messages[0].get("role") in ("system", "developer") and 0 not in indices:
        indices.insert(0, 0)
    if start > 0 and start - 1 not in indices:
        indices.append(start - 1)
    return indices


def _shape(
    messages: Sequence[dict[str, Any]], start: int, history: frozenset[tuple[Any, ...]] | None = None
) -> tuple[Any, ...]:
    """What a verdict is about: the kind of each new message, of the message before them, and the
    set of kinds in the history (a template that drops thinking or parses markup out of earlier
    messages changes the history only when there is thinking or markup to drop). `history`: that
    set, when known."""
    new = tuple(_kind(message) for message in messages[start:])
    before = _kind(messages[start - 1]) if start > 0 else None
    if history is None:
        history = frozenset(_kind(message) for message in messages[:start])
    return (new, before, history)


def _kind(message: dict[str, Any]) -> tuple[Any, ...]:
    content = message.get("content")
    markup = "<" in content if isinstance(content, str) else None
    return (message.get("role"), bool(message.get("tool_calls")), bool(message.get("reasoning")), markup)
