"""A 40-turn coding-agent conversation with tools and thinking, re-sent whole every turn.

`conversation(turns, seed)` returns the request bodies of turns 1..N: turn k's body carries the
whole history (system, user task, then per turn an assistant message with reasoning and one or
two tool calls, and their tool results; every 10 turns the user adds a message). The prompt grows
to ~30k tokens at turn 40 with the tiny Qwen3 example model's tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.render_bench import Writer, _plural, agent_tools


def conversation(turns: int = 40, seed: int = 0, user_every: int = 10) -> list[dict[str, Any]]:
    """The chat-render bodies of turns 1..`turns` (each a fresh dict; history shared by value)."""
    w = Writer(seed)
    rng = w.rng
    module = f"src/{_plural(rng.choice(['payment', 'ledger', 'invoice']))}/{w.ident(1)}.py"
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are an autonomous software engineering agent working in a git repository. "
            "Use the tools to inspect code, run tests and make minimal, well-tested changes. " + w.paragraph((3, 4)),
        },
        {"role": "user", "content": f"`{w.ident(2)}` in `{module}` fails in staging. {w.paragraph((2, 4))} Fix it."},
    ]
    bodies = []
    for turn in range(1, turns + 1):
        bodies.append(
            {
                "model": "tinyqwen3",
                "messages": json.loads(json.dumps(messages)),
                "tools": agent_tools(),
                "tool_choice": "auto",
            }
        )
        # What the model answered at this turn, and what the client sends back at the next one.
        calls = []
        for _ in range(2 if rng.random() < 0.25 else 1):
            name, arguments = _tool_call(w, module)
            calls.append(
                {
                    "id": f"call_{rng.getrandbits(64):016x}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        messages.append(
            {
                "role": "assistant",
                "content": w.sentence() if rng.random() < 0.5 else "",
                "reasoning": w.paragraph((2, 4)),
                "tool_calls": calls,
            }
        )
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": _tool_result(w, call)})
        if turn % user_every == 0:
            messages.append({"role": "user", "content": f"{w.sentence()} {w.sentence()} Keep going."})
    return bodies


def _tool_call(w: Writer, module: str) -> tuple[str, dict[str, Any]]:
    rng = w.rng
    kind = rng.randrange(4)
    if kind == 0:
        return "read_file", {"path": module, "range": {"start_line": rng.randint(1, 90), "end_line": -1}}
    if kind == 1:
        return "search_code", {"query": w.ident(2), "path_globs": ["src/**/*.py"], "options": {"max_results": 20}}
    if kind == 2:
        return "run_tests", {"targets": [f"tests/test_{w.ident(1)}.py"], "markers": "not slow"}
    return "edit_file", {"path": module, "edits": [{"old_text": w.sentence(), "new_text": w.function()}]}


def _tool_result(w: Writer, call: dict[str, Any]) -> str:
    name = call["function"]["name"]
    if name == "read_file":
        return w.module(w.rng.randint(1, 2))
    if name == "search_code":
        return w.json_blob(w.rng.randint(3, 5))
    if name == "run_tests":
        return w.log(6) + f"\n=== {w.rng.randint(20, 90)} passed ==="
    return json.dumps({"ok": True, "applied": 1})
