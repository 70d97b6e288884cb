"""DeepSeek V3/V3.1 tool calls held to the end of the stream (`parsers/deepseek_v3.py`): under any
chunking, with the state JSON round-tripped between chunks, the stream accumulates to the batch
answer (`ChatParser`'s rules for blank content included); markers split anywhere, a V3 call
whose type batch rejects, content after the calls block, a call marker before the block, and a
state resumed mid-hold from a snapshot's segment."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from render_service.parsers import deepseek_v3
from render_service.parsers.base import RequestOptions
from render_service.parsers.held import HeldText, decode_hook, encode_hook, load_with

AUTO = RequestOptions(tool_choice="auto", has_tools=True)
REQUIRED = RequestOptions(tool_choice="required", has_tools=True)

CS, CE = deepseek_v3.TOOL_CALLS_BEGIN, deepseek_v3.TOOL_CALLS_END
B, E, SEP = deepseek_v3.TOOL_CALL_BEGIN, deepseek_v3.TOOL_CALL_END, deepseek_v3.TOOL_SEP


def v3_call(name: str, args: str, kind: str = "function") -> str:
    return f"{B}{kind}{SEP}{name}\n```json\n{args}\n```{E}"


def v31_call(name: str, args: str) -> str:
    return f"{B}{name}{SEP}{args}{E}"


ARGS = '{"city": "東京", "q": "é 😀 \\"x\\" {b}"}'
V3 = [
    "",
    "hi",
    "\n\n",
    "Let me check. " + CS + v3_call("get_weather", ARGS) + CE,
    "\n " + CS + v3_call("a", "{}") + "\n" + v3_call("b", ARGS) + CE + " after",
    "x " + CS + v3_call("a", "{}") + v3_call("b", "{}", kind="other") + CE,  # batch rejects all
    CS + v3_call("a", '{"n": 1}') + CE + " one " + CE + " two",  # content after the last end
    CS + v3_call("a", '{"n": 1'),  # unclosed: called, no call
    "text " + v3_call("a", "{}") + " more " + CS + v3_call("b", "{}"),  # a call before the block
    "text " + v3_call("a", "{}") + " no block",  # without the block: all content
    "split <｜tool▁call",  # a marker prefix at the end is content
    "<｜tool▁calls▁begin｜" + "x",  # not a marker after all
]
V31 = [
    "ok " + CS + v31_call("get_weather", ARGS) + v31_call("search", '{"q": "x"}') + CE + " gone",
    CS + v31_call("f", '{"a": 1}') + B + "g\n" + SEP + "{}" + E + CE,  # a name cut by a newline
    CS + v31_call("f", '{"a"'),  # unclosed
    " \n" + CS + v31_call("f", "{}"),
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
    deltas = []
    i = k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        deltas.append(parser.feed(st, text[i : i + n], lambda j: f"id{j}"))
        st = parser.load_state(json.loads(msgspec.json.encode(st, enc_hook=encode_hook())))
        i, k = i + n, k + 1
    deltas.append(parser.finish_for_request(st, lambda j: f"id{j}", opts))
    content, names, args = "", {}, {}
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


def _parser(cls: type) -> Any:
    return cls.__new__(cls)  # the stream and batch code read no tokenizer


@pytest.mark.parametrize(
    ("cls", "texts"),
    [(deepseek_v3.DeepSeekV3ToolParser, V3), (deepseek_v3.DeepSeekV31ToolParser, V3 + V31)],
)
@pytest.mark.parametrize("opts", [AUTO, REQUIRED])
def test_stream_accumulates_to_batch_under_any_chunking(cls: type, texts: list[str], opts: RequestOptions) -> None:
    parser = _parser(cls)
    for text in texts:
        want = _batch(parser, text, opts)
        for sizes in [[1], [2], [3, 1], [len(text) or 1], *([random.Random(s).randint(1, 9)] for s in range(20))]:
            assert _stream(parser, text, sizes, opts) == want, (text, sizes)


def test_v3_rejected_call_type_makes_everything_content() -> None:
    parser = _parser(deepseek_v3.DeepSeekV3ToolParser)
    text = "x " + CS + v3_call("a", "{}") + v3_call("b", "{}", kind="other") + CE
    assert _stream(parser, text, [4], AUTO) == {"content": text, "calls": []}


def test_content_streams_until_a_marker_split_across_chunks() -> None:
    parser = _parser(deepseek_v3.DeepSeekV3ToolParser)
    st = parser.new_state()
    assert parser.feed(st, "Checking <｜tool", str).content == "Checking "  # type: ignore[union-attr]
    assert parser.feed(st, "▁call", str) is None  # still maybe a marker
    assert parser.feed(st, "s▁begin｜>" + B, str) is None  # the block: held from here
    assert st.holding and st.held.text() == CS + B
    # whitespace-only content is held until something decides it
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
    parser = _parser(deepseek_v3.DeepSeekV31ToolParser)
    text = "ok " + CS + v31_call("get_weather", ARGS) + v31_call("search", '{"q": "x"}') + CE
    whole = _stream(parser, text, [5], AUTO)
    assert whole["calls"] == [["get_weather", ARGS], ["search", '{"q": "x"}']]
    for cut in (2, 5, 30, len(text) - 2):
        st = parser.new_state()
        head = parser.feed(st, text[:cut], str)
        sink = _Sink()
        obj = json.loads(msgspec.json.encode(st, enc_hook=encode_hook(sink)))
        if cut > 20:
            assert sink.stored and obj[5] == 0  # the held text is not in the state
        segments = [_Segment(t) for t in sink.stored]
        resumed = load_with(
            segments, lambda obj=obj: msgspec.convert(obj, deepseek_v3.DeepSeekToolState, dec_hook=decode_hook)
        )
        tail = parser.feed(resumed, text[cut:], str)
        end = parser.finish_for_request(resumed, lambda j: f"id{j}", AUTO)
        content = "".join(d.content or "" for d in (head, tail, end) if d is not None)
        assert end is not None
        calls = [[tc.name, tc.arguments] for tc in end.tool_calls]
        assert content == whole["content"]
        assert [[calls[j][0], calls[j + 1][1]] for j in range(0, len(calls), 2)] == whole["calls"]
