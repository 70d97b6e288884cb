"""Shared pieces for XML-style tool arguments (`<parameter=k>v</parameter>`,
`<parameter name="k">v</parameter>`, ...): whitespace exactly as vLLM's `regex` module reads
`\\s`, prefix ("partial") matching of a closing marker split across chunks, and the open-value
extender that streams a parameter value in O(new text).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from render_service.parsers.base import REGEX_WS, json_string_body
from render_service.parsers.engine import ValueExt

# `\s` of the `regex` module for the stdlib `re`: the characters (escaped, for use inside a
# bracket expression) and the class.
WS_CHARS = "".join(re.escape(c) for c in sorted(REGEX_WS))
WS = "[" + WS_CHARS + "]"


def ws_pattern(pattern: str) -> str:
    """`pattern` with every `\\s` replaced by `WS` (stdlib `re` also matches U+001C..U+001F)."""
    return pattern.replace(r"\s", WS)


class PartialMatcher:
    """Does a text match, or could it still grow into a match of, one of some marker shapes?

    A shape is a sequence of literal strings and `None` (= `\\s*`); this answers
    `regex.fullmatch(text, partial=True)` for such alternations.
    """

    def __init__(self, *shapes: tuple[str | None, ...]) -> None:
        self.shapes = shapes

    def could_match(self, text: str) -> bool:
        return any(self._shape(shape, text) for shape in self.shapes)

    @staticmethod
    def _shape(shape: tuple[str | None, ...], text: str) -> bool:
        # positions: (piece index, offset inside a literal piece)
        states = {(0, 0)}
        for c in text:
            nxt: set[tuple[int, int]] = set()
            for piece, offset in _closure(shape, states):
                if piece >= len(shape):
                    continue
                lit = shape[piece]
                if lit is None:
                    if c in REGEX_WS:
                        nxt.add((piece, 0))
                elif lit[offset] == c:
                    nxt.add((piece, offset + 1) if offset + 1 < len(lit) else (piece + 1, 0))
            if not nxt:
                return False
            states = nxt
        return True


def _closure(shape: tuple[str | None, ...], states: set[tuple[int, int]]) -> set[tuple[int, int]]:
    out = set(states)
    for piece, offset in states:
        while offset == 0 and piece < len(shape) and shape[piece] is None:
            piece += 1
            out.add((piece, 0))
    return out


def end_window(text: str, ends: PartialMatcher) -> str:
    """The suffix of `text` (from its last `<`) that may still grow into a value end."""
    start = text.rfind("<")
    if start == -1:
        return ""
    tail = text[start:]
    return tail if ends.could_match(tail) else ""


def trim_wrapping_newlines(value: str) -> str:
    """One leading and one trailing newline are template markup (Qwen3 XML)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def value_extender_step(
    end_re: re.Pattern[str], ends: PartialMatcher, trim_newlines: bool
) -> Callable[[ValueExt, str], str | None]:
    """vLLM's `extend(delta)` closure of `_param_value_extender`, over a `ValueExt` state:
    the delta's JSON-escaped text, or None once the value's end shows up."""

    def step(ext: ValueExt, delta: str) -> str | None:
        text = ext.window + delta
        if "<" in text and end_re.search(text):  # every value end starts with "<"
            return None
        ext.window = end_window(text, ends)
        if trim_newlines:
            text = ext.held + delta
            if not ext.started and text:
                ext.started = True
                text = text.removeprefix("\n")
            ext.held = "\n" if text.endswith("\n") else ""
            text = text[: len(text) - len(ext.held)]
        else:
            text = delta
        return json_string_body(text)

    return step
