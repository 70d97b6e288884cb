"""The full chaos run, with its numbers: `python -m tests.chaos.report` (about 5 minutes).

Two pools of 3 replicas (full and compact stream state) behind HAProxy and one redis-server;
`--concurrency` streaming derenders per pool always in flight (llm-d-style clients) plus renders;
faults: a replica SIGKILLed and restarted, Redis restarted, frozen (SIGSTOP) for 5 s, filled to
maxmemory, and every replica rolled to a build with another fingerprint. Prints requests, streams,
faults injected, restarts (the protocol's 409 retries), replays, errors by kind, p99 per fault
window, and replica RSS/fds; `--json FILE` writes them. Exit status 1 when a stream or render is
wrong, a protocol violation happened (an error the protocol does not allow), or a replica's
memory or fds grew past the bounds.

    python -m tests.chaos.report                       # 200 streams per pool in flight
    python -m tests.chaos.report --concurrency 50 --json chaos.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from render_service.model.example import build_example_model
from tests.chaos.run import ChaosConfig, ChaosResult, run_chaos, summary

# "Flat": a replica that served the whole load may grow this much (allocator warm-up, caches
# reaching their bounds); fds track open connections, bounded by the balancer's maxconn.
RSS_GROWTH_MIB = 64.0
RSS_GROWTH_RATIO = 1.25
FD_GROWTH = 600


def problems(result: ChaosResult, numbers: dict[str, Any]) -> list[str]:
    found: list[str] = []
    if numbers["streams"] == 0 or numbers["streams_correct"] != numbers["streams"]:
        found.append(
            f"{numbers['streams'] - numbers['streams_correct']} of {numbers['streams']} streams differ from batch"
        )
    if numbers["renders_correct"] != numbers["renders"]:
        found.append(f"{numbers['renders'] - numbers['renders_correct']} renders were wrong")
    found += [f"violation: {v}" for v in numbers["violations"]]
    found += [f"mismatch: {m}" for m in numbers["mismatches"]]
    allowed = (
        "409 stream_state_expired",
        "409 fingerprint_mismatch",
        "503",
        "503 (balancer)",  # no replica of the pool up at that moment
        "502 (balancer)",  # a replica died under the request after HAProxy's retries
        "504 (balancer)",
    )
    for kind, count in numbers["errors_by_kind"].items():
        if not (kind in allowed or kind.startswith("transport")):
            found.append(f"{count} x {kind}: not an error the protocol allows")
    for proc in numbers["processes"]:
        if proc["seconds"] < 10:
            continue
        if proc["rss_last_mib"] > proc["rss_first_mib"] * RSS_GROWTH_RATIO + RSS_GROWTH_MIB:
            found.append(f"{proc['process']}: RSS {proc['rss_first_mib']:.0f} -> {proc['rss_last_mib']:.0f} MiB")
        if proc["fds_last"] > proc["fds_first"] + FD_GROWTH:
            found.append(f"{proc['process']}: fds {proc['fds_first']} -> {proc['fds_last']}")
    return found


def render_text(numbers: dict[str, Any]) -> str:
    lines = [
        f"duration {numbers['duration_s']} s; requests {numbers['requests']} "
        f"({numbers['chunks']} derender chunks, {numbers['renders']} renders, {numbers['renders_correct']} correct)",
        f"streams {numbers['streams']} ({numbers['streams_by_mode']}), equal to their batch derender: "
        f"{numbers['streams_correct']}",
        f"faults injected: {numbers['faults']}",
        f"stream restarts (409, the protocol's retry): {numbers['restarts_by_code']}",
        f"client-visible errors by kind (each retried): {numbers['errors_by_kind']}",
        f"replays: {numbers['counters'].get('render_stream_replays_total', 0):.0f} "
        f"({numbers['counters'].get('render_stream_replayed_tokens_total', 0):.0f} tokens); "
        f"Redis errors {numbers['counters'].get('render_redis_errors_total', 0):.0f}; "
        f"503 back-pressure {numbers['counters'].get('render_overload_rejections_total', 0):.0f}",
        f"chunk latency p50 {numbers['chunk_p50_ms']} ms",
        "",
        "| window | seconds | chunks | chunk p99 ms | renders | render p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for w in numbers["windows"]:
        lines.append(
            f"| {w['fault']} | {w['seconds']} | {w['chunks']} | {w['chunk_p99_ms']} | {w['renders']} | {w['render_p99_ms']} |"
        )
    lines += [
        "",
        "| replica process | seconds sampled | RSS first / last / max MiB | fds first / last / max |",
        "|---|---|---|---|",
    ]
    for p in numbers["processes"]:
        lines.append(
            f"| {p['process']} | {p['seconds']:.0f} | {p['rss_first_mib']:.1f} / {p['rss_last_mib']:.1f} / "
            f"{p['rss_max_mib']:.1f} | {p['fds_first']} / {p['fds_last']} / {p['fds_max']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=200, help="streams in flight per pool (default 200)")
    parser.add_argument("--renders", type=int, default=20, help="render clients in flight (default 20)")
    parser.add_argument("--chunk-pause", type=float, default=0.05, help="seconds between a stream's chunks")
    parser.add_argument("--baseline", type=float, default=10.0, help="seconds of load before the first fault")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        concurrency=args.concurrency,
        render_concurrency=args.renders,
        chunk_pause=args.chunk_pause,
        baseline=args.baseline,
    )
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        model_dir = build_example_model(Path(tmp) / "tinyqwen3", "qwen3")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        result = run_chaos(model_dir, logs, config)
    numbers = summary(result)
    print(render_text(numbers))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1) + "\n")
    found = problems(result, numbers)
    for problem in found:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
