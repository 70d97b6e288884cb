"""Checks shared by the JSON-shaped tool families' unit tests (tests/parsers/test_phi4_mini_json.py,
test_xlam.py, test_internlm.py, test_jamba.py): a stream under any chunking, its state JSON
round-tripped between chunks, accumulates to our batch answer; a stream stored and resumed from
every snapshot (held text in segments beside it) answers the same, with snapshots of bounded size."""

from __future__ import annotations

import random
from typing import Any

from render_service import parsers
from tests.parsers import cases


def parser_for(tok: Any, tool: str, reasoning: str | None = None) -> parsers.ChatParser:
    parser = parsers.get_parser(tok, reasoning, tool, enable_auto_tools=True)
    assert parser is not None
    return parser


def accumulated(steps: list[tuple[Any, str | None]]) -> dict[str, Any]:
    joined = cases.concat(steps)
    indexes = sorted(set(joined["names"]) | set(joined["args"]))
    return {
        "content": joined["content"],
        "calls": [[joined["names"].get(i, ""), joined["args"].get(i, "")] for i in indexes],
        "finish": joined["finish"],
    }


def batch_view(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": batch["content"] or "",
        "calls": [c[:2] for c in batch["tool_calls"]],
        "finish": batch["finish_reason"],
    }


def check_any_chunking(
    tok: Any, parser: parsers.ChatParser, text: str, eos: tuple[int, frozenset[int]], seeds: int = 6
) -> dict[str, Any]:
    """Stream `text` (with an end-of-turn token) one token per chunk, in one chunk and under
    random chunkings, the state round-tripped every chunk: each accumulates to the batch answer,
    which is returned."""
    ids = [*tok.encode(text, add_special_tokens=False), eos[0]]
    req = {"model": "m", "messages": [], **cases.REQ["auto"]}
    batch = cases.run_batch(tok, parser, req, [], ids, "stop", eos=eos)
    rng = random.Random(len(text))
    chunkings: list[Any] = ["one", "all"] + [[rng.randrange(1, 6) for _ in range(4)] for _ in range(seeds)]
    for how in chunkings:
        steps = cases.run_stream(tok, parser, req, [], cases.chunk(ids, how), "stop", roundtrip_every=1, eos=eos)
        assert accumulated(steps) == batch_view(batch), (text, how)
    return batch


def check_resume_and_bounds(
    tok: Any, parser: parsers.ChatParser, text: str, eos: tuple[int, frozenset[int]], limit: int = 1000
) -> dict[str, Any]:
    """Stream `text` (with an end-of-turn token, dropped as the stop token) through a stored
    snapshot after every token: it accumulates to the batch
    answer, each snapshot's JSON stays under `limit` bytes and each chunk writes only about its
    own text to the held segment."""
    ids = [*tok.encode(text, add_special_tokens=False), eos[0]]
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    deltas, sizes, writes = cases.stream_through_snapshots(parser, [], ids, opts)
    req = {"model": "m", "messages": [], **cases.REQ["auto"]}
    batch = cases.run_batch(tok, parser, req, [], ids, "stop", eos=eos)
    streamed = accumulated([(d, None) for d in deltas])
    assert {**streamed, "finish": None} == {**batch_view(batch), "finish": None}
    assert max(sizes) < limit, max(sizes)
    assert max(writes) < 200, max(writes)
    return batch
