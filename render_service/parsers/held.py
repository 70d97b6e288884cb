"""Held text: what a parser must keep until it can emit it, stored beside the snapshot.

Some families hold a tool call's text until the call ends, because vLLM emits it only then
(granite4's buffered call, DSML's argument text between two `>`). In a plain `str` field that
text would be copied, encoded, signed and checked with the state on every chunk: ~1 µs per KB
held. A `HeldText` field is append-only instead. A snapshot stores only what was appended since
the previous one, in a segment beside it (`derender/segments.py`), and a resumed state reads the
text back only when the parser asks for all of it, so a chunk costs the same however much is held.

Wire forms (the msgspec hooks below): the plain `to_obj()` form is the text itself, so a state
round-trips through JSON as any other; a snapshot's form is whatever its `HeldSink` returns (the
text itself while it is short, else an index into the snapshot's list of stored segments, which
`load_with` makes available while the state is loaded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class StoredText(Protocol):
    """A stored, verified prefix of a held text (the snapshot layer's segment)."""

    @property
    def chars(self) -> int: ...

    def text(self) -> str: ...

    def tail(self, n: int) -> str: ...


class HeldText:
    """Append-only text in a parser state: a stored prefix (None when there is none) plus what
    was appended since. Replace the field with a new `HeldText()` to start over."""

    __slots__ = ("_chars", "_parts", "stored")

    def __init__(self, text: str = "", stored: StoredText | None = None) -> None:
        self.stored = stored
        self._parts = [text] if text else []
        self._chars = len(text)

    def append(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._chars += len(text)

    @property
    def appended(self) -> str:
        """The text appended since the stored prefix (all of it when there is none)."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def text(self) -> str:
        """All of it: O(length), for when the parser consumes the held text."""
        return self.stored.text() + self.appended if self.stored is not None else self.appended

    def tail(self, n: int) -> str:
        """The last `n` characters (O(n), whatever is held)."""
        if n <= 0:
            return ""
        out = ""
        for part in reversed(self._parts):
            out = part + out
            if len(out) >= n:
                return out[-n:]
        if self.stored is not None:
            out = self.stored.tail(n - len(out)) + out
        return out

    def __len__(self) -> int:
        return self._chars + (self.stored.chars if self.stored is not None else 0)

    def __bool__(self) -> bool:
        return self._chars > 0 or (self.stored is not None and self.stored.chars > 0)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeldText):
            return NotImplemented
        return len(self) == len(other) and self.text() == other.text()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"HeldText({self.text()!r})"


class HeldSink(Protocol):
    """Where a snapshot puts held text: held text up to `inline_chars` long that it has not
    stored yet stays inline (its text); `wire` gives the form of any other."""

    inline_chars: int

    def wire(self, held: HeldText) -> Any: ...


def _inline(obj: Any) -> Any:
    if isinstance(obj, HeldText):
        return obj.text()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def encode_hook(sink: HeldSink | None = None) -> Callable[[Any], Any]:
    """msgspec `enc_hook`: a `HeldText` as its text, or as `sink` stores it."""
    if sink is None:
        return _inline

    inline_chars = sink.inline_chars

    def hook(obj: Any) -> Any:
        if isinstance(obj, HeldText):
            # Inline without a call into the sink: every chunk of every stream passes here.
            if obj.stored is None and obj._chars <= inline_chars:
                return obj.appended
            return sink.wire(obj)
        raise NotImplementedError(f"cannot encode {type(obj).__name__}")

    return hook


_stored: ContextVar[Sequence[StoredText]] = ContextVar("held_stored", default=())


def load_with(stored: Sequence[StoredText], load: Callable[[], T]) -> T:
    """`load()` (which decodes a state) with the stored segments its held-text indexes name."""
    if not stored:
        return load()
    token = _stored.set(stored)
    try:
        return load()
    finally:
        _stored.reset(token)


def decode_hook(type_: type, obj: Any) -> Any:
    """msgspec `dec_hook`: a `HeldText` from its text or from a stored segment's index."""
    if type_ is HeldText:
        if isinstance(obj, str):
            return HeldText(obj)
        if type(obj) is int:
            stored = _stored.get()
            if 0 <= obj < len(stored):
                return HeldText(stored=stored[obj])
            raise ValueError("held text names a stored segment the snapshot does not carry")
    raise TypeError(f"cannot decode {type_!r} from {type(obj).__name__}")


class HoldsBlankContent(Protocol):
    """A state with the blank-content hold of `content_before_calls`."""

    released: bool  # content other than whitespace went out
    ws: str  # whitespace-only content so far


def content_before_calls(st: HoldsBlankContent, text: str) -> str:
    """Content before the calls: whitespace-only content is held (batch drops it when calls
    follow) until other text releases it with the rest."""
    if st.released or not text:
        return text
    if text.isspace():
        st.ws += text
        return ""
    st.released = True
    out, st.ws = st.ws + text, ""
    return out
