"""Scaling across cores: render-service with 1, 2, 4, 8, 12 workers against `vllm-rs render` (vLLM
0.33's Rust renderer, shipped inside the vllm wheel) on the same cores, with the load generator on
cores of its own.

For each core count N the server under test is pinned (`taskset`) to N cores that wrk does not use
(wrk runs on `--wrk-cpus`, default the first 4), started, warmed up, then driven by wrk for
`--duration` seconds per scenario at `--connections-per-core` x N connections. Every request is
unique: the bodies carry a marker in every message that wrk's Lua script replaces with a
per-request counter, so no cache of either server sees the same message twice. Before anything is
timed both servers must return the same `token_ids` for every body (the script aborts otherwise).

Printed per scenario: req/s, p99 (wrk's), server CPU-ms per request (the process tree's
utime+stime over the run, divided by the requests wrk completed), efficiency against linear
(req/s at N / (N x req/s at 1)) and the ratios against vllm-rs: ours/vllm-rs req/s and
vllm-rs/ours CPU per request (above 1x: ours does the same render on less CPU). `--report DIR` writes report.md (the
tables, req/s per core at the p99 objective: the sizing figures), curve.svg and results.json.

    python3 -m benchmarks.scaling_bench --vllm-rs PATH/TO/vllm-rs --report benchmarks/reports/scaling
    python3 -m benchmarks.scaling_bench --cores 1,2 --wrk-cpus 0 --duration 5   # a 2-core rehearsal
    # one core each, 8 connections (a 2-core machine: wrk on CPU 0, each server on CPU 1)
    python3 -m benchmarks.scaling_bench --vllm-rs PATH/TO/vllm-rs --cores 1 --wrk-cpus 0 --connections-per-core 8

Needs wrk and taskset on PATH and at least max(cores) + len(wrk-cpus) CPUs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks import render_bench
from benchmarks._common import (
    Server,
    example_model_dir,
    format_table,
    free_port,
    stop_process_tree,
    tree_cpu_seconds,
    wait_healthy,
)

MARKER = "QXNONCEQX"  # replaced per request by wrk; letters only, so it tokenizes like a word

# wrk's Lua: each body is split once at its markers; a request joins the pieces with a unique
# "<thread>x<counter>" (one string copy of the body, microseconds, far below a render).
LUA = """
local pieces = {}
local i = 0
local counter = 0
local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end
-- `id` is a global that setup() sets in each thread's own Lua state
function init(args)
  for n = 1, %(count)d do
    local f = io.open("%(dir)s/body" .. n .. ".json", "rb")
    local body = f:read("*all")
    f:close()
    local parts = {}
    local start = 1
    while true do
      local a, b = string.find(body, "%(marker)s", start, true)
      if not a then break end
      table.insert(parts, string.sub(body, start, a - 1))
      start = b + 1
    end
    table.insert(parts, string.sub(body, start))
    pieces[n] = parts
  end
  i = id
end
request = function()
  i = i %% #pieces + 1
  counter = counter + 1
  local body = table.concat(pieces[i], id .. "x" .. counter)
  return wrk.format("POST", "/v1/chat/completions/render", {["Content-Type"] = "application/json"}, body)
end
"""

# The same configuration on both (vllm-rs has no --enable-auto-tool-choice: a parser enables it).
SERVER_FLAGS = ["--served-model-name", "tinyqwen3", "--max-model-len", "32768", "--reasoning-parser", "qwen3"]
OURS_FLAGS = [*SERVER_FLAGS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
VLLM_RS_FLAGS = [*SERVER_FLAGS, "--tool-call-parser", "hermes"]


@dataclass
class Point:
    server: str
    scenario: str
    cores: int
    connections: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float
    non2xx: int
    wrk_busy: float


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def parse_cpus(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


def mark(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with the marker at the start of every message's text (so every message is new)."""
    marked = json.loads(json.dumps(payload))
    for message in marked["messages"]:
        if isinstance(message.get("content"), str):
            message["content"] = f"{MARKER} {message['content']}"
    return marked


def write_bodies(folder: Path, payloads: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n, payload in enumerate(payloads, 1):
        (folder / f"body{n}.json").write_bytes(orjson.dumps(payload))
    script = folder / "unique.lua"
    script.write_text(LUA % {"count": len(payloads), "dir": folder, "marker": MARKER})
    return script


def start_pinned(name: str, command: list[str], cpus: Sequence[int], port: int, log: Path) -> Server:
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["taskset", "-c", cpu_list(cpus), *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(name, f"http://127.0.0.1:{port}", process.pid, owned=True, log=log)
    try:
        wait_healthy(server.url, 180, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def ours_command(model: str, port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "render_service.cli",
        "serve",
        model,
        "--port",
        str(port),
        "--workers",
        str(workers),
        *OURS_FLAGS,
    ]


def vllm_rs_command(binary: str, model: str, port: int) -> list[str]:
    return [binary, "render", model, "--port", str(port), *VLLM_RS_FLAGS]


def render_ids(url: str, payload: dict[str, Any]) -> list[int]:
    response = httpx.post(f"{url}/v1/chat/completions/render", json=payload, timeout=60)
    if response.status_code != 200:
        sys.exit(f"{url} answered {response.status_code}: {response.text[:500]}")
    return response.json()["token_ids"]


def verify(ours: Server, theirs: Server, payloads: list[dict[str, Any]]) -> None:
    for n, payload in enumerate(payloads):
        concrete = json.loads(json.dumps(payload).replace(MARKER, "0x0"))
        a, b = render_ids(ours.url, concrete), render_ids(theirs.url, concrete)
        if a != b:
            sys.exit(f"body {n}: token_ids differ between {ours.name} and {theirs.name}; not the same work")


def run_wrk(
    wrk: str, wrk_cpus: Sequence[int], url: str, script: Path, duration: float, connections: int
) -> dict[str, float]:
    threads = min(len(wrk_cpus), connections)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [
            *("taskset", "-c", cpu_list(wrk_cpus), wrk, "-t", str(threads), "-c", str(connections)),
            *("-d", f"{round(duration)}s", "--timeout", "10s", "--latency", "-s", str(script), url),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found or not rps:
        raise RuntimeError(f"unreadable wrk output:\n{out}")
    latency: dict[str, float] = {}
    for pct in ("50", "99"):
        match = re.search(rf"\s{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)\b", out)
        if not match:
            raise RuntimeError(f"no p{pct} in wrk output:\n{out}")
        value, unit = float(match.group(1)), match.group(2)
        latency[pct] = value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        # the load generator's share of its CPUs: near 1.0 means wrk, not the server, set the pace
        "wrk_busy": wrk_cpu / (duration * threads),
        "requests": float(found.group(1)),
        "rps": float(rps.group(1)),
        "p50_ms": latency["50"],
        "p99_ms": latency["99"],
        "non2xx": float(errors.group(1)) if errors else 0.0,
    }


def measure(
    server: Server, scenario: str, cores: int, args: argparse.Namespace, script: Path, wrk_cpus: Sequence[int]
) -> Point:
    connections = max(args.min_connections, args.connections_per_core * cores)
    run_wrk(args.wrk, wrk_cpus, server.url, script, args.warmup, connections)
    assert server.pid is not None
    before = tree_cpu_seconds(server.pid)
    result = run_wrk(args.wrk, wrk_cpus, server.url, script, args.duration, connections)
    cpu = tree_cpu_seconds(server.pid) - before
    requests = int(result["requests"])
    return Point(
        server.name,
        scenario,
        cores,
        connections,
        requests,
        result["rps"],
        result["p50_ms"],
        result["p99_ms"],
        1000 * cpu / max(1, requests),
        int(result["non2xx"]),
        result["wrk_busy"],
    )


def scenario_table(points: list[Point], scenario: str) -> str:
    mine = {p.cores: p for p in points if p.scenario == scenario and p.server == "ours"}
    rust = {p.cores: p for p in points if p.scenario == scenario and p.server == "vllm-rs"}
    rows = []
    for cores in sorted(mine):
        o, r = mine[cores], rust.get(cores)
        eff_o = o.rps / (cores * mine[min(mine)].rps / min(mine))
        eff_r = r.rps / (cores * rust[min(rust)].rps / min(rust)) if r else None
        rows.append(
            [
                str(cores),
                f"{o.rps:,.0f}",
                f"{o.p99_ms:.1f}",
                f"{o.cpu_ms_per_request:.2f}",
                f"{100 * eff_o:.0f}%",
                f"{r.rps:,.0f}" if r else "-",
                f"{r.p99_ms:.1f}" if r else "-",
                f"{r.cpu_ms_per_request:.2f}" if r else "-",
                f"{100 * eff_r:.0f}%" if eff_r else "-",
                f"{o.rps / r.rps:.2f}x" if r else "-",
                f"{r.cpu_ms_per_request / o.cpu_ms_per_request:.2f}x" if r and o.cpu_ms_per_request else "-",
            ]
        )
    headers = ["cores", "ours req/s", "p99 ms", "CPU ms/req", "linear", "vllm-rs req/s", "p99 ms", "CPU ms/req"]
    ratios = ["ours/vllm-rs req/s", "vllm-rs/ours CPU per req"]
    return format_table([*headers, "linear", *ratios], rows, title=scenario)


def sizing_rows(points: list[Point], slo_p99_ms: float) -> list[list[str]]:
    rows = []
    for point in sorted(points, key=lambda p: (p.scenario, p.server, p.cores)):
        if point.p99_ms <= slo_p99_ms and point.non2xx == 0:
            rows.append([point.scenario, point.server, str(point.cores), f"{point.rps / point.cores:,.0f}"])
    return rows


def svg_chart(points: list[Point], scenarios: Sequence[str]) -> str:
    """req/s against cores, one panel per scenario, ours and vllm-rs, with the linear line (no plotting library)."""
    width, height, pad = 360, 260, 48
    panels = []
    for index, scenario in enumerate(scenarios):
        series = {
            name: sorted((p.cores, p.rps) for p in points if p.scenario == scenario and p.server == name)
            for name in ("ours", "vllm-rs")
        }
        top = max((rps for s in series.values() for _, rps in s), default=1.0) * 1.1
        most = max((c for s in series.values() for c, _ in s), default=1)

        def x(cores: float, most: int = most) -> float:
            return pad + (width - 2 * pad) * cores / most

        def y(rps: float, top: float = top) -> float:
            return height - pad - (height - 2 * pad) * rps / top

        ox = index * width
        parts = [
            f'<g transform="translate({ox},0)">',
            f'<text x="{width / 2}" y="20" text-anchor="middle">{scenario}</text>',
        ]
        parts.append(f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>')
        parts.append(f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>')
        parts.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle" font-size="11">cores</text>')
        parts.append(f'<text x="6" y="{pad - 10}" font-size="11">req/s (max {top / 1.1:,.0f})</text>')
        ours = series["ours"]
        if ours:
            base = ours[0][1] / ours[0][0]
            parts.append(
                f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(most)}" y2="{y(min(top, base * most))}" '
                'stroke="grey" stroke-dasharray="4"/>'
            )
        for name, colour in (("ours", "#1f77b4"), ("vllm-rs", "#d62728")):
            line = " ".join(f"{x(c):.1f},{y(r):.1f}" for c, r in series[name])
            if line:
                parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
            for c, r in series[name]:
                parts.append(f'<circle cx="{x(c):.1f}" cy="{y(r):.1f}" r="3" fill="{colour}"/>')
                parts.append(
                    f'<text x="{x(c):.1f}" y="{height - pad + 14}" text-anchor="middle" font-size="10">{c}</text>'
                )
        parts.append("</g>")
        panels.append("\n".join(parts))
    legend = (
        f'<g transform="translate(10,{height + 10})"><rect width="10" height="10" fill="#1f77b4"/>'
        '<text x="14" y="10" font-size="12">render-service (workers = cores)</text>'
        '<rect x="230" width="10" height="10" fill="#d62728"/><text x="244" y="10" font-size="12">vllm-rs render</text>'
        '<line x1="360" y1="5" x2="380" y2="5" stroke="grey" stroke-dasharray="4"/>'
        '<text x="384" y="10" font-size="12">linear (ours)</text></g>'
    )
    total = width * len(scenarios)
    body = "\n".join(panels)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height + 30}" font-family="sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>\n{body}\n{legend}\n</svg>\n'
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--cores", default="1,2,4,8,12", help="core counts (workers = cores for ours)")
    parser.add_argument("--wrk-cpus", default="0-3", help="CPUs wrk runs on (the servers get the others)")
    parser.add_argument("--scenarios", default="long9k,short,agent")
    parser.add_argument("--bodies", type=int, default=64, help="distinct conversations per scenario")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of measured load per point")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections-per-core", type=int, default=4)
    parser.add_argument("--min-connections", type=int, default=4)
    parser.add_argument("--vllm-rs", help="the vllm-rs binary (in the vllm 0.33 wheel: vllm/vllm-rs); omit: ours only")
    parser.add_argument("--wrk", default=shutil.which("wrk") or "wrk")
    parser.add_argument("--slo-p99-ms", type=float, default=100.0, help="p99 objective for the sizing figures")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--report", help="folder for report.md, curve.svg and results.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    cores_list = [int(c) for c in args.cores.split(",")]
    wrk_cpus = parse_cpus(args.wrk_cpus)
    free_cpus = [c for c in sorted(os.sched_getaffinity(0)) if c not in wrk_cpus]
    if max(cores_list) > len(free_cpus):
        sys.exit(f"{max(cores_list)} server cores asked for, {len(free_cpus)} CPUs left beside wrk's")
    scenarios = args.scenarios.split(",")
    model = example_model_dir(args.model)
    work = Path(tempfile.mkdtemp(prefix="scaling-bench-"))
    scripts: dict[str, Path] = {}
    payloads: dict[str, list[dict[str, Any]]] = {}
    for name in scenarios:
        scenario = render_bench.SCENARIOS[name]
        payloads[name] = [mark(scenario.build(args.seed * 1000 + i)) for i in range(args.bodies)]
        scripts[name] = write_bodies(work / name, payloads[name])
    kinds = ["ours"] + (["vllm-rs"] if args.vllm_rs else [])
    if args.vllm_rs:  # same work: identical token ids on every body, checked on 1 core each
        ours = start_pinned("ours", ours_command(model, p := free_port(), 1), free_cpus[:1], p, work / "ours-check.log")
        rust = start_pinned(
            "vllm-rs", vllm_rs_command(args.vllm_rs, model, q := free_port()), free_cpus[:1], q, work / "rs-check.log"
        )
        try:
            for name in scenarios:
                verify(ours, rust, payloads[name])
        finally:
            ours.stop()
            rust.stop()
        print(f"verified: identical token_ids on {args.bodies} bodies x {len(scenarios)} scenarios")
    points: list[Point] = []
    for cores in cores_list:
        cpus = free_cpus[:cores]
        for kind in kinds:
            port = free_port()
            command = ours_command(model, port, cores) if kind == "ours" else vllm_rs_command(args.vllm_rs, model, port)
            server = start_pinned(kind, command, cpus, port, work / f"{kind}-{cores}.log")
            try:
                for name in scenarios:
                    point = measure(server, name, cores, args, scripts[name], wrk_cpus)
                    points.append(point)
                    print(
                        f"{kind:8} {name:7} cores={cores:2} conns={point.connections:3} "
                        f"{point.rps:9,.0f} req/s  p99 {point.p99_ms:7.1f} ms  "
                        f"{point.cpu_ms_per_request:.2f} CPU-ms/req  non2xx={point.non2xx}  wrk busy {point.wrk_busy:.0%}",
                        flush=True,
                    )
            finally:
                assert server.pid is not None
                stop_process_tree(server.pid)
    tables = "\n\n".join(scenario_table(points, name) for name in scenarios)
    print(tables)
    sizing = format_table(
        ["scenario", "server", "cores", "req/s per core"],
        sizing_rows(points, args.slo_p99_ms),
        title=f"req/s per core where p99 <= {args.slo_p99_ms:g} ms and no errors",
    )
    print(sizing)
    if args.report:
        write_report(Path(args.report), args, points, scenarios, tables, sizing, argv)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def write_report(
    folder: Path,
    args: argparse.Namespace,
    points: list[Point],
    scenarios: Sequence[str],
    tables: str,
    sizing: str,
    argv: Sequence[str] | None,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python3 -m benchmarks.scaling_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    (folder / "results.json").write_text(
        json.dumps(
            {"generated": now, "command": command, "machine": machine, "points": [asdict(p) for p in points]}, indent=1
        )
    )
    (folder / "curve.svg").write_text(svg_chart(points, scenarios))
    (folder / "report.md").write_text(
        f"# Scaling: render-service vs vllm-rs render\n\nGenerated {now} by `{command}` on {machine}. wrk on CPUs "
        f"{args.wrk_cpus}, each server pinned to N other CPUs; {args.bodies} conversations per scenario, every "
        f"request unique; {args.duration:g} s of load per point after {args.warmup:g} s of warm-up, "
        f"{args.connections_per_core} connections per server core.\n\n![req/s against cores](curve.svg)\n\n"
        f"```\n{tables}\n```\n\n## Sizing\n\n```\n{sizing}\n```\n"
    )
    print(f"report: {folder}/report.md")


if __name__ == "__main__":
    sys.exit(main())
