"""A 40-turn coding-agent conversation with tools and thinking, re-sent whole every turn.

`conversation(turns, seed)` returns the request bodies of turns 1..N: turn k's body carries the
whole history (system, user task, then per turn an assistant message with reasoning and one or
two tool calls, and their tool results; every 10 turns the user adds a message). The prompt grows
to ~30k tokens at turn 40 with the tiny Qwen3 example model's tokenizer.
"""

from __future__ import annotations

import json
import time
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
        return w.module(w.rng.randint(2, 3))
    if name == "search_code":
        return w.json_blob(w.rng.randint(3, 5))
    if name == "run_tests":
        return w.log(6) + f"\n=== {w.rng.randint(20, 90)} passed ==="
    return json.dumps({"ok": True, "applied": 1})


# -- the benchmark ----------------------------------------------------------------------------
# python3 -m benchmarks.agent_turns [--oracle-python PY] [--repeats 3] [--skip-vllm] [--skip-rs]
# Starts every server itself (free loopback ports), sends turns 1..40 in order to each (each turn
# `--repeats` times, the targets interleaved turn by turn), checks that all return the same token
# ids, and prints server CPU per turn (schedstat, the whole process tree) and the ratios.

SERVER_ARGS = "--served-model-name tinyqwen3 --reasoning-parser qwen3 --tool-call-parser hermes --max-model-len 32768"


def _rs_binary(python: str) -> str:
    import subprocess

    site = subprocess.run(
        [python, "-c", "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('vllm').origin))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{site}/vllm-rs"


def _start_rs(binary: str, model_dir: str, port: int, log: Any) -> Any:
    import subprocess

    from benchmarks._common import Server, wait_healthy

    command = [binary, "render", model_dir, "--port", str(port), *SERVER_ARGS.split()]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("vllm-rs", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log)
    try:
        wait_healthy(server.url, 120.0, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import tempfile
    from pathlib import Path

    import httpx
    import orjson

    from benchmarks._common import (
        DEFAULT_ORACLE_PYTHON,
        example_model_dir,
        fmt,
        format_table,
        free_port,
        start_render_service,
        start_vllm_render,
    )

    parser = argparse.ArgumentParser(description="40-turn agent conversation: CPU per turn, side by side")
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="sends of each turn to each server")
    parser.add_argument("--oracle-python", default=DEFAULT_ORACLE_PYTHON, help="python of a vLLM 0.33 env")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-rs", action="store_true")
    parser.add_argument("--ours-args", default="", help="extra flags for both of ours, e.g. '--tokenizer-backend hf'")
    args = parser.parse_args(argv)
    model_dir = example_model_dir(args.model)
    load_before = os.getloadavg()
    logs = Path(tempfile.mkdtemp(prefix="agent-turns-"))
    ours_args = [*SERVER_ARGS.split(), "--enable-auto-tool-choice", "--workers", "1", *args.ours_args.split()]
    servers = {}
    try:
        servers["ours"] = start_render_service(model_dir, free_port(), ours_args, log=logs / "ours.log")
        servers["ours-nocache"] = start_render_service(
            model_dir, free_port(), [*ours_args, "--segment-cache-bytes", "0"], log=logs / "nocache.log"
        )
        if not args.skip_rs and args.oracle_python:
            servers["vllm-rs"] = _start_rs(_rs_binary(args.oracle_python), model_dir, free_port(), logs / "rs.log")
        if not args.skip_vllm and args.oracle_python:
            servers["vLLM"] = start_vllm_render(
                model_dir, free_port(), [*SERVER_ARGS.split(), "--enable-auto-tool-choice"], python=args.oracle_python
            )
        bodies = [orjson.dumps(body) for body in conversation(args.turns)]
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        wall: dict[str, list[float]] = {name: [] for name in servers}
        tokens: list[int] = []
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=120.0) as client:
            for turn, body in enumerate(bodies, 1):
                ids_seen: dict[str, list[int]] = {}
                order = list(servers)[turn % len(servers) :] + list(servers)[: turn % len(servers)]
                for name in order:
                    server = servers[name]
                    url = server.url + "/v1/chat/completions/render"
                    started_cpu = server.cpu_seconds_precise()
                    started = time.perf_counter()
                    for _ in range(args.repeats):
                        response = client.post(url, content=body, headers=headers)
                    wall[name].append((time.perf_counter() - started) / args.repeats * 1000)
                    cpu[name].append((server.cpu_seconds_precise() - started_cpu) / args.repeats * 1000)
                    if response.status_code != 200:
                        raise SystemExit(f"{name} turn {turn}: {response.status_code} {response.text[:300]}")
                    ids_seen[name] = response.json()["token_ids"]
                reference = ids_seen["ours-nocache"]
                different = [name for name, ids in ids_seen.items() if ids != reference]
                if different:
                    raise SystemExit(f"turn {turn}: token ids differ from ours-nocache: {different}")
                tokens.append(len(reference))
    finally:
        for server in servers.values():
            server.stop()

    names = list(servers)
    shown = sorted({1, 10, 20, 30, args.turns} & set(range(1, args.turns + 1)))
    rows = [[str(t), str(tokens[t - 1]), *(fmt(cpu[n][t - 1]) for n in names)] for t in shown]
    last = range(max(0, args.turns - 10), args.turns)
    average = {n: sum(cpu[n][i] for i in last) / len(last) for n in names}
    rows.append([f"{last.start + 1}-{args.turns} avg", str(tokens[-1]), *(fmt(average[n]) for n in names)])
    print(format_table(["turn", "tokens", *(f"{n} CPU ms" for n in names)], rows, title="server CPU per render"))
    wall_avg = {n: sum(wall[n][i] for i in last) / len(last) for n in names}
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {load_after} (the machine is shared: rough)")
    print("sequential req/s over the last 10 turns: " + ", ".join(f"{n} {1000 / wall_avg[n]:.0f}" for n in names))
    print(f"ratios (CPU, turns {last.start + 1}-{args.turns}), all with identical token ids:")
    for other in names:
        if other != "ours":
            print(f"  {other} / ours: {average[other] / average['ours']:.2f}x")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
