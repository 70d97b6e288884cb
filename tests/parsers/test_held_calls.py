"""Held calls (`parsers/held_calls.py`): for the all-or-nothing tool parsers (hermes, granite4,
pythonic) the stream, under any chunking and with the state JSON round-tripped between chunks,
accumulates to the batch answer (`ChatParser`'s rules for blank content included); markers split
anywhere, whitespace before the calls, and a state resumed mid-hold from a snapshot's segment."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from render_service.parsers import granite4, hermes, llama3_json, pythonic
from render_service.parsers.base import RequestOptions
from render_service.parsers.held import HeldText, decode_hook, encode_hook, load_with

AUTO = RequestOptions(tool_choice="auto", has_tools=True)
REQUIRED = RequestOptions(tool_choice="required", has_tools=True)

CALL = '{"name": "f", "arguments": {"a": "x é 😀", "n": 1}}'
LOOSE = '{"arguments":{"a":"\\u00e9"},"name":"g"}'
HERMES = [
    "",
    "hi",
    "\n\n",
    "ok <tool_call>" + CALL + "</tool_call>",
    "\n\n<tool_call>\n" + CALL + "\n</tool_call>\n<tool_call>" + LOOSE + "</tool_call> after",
    "a <tool_call>" + CALL + "</tool_call><tool_call>{bad</tool_call>",
    "<tool_call>" + CALL,  # unclosed but valid: a call
    "<tool_call>" + CALL[:-3],  # unclosed, cut: content
    "x <tool_ca",  # a split tag at the end is content
    " <tool_call>oops</tool_call>",
]
GRANITE4 = [
    "a <tool_call>" + CALL + "</tool_call> b <tool_call>" + LOOSE + "</tool_call>\n",
    "\n<tool_call>" + CALL + "</tool_call>",
    "x </tool_call> y <tool_call>" + CALL + "</tool_call>",  # an end tag first: all content
    "</tool_c",
    "a <tool_call>" + CALL,  # unterminated: all content
    "a <tool_call></tool_call>",
]
PYTHONIC = ["[f(a='x', n=1), g(b=[1, 2])]", "[f(a='x')] tail", "plain [f()]", "", "[f(a=1"]
LLAMA_JSON = [
    "<|python_tag|>" + CALL + "; " + LOOSE,
    CALL + "; " + CALL + " done",  # text after the list: dropped with calls
    CALL + "; {bad",  # one malformed object: all content
    "<|python_tag|>" + CALL[:-3],  # cut: content
    "Sure: " + CALL,  # content first: content (batch follows the stream, ACC.md rule 2)
    "<|python_ta",  # a split tag at the end is content
    "<|python_tag|> no objects",
    "\n" + CALL,
    "",
]


def _batch(parser: Any, text: str, opts: RequestOptions) -> dict[str, Any]:
    """What `ChatParser._extract_tool_calls` makes of the batch extractor's answer."""
    called, calls, content = parser.extract_tool_calls(text)
    if called:
        if content is not None and not content.strip():
            content = None
        return {"content": content or "", "calls": [[c.name, c.arguments] for c in calls]}
    if opts.forces_tool_calls and not text.strip():
        return {"content": "", "calls": []}
    return {"content": text, "calls": []}


def _stream(parser: Any, text: str, sizes: list[int], opts: RequestOptions) -> dict[str, Any]:
    st = parser.new_state()
    content, names, args = "", {}, {}
    deltas = []
    i = k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        deltas.append(parser.feed(st, text[i : i + n], lambda j: f"id{j}"))
        st = parser.load_state(json.loads(msgspec.json.encode(st, enc_hook=encode_hook())))
        i, k = i + n, k + 1
    deltas.append(parser.finish_for_request(st, lambda j: f"id{j}", opts))
    for delta in deltas[:-1]:
        assert delta is None or not delta.tool_calls  # calls only at the end
    for delta in deltas:
        if delta is None:
            continue
        content += delta.content or ""
        for tc in delta.tool_calls:
            if tc.name is not None:
                names[tc.index] = tc.name
            args[tc.index] = args.get(tc.index, "") + (tc.arguments or "")
    return {"content": content, "calls": [[names[j], args[j]] for j in sorted(names)]}


@pytest.mark.parametrize(
    ("parser", "texts"),
    [
        (hermes.HermesToolParser.__new__(hermes.HermesToolParser), HERMES),
        (granite4.Granite4ToolParser.__new__(granite4.Granite4ToolParser), GRANITE4),
        (pythonic.PythonicToolParser.__new__(pythonic.PythonicToolParser), PYTHONIC),
        (pythonic.Llama4PythonicToolParser.__new__(pythonic.Llama4PythonicToolParser), PYTHONIC),
        (llama3_json.Llama3JsonToolParser.__new__(llama3_json.Llama3JsonToolParser), LLAMA_JSON),
    ],
)
@pytest.mark.parametrize("opts", [AUTO, REQUIRED])
def test_stream_accumulates_to_batch_under_any_chunking(parser: Any, texts: list[str], opts: RequestOptions) -> None:
    for text in texts:
        want = _batch(parser, text, opts)
        for sizes in [[1], [2], [3, 1], [len(text) or 1], *([random.Random(s).randint(1, 7)] for s in range(20))]:
            assert _stream(parser, text, sizes, opts) == want, (text, sizes)


def test_content_before_the_first_tag_streams_as_it_comes() -> None:
    parser = hermes.HermesToolParser.__new__(hermes.HermesToolParser)
    st = parser.new_state()
    assert parser.feed(st, "Checking <to", str).content == "Checking "  # type: ignore[union-attr]
    assert parser.feed(st, "ol", str) is None  # still maybe a tag
    assert parser.feed(st, "s> now <tool_call>{", str).content == "<tools> now "  # type: ignore[union-attr]
    assert parser.feed(st, '"name"', str) is None


def test_whitespace_only_content_is_held_then_released() -> None:
    parser = hermes.HermesToolParser.__new__(hermes.HermesToolParser)
    st = parser.new_state()
    assert parser.feed(st, "\n\n", str) is None
    assert parser.feed(st, "Hi", str).content == "\n\nHi"  # type: ignore[union-attr]


class _Segment:
    """A stored, verified held-text prefix (what a snapshot's segment gives back)."""

    def __init__(self, text: str) -> None:
        self._text = text

    @property
    def chars(self) -> int:
        return len(self._text)

    def text(self) -> str:
        return self._text

    def tail(self, n: int) -> str:
        return self._text[-n:]


class _Sink:
    inline_chars = 8

    def __init__(self) -> None:
        self.stored: list[str] = []

    def wire(self, held: HeldText) -> Any:
        self.stored.append(held.text())
        return len(self.stored) - 1


def test_resume_from_a_snapshot_mid_hold() -> None:
    # the held text travels beside the state (a segment the snapshot names by index) and a state
    # loaded with that segment ends the stream exactly as the one that never stopped
    parser = hermes.HermesToolParser.__new__(hermes.HermesToolParser)
    text = "ok <tool_call>" + CALL + "</tool_call><tool_call>" + LOOSE
    whole = _stream(parser, text, [5], AUTO)
    for cut in (4, 15, 30, len(text) - 2):
        st = parser.new_state()
        head = parser.feed(st, text[:cut], str)
        sink = _Sink()
        obj = json.loads(msgspec.json.encode(st, enc_hook=encode_hook(sink)))
        if cut > 15:
            assert sink.stored and isinstance(obj[5], int)  # the held text is not in the state
        segments = [_Segment(t) for t in sink.stored]
        resumed = load_with(segments, lambda obj=obj: msgspec.convert(obj, hermes.HermesState, dec_hook=decode_hook))
        tail = parser.feed(resumed, text[cut:], str)
        end = parser.finish_for_request(resumed, lambda j: f"id{j}", AUTO)
        content = "".join(d.content or "" for d in (head, tail, end) if d is not None)
        calls = [[tc.name, tc.arguments] for tc in end.tool_calls] if end else []  # type: ignore[union-attr]
        assert content == whole["content"]
        assert [[calls[j][0], calls[j + 1][1]] for j in range(0, len(calls), 2)] == whole["calls"]


def test_llama_json_content_first_is_content_in_batch_too() -> None:
    # vLLM's batch would drop "Sure: " and make a call; its stream sends all of it as content:
    # ours answers content in both (tests/parsers/deliberate.py LLAMA_JSON_CONTENT_FIRST)
    parser = llama3_json.Llama3JsonToolParser.__new__(llama3_json.Llama3JsonToolParser)
    assert parser.extract_tool_calls("Sure: " + CALL) == (False, [], "Sure: " + CALL)
    assert parser.extract_tool_calls(CALL)[0]
    st = parser.new_state()
    assert parser.feed(st, "<|py", str) is None  # may still be the bot token spelled as text
    assert parser.feed(st, "x", str).content == "<|pyx"  # type: ignore[union-attr]


def test_llama_json_resume_from_a_snapshot_mid_hold() -> None:
    parser = llama3_json.Llama3JsonToolParser.__new__(llama3_json.Llama3JsonToolParser)
    text = "<|python_tag|>" + CALL + "; " + LOOSE
    whole = _stream(parser, text, [4], AUTO)
    assert whole["calls"] == [["f", '{"a": "x é 😀", "n": 1}'], ["g", '{"a": "é"}']]
    for cut in (3, 20, len(text) - 2):
        st = parser.new_state()
        head = parser.feed(st, text[:cut], str)
        sink = _Sink()
        obj = json.loads(msgspec.json.encode(st, enc_hook=encode_hook(sink)))
        if cut > 14:
            assert sink.stored and isinstance(obj[3], int)  # the held text is not in the state
        segments = [_Segment(t) for t in sink.stored]
        resumed = load_with(
            segments, lambda obj=obj: msgspec.convert(obj, llama3_json.Llama3JsonState, dec_hook=decode_hook)
        )
        tail = parser.feed(resumed, text[cut:], str)
        end = parser.finish_for_request(resumed, lambda j: f"id{j}", AUTO)
        assert head is None and tail is None and end is not None
        calls = [[tc.name, tc.arguments] for tc in end.tool_calls]
        assert [[calls[j][0], calls[j + 1][1]] for j in range(0, len(calls), 2)] == whole["calls"]
