"""What token-identical continuation costs, and what it keeps: the 40-turn agent conversation
(benchmarks/agent_turns.py: tools, thinking, a user message every 10 turns) played through render
and derender in-process, the "engine" answering each turn with the ids of the conversation's next
assistant message (thinking, content and hermes tool calls as Qwen3 writes them).

Each turn is rendered twice, side by side: the ordinary render (what vLLM renders) and the render
with `preserve_generated_tokens` (the handles checked and the ids looked up in the in-process
store, the splice proven). It prints the CPU per render over turns 31-40 for both, their ratio, how
many turns extended the previous prompt + output token for token in each, and the ids the
ordinary render shares with what the engine already saw.

    python3 -m benchmarks.continuation_turns [--turns 40] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import tempfile
import time
from typing import Any

from benchmarks.agent_turns import conversation

IM_END = 151645


def _output_text(message: dict[str, Any]) -> str:
    """The assistant message as Qwen3 generates it (its own spacing: hermes JSON on one line)."""
    text = f"<think>\n{message['reasoning']}\n</think>\n\n{message.get('content') or ''}"
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        text += "\n<tool_call>\n" + json.dumps({"name": call["function"]["name"], "arguments": arguments})
        text += "\n</tool_call>"
    return text


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    from render_service.derender import generated as generated_store
    from render_service.derender import pipeline as derender
    from render_service.derender.snapshots import LocalStore
    from render_service.model.example import build_example_model
    from render_service.model.loader import load_model
    from render_service.render import continuation
    from render_service.render import pipeline as render
    from render_service.server.metrics import Metrics
    from render_service.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5, help="renders of each turn per variant (median taken)")
    args = parser.parse_args(argv)

    model_dir = build_example_model(tempfile.mkdtemp(prefix="continuation-bench-"), "qwen3")
    settings = Settings(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=32768,
        preserve_generated_tokens=True,
    ).validate()
    model = load_model(settings)
    ctx = render.make_context(model, settings)
    metrics = Metrics()
    dctx = derender.make_context(ctx, "benchmark-fingerprint", None, metrics)
    store = generated_store.GeneratedStore(b"k" * 32, "benchmark-fingerprint", metrics, local=LocalStore())
    tokenizer = model.hf_tokenizer
    bodies = conversation(turns=args.turns + 1, seed=0)

    loop = asyncio.new_event_loop()  # the handler's lookups run on the server's loop, not a new one each
    messages = copy.deepcopy(bodies[0]["messages"])
    seen: list[int] = []  # the last prompt + generated ids
    rows = []
    for turn in range(1, args.turns + 1):
        body = {**bodies[turn - 1], "messages": messages, continuation.REQUEST_FIELD: True}
        plain = {k: v for k, v in body.items() if k != continuation.REQUEST_FIELD}
        times: dict[str, list[float]] = {"ordinary": [], "continued": []}
        results: dict[str, Any] = {}
        for _ in range(args.repeats):
            for name in ("ordinary", "continued"):
                request = copy.deepcopy(body if name == "continued" else plain)
                start = time.thread_time()
                lookup = loop.run_until_complete(store.resolve(request["messages"])) if name == "continued" else None
                rendered = render.render_chat(ctx, request, generated=lookup)
                times[name].append(time.thread_time() - start)
                results[name] = (rendered["token_ids"], lookup.result if lookup is not None else None)
        ids, report = results["continued"]
        ordinary_ids = results["ordinary"][0]
        rows.append(
            (
                turn,
                statistics.median(times["ordinary"]),
                statistics.median(times["continued"]),
                len(ids),
                bool(seen) and ids[: len(seen)] == seen,
                bool(seen) and ordinary_ids[: len(seen)] == seen,
                _common(ordinary_ids, seen),
                report,
            )
        )
        # The engine answers with the conversation's next assistant message; the client sends it back.
        following = bodies[turn]["messages"][len(bodies[turn - 1]["messages"]) :]
        generated = [*tokenizer.encode(_output_text(following[0]), add_special_tokens=False), IM_END]
        answer = derender.derender_chat(
            dctx,
            {
                "generate_response": {
                    "request_id": f"generate-tokens-chatcmpl-{turn}",
                    "choices": [{"index": 0, "token_ids": generated, "finish_reason": "stop"}],
                    "prompt_token_ids": ids,
                },
                "prompt_token_ids": ids,
                "chat_request": copy.deepcopy(body),
            },
        )
        loop.run_until_complete(_issue(store, body, ids, generated, answer))
        message = {k: v for k, v in answer["choices"][0]["message"].items() if v is not None and k != "refusal"}
        messages = [*messages, message, *copy.deepcopy(following[1:])]
        seen = ids + generated

    last = [row for row in rows if row[0] > args.turns - 10]
    ordinary_ms = statistics.mean(row[1] for row in last) * 1e3
    continued_ms = statistics.mean(row[2] for row in last) * 1e3
    print(f"turn {args.turns}: {rows[-1][3]} prompt ids")
    print(f"CPU per render, turns {last[0][0]}-{last[-1][0]}: ordinary {ordinary_ms:.2f} ms, with continuation ")
    print(f"  {continued_ms:.2f} ms ({continued_ms / ordinary_ms:.2f}x)")
    extended = sum(row[4] for row in rows[1:])
    ordinary_extended = sum(row[5] for row in rows[1:])
    print(f"turns 2-{args.turns} that extend the previous prompt + generated ids token for token:")
    print(f"  with continuation {extended}/{len(rows) - 1}, ordinary render {ordinary_extended}/{len(rows) - 1}")
    lost = [row for row in rows[1:] if not row[5]]
    if lost:
        worst = min(lost, key=lambda row: row[6])
        print(
            f"  ordinary render at turn {worst[0]} shares only {worst[6]} leading ids with the engine's last sequence"
        )
    reasons = sorted({str(row[7].reason) for row in rows if row[7] is not None and not row[7].prefix_extends})
    print(f"  continuation verdicts that were not 'extends': {reasons}")
    return 0 if extended == len(rows) - 1 else 1


async def _issue(store: Any, body: dict[str, Any], prompt: list[int], ids: list[int], answer: dict[str, Any]) -> None:
    from render_service.derender import generated as generated_store

    request = {
        "generate_response": {"choices": [{"index": 0, "token_ids": ids}], "prompt_token_ids": prompt},
        "chat_request": body,
    }
    await generated_store.issue_batch(store, request, answer)


if __name__ == "__main__":
    raise SystemExit(main())
