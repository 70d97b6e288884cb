"""Held text (`parsers/held.py`) and its segments (`derender/segments.py`): a parser state that
holds a call's text resumes identically whether the text travels inline or beside the snapshot,
and each snapshot writes only what was appended since the previous one."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec
import pytest

from render_service import parsers
from render_service.derender import segments
from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
from render_service.parsers.held import HeldText, StoredText, decode_hook, encode_hook, load_with
from render_service.server.metrics import Metrics


class _State(msgspec.Struct, array_like=True, tag="test/1"):
    n: int = 0
    held: HeldText = msgspec.field(default_factory=HeldText)


def test_held_text_appends_and_reads_back() -> None:
    held = HeldText("ab")
    held.append("")
    held.append("cdé")
    held.append("f")
    assert len(held) == 6 and bool(held)
    assert held.text() == "abcdéf"
    assert [held.tail(n) for n in (0, 1, 3, 10)] == ["", "f", "déf", "abcdéf"]
    assert held == HeldText("abcdéf") and held != HeldText("abcdé")
    assert not HeldText()


def test_plain_wire_form_is_the_text() -> None:
    state = _State(3, HeldText("x" * 2000))
    obj = msgspec.to_builtins(state, enc_hook=encode_hook())
    assert obj == ["test/1", 3, "x" * 2000]
    assert msgspec.convert(json.loads(json.dumps(obj)), _State, dec_hook=decode_hook) == state


def test_a_stored_index_needs_its_segment() -> None:
    with pytest.raises(msgspec.ValidationError, match="stored segment"):
        msgspec.convert(["test/1", 3, 0], _State, dec_hook=decode_hook)


def _store() -> SnapshotStore:
    return SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())


def _save(store: SnapshotStore, state: _State, position: int) -> tuple[Any, segments.SegmentWriter]:
    assert store.local is not None
    # As with Redis configured: the writer also lists each append (what Redis would be sent).
    writer = segments.SegmentWriter("f" * 16, "stream", position, store.local.segments)
    obj = msgspec.to_builtins(state, enc_hook=encode_hook(writer))
    return obj, writer


def _load(store: SnapshotStore, obj: Any, refs: list[list[Any]]) -> _State:
    assert store.local is not None
    stored: list[StoredText] = []
    for key, length, chars, digest in refs:
        text = store.local.segments.text(key, length, chars, digest)
        assert text is not None
        stored.append(text)
    return load_with(stored, lambda: msgspec.convert(obj, _State, dec_hook=decode_hook))


def test_short_text_stays_inline_and_long_text_moves_out_once() -> None:
    store = _store()
    state = _State(held=HeldText("a" * segments.INLINE_CHARS))
    obj, writer = _save(store, state, 1)
    assert obj[2] == "a" * segments.INLINE_CHARS and not writer.refs
    written = []
    text = "a" * segments.INLINE_CHARS
    for position in range(2, 40):
        piece = f"é{position}"  # multibyte: lengths are bytes in the ref, characters in the text
        state.held.append(piece)
        text += piece
        obj, writer = _save(store, state, position)
        assert obj[2] == 0  # the index of its ref
        (ref,) = writer.refs
        (write,) = writer.writes
        written.append(len(write.data))
        _key, length, chars, digest = ref
        assert chars == len(text) and length == len(text.encode())
        assert digest == hashlib.sha256(text.encode()).digest()
        state = _load(store, obj, writer.refs)
        assert state.held.text() == text
        assert state.held.tail(3) == text[-3:]
    assert written[0] > segments.INLINE_CHARS  # the first write moves the text out ...
    assert max(written[1:]) <= len("é40".encode())  # ... then each writes only its own piece


def test_a_retried_chunk_writes_the_same_bytes_and_both_branches_resolve() -> None:
    store = _store()
    base = _State(held=HeldText("b" * 600))
    obj, writer = _save(store, base, 1)
    resumed = _load(store, obj, writer.refs)
    resumed.held.append("first")
    obj1, writer1 = _save(store, resumed, 2)
    again = _load(store, obj, writer.refs)  # the same snapshot, loaded again (a retry)
    again.held.append("first")
    _, writer2 = _save(store, again, 2)
    assert writer1.refs == writer2.refs
    assert _load(store, obj1, writer1.refs).held.text() == "b" * 600 + "first"


def test_a_segment_written_over_by_another_attempt_is_not_used() -> None:
    store = _store()
    assert store.local is not None
    obj, writer = _save(store, _State(held=HeldText("c" * 600)), 1)
    first = _load(store, obj, writer.refs)
    first.held.append("one")
    _, writer_one = _save(store, first, 2)
    other = _load(store, obj, writer.refs)
    other.held.append("two")  # a different chunk from the same snapshot, same length
    _save(store, other, 2)
    key, length, chars, digest = writer_one.refs[0]
    assert store.local.segments.text(key, length, chars, digest) is None


def test_dsml_state_round_trips_through_a_segment() -> None:
    """A family state with a held field: loaded from its segment, it equals the inline form."""
    from render_service.parsers.deepseek_v32 import DeepSeekV32ToolState

    state = DeepSeekV32ToolState()
    state.held_args.append("x" * 3000)
    store = _store()
    writer = store.segment_writer("f" * 16, "s", 1)
    obj = msgspec.to_builtins(state, enc_hook=encode_hook(writer))
    assert len(json.dumps(obj)) < 1000
    assert store.local is not None
    ref = writer.refs[0]
    stored = [store.local.segments.text(*ref)]
    parser = parsers.tool_parser_class("deepseek_v32")
    loaded = load_with(stored, lambda: msgspec.convert(obj, parser.state_type, dec_hook=decode_hook))  # type: ignore[arg-type]
    assert loaded == state
