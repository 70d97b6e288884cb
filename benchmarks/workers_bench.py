"""1 worker vs 2 workers (and vLLM) on the ~9k-token chat render, driven by wrk; plus the
in-process snapshot hit rate of streaming derender with 2 workers and no Redis.

wrk (Debian's) generates the load with a Lua script rotating pre-built bodies, so the load
generator takes little CPU itself. Run on an otherwise idle machine:

    python3 -m benchmarks.workers_bench [--duration 20] [--connections 8] [--skip-vllm]

`--lag-study` instead measures where the event-loop lag of saturated workers comes from: the
same ~9k-token chat load with wrk at normal priority vs `nice 19`, workers floating vs pinned
one per core, and one worker alone on a core (wrk on the other), each repeated; the servers run
with benchmarks/lag_probe.py, which records every lag sample exactly with the loop thread's CPU
and run-queue delay over it:

    python3 -m benchmarks.workers_bench --lag-study [--duration 15] [--lag-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks import render_bench
from benchmarks._common import (
    Server,
    example_model_dir,
    free_port,
    percentile,
    process_tree,
    start_render_service,
    start_vllm_render,
    wait_healthy,
)

LUA = """
-- Requests are formatted once: the per-request cost in wrk is then a table lookup.
local requests = {}
local i = 0
for n = 1, %(count)d do
  local f = io.open("%(dir)s/body" .. n .. ".json", "rb")
  local body = f:read("*all")
  f:close()
  requests[n] = wrk.format("POST", "/v1/chat/completions/render", {["Content-Type"] = "application/json"}, body)
end
request = function()
  i = i %% #requests + 1
  return requests[i]
end
"""


def run_wrk(url: str, script: Path, duration: int, connections: int, prefix: Sequence[str] = ()) -> dict[str, float]:
    out = subprocess.run(
        [*prefix, "wrk", "-t", "1", "-c", str(connections), "-d", f"{duration}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {}
    for pct in ("50", "99"):
        match = re.search(rf"\s{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(match.group(1)), match.group(2)
        lat[pct] = value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": lat["50"], "p99_ms": lat["99"], "non2xx": float(errors.group(1)) if errors else 0}


def scrape_workers(url: str, count: int, tries: int = 60) -> dict[str, str]:
    """The /metrics text of each worker (a new connection lands on any worker)."""
    seen: dict[str, str] = {}
    for _ in range(tries):
        text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}).text
        match = re.search(r'render_worker_info\{worker="(\d+)"\}', text)
        if match:
            seen[match.group(1)] = text
        if len(seen) >= count:
            break
    return seen


def metric_sum(text: str, name: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if (line.startswith(name) and "{" in line) or line.startswith(name + " ")
    )


def lag_buckets(text: str, name: str = "render_event_loop_lag_seconds") -> list[tuple[float, float]]:
    """(le, cumulative count) of one of the service's event-loop histograms."""
    buckets = []
    for line in text.splitlines():
        match = re.match(name + r'_bucket\{le="([^"]+)"\} ([\d.e+]+)', line)
        if match:
            buckets.append((float(match.group(1)), float(match.group(2))))
    return buckets


def bucket_p99_ms(buckets: list[tuple[float, float]]) -> float:
    """The upper bound of the bucket holding the 99th percentile (what the histogram can say)."""
    total = buckets[-1][1] if buckets else 0.0
    for bound, count in buckets:
        if total and count >= 0.99 * total:
            return bound * 1000
    return float("nan")


def lag_p99_ms(text: str, name: str = "render_event_loop_lag_seconds") -> float:
    return bucket_p99_ms(lag_buckets(text, name))


def stream_hit_rate(url: str, model_dir: str, streams: int = 8, tokens: int = 300) -> dict[str, float]:
    with httpx.Client(base_url=url, timeout=30) as http:  # one keep-alive connection per client
        chat = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Think, then answer."}]}
        prompt = http.post("/v1/chat/completions/render", json=chat).json()["token_ids"]
        output = http.post("/tokenize", json={"prompt": "<think>" + "reason step by step " * tokens}).json()["tokens"]
    for stream in range(streams):
        with httpx.Client(base_url=url, timeout=30) as http:
            state = None
            for token in output[:tokens]:
                body = {
                    "stream": True,
                    "model": "tinyqwen3",
                    "chat_request": chat,
                    "prompt_token_ids": prompt,
                    "stream_state": state,
                    "generate_chunk": {
                        "request_id": f"generate-tokens-{stream}",
                        "choices": [{"index": 0, "finish_reason": None, "token_ids": [token]}],
                    },
                }
                state = http.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
    texts = scrape_workers(url, 2).values()
    hits = sum(metric_sum(t, "render_snapshot_hits_total") for t in texts)
    misses = sum(metric_sum(t, "render_snapshot_misses_total") for t in texts)
    replays = sum(metric_sum(t, "render_stream_replays_total") for t in texts)
    return {"hits": hits, "misses": misses, "replays": replays, "hit_rate": hits / max(1.0, hits + misses)}


# -- --lag-study ----------------------------------------------------------------------------

LAG_CONFIGS = (
    # name, workers, wrk niceness ("idle": SCHED_IDLE; None: no load, the idle baseline), pin workers one per
    # core, wrk's CPUs
    ("2 workers idle (no wrk)", 2, None, False, None),
    ("2 workers, wrk nice 0", 2, 0, False, None),
    ("2 workers, wrk nice 19", 2, 19, False, None),
    ("2 workers, wrk SCHED_IDLE", 2, "idle", False, None),
    ("2 workers pinned, wrk nice 19", 2, 19, True, None),
    ("2 workers pinned, wrk nice 0", 2, 0, True, None),
    ("1 worker on cpu0, wrk on cpu1", 1, 0, True, "1"),
)


def start_probe_service(model: str, port: int, flags: Sequence[str], log: Path) -> Server:
    """benchmarks/lag_probe.py: `render-service serve` with the lag probe in every worker."""
    command = [
        sys.executable,
        str(Path(__file__).resolve().parent / "lag_probe.py"),
        "serve",
        model,
        "--port",
        str(port),
        *flags,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = Server("ours+probe", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log)
    try:
        wait_healthy(server.url, 120, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def worker_pids(server: Server, count: int) -> list[int]:
    """The worker processes: the root itself with one worker, else its children."""
    assert server.pid is not None
    tree = process_tree(server.pid)
    return tree[:1] if count == 1 else [pid for pid in tree if pid != server.pid]


def scrape_each(url: str, path: str, count: int, worker_of: Any, tries: int = 80) -> dict[str, Any]:
    """`path` from every worker: new connections until `count` distinct workers answered."""
    seen: dict[str, Any] = {}
    for _ in range(tries):
        response = httpx.get(f"{url}{path}", headers={"Connection": "close"})
        worker = worker_of(response)
        if worker is not None:
            seen[worker] = response
        if len(seen) >= count:
            break
    if len(seen) < count:
        raise SystemExit(f"only {len(seen)} of {count} workers answered {path}")
    return seen


def _metrics_worker(response: httpx.Response) -> str | None:
    match = re.search(r'render_worker_info\{worker="(\d+)"\}', response.text)
    return match.group(1) if match else None


def _steal_seconds() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def lag_run(
    server: Server,
    workers: int,
    script: Path,
    args: argparse.Namespace,
    nice: int | str | None,
    pin: bool,
    wrk_cpus: str | None,
) -> dict[str, Any]:
    url = server.url
    pids = worker_pids(server, workers)
    cpus = sorted(os.sched_getaffinity(0))
    for index, pid in enumerate(pids):  # pin (or un-pin) every thread of each worker
        mask = str(cpus[index % len(cpus)]) if pin else ",".join(map(str, cpus))
        subprocess.run(["taskset", "-a", "-p", "-c", mask, str(pid)], check=True, capture_output=True)
    prefix = [
        *(["taskset", "-c", wrk_cpus] if wrk_cpus else []),
        *(["chrt", "--idle", "0"] if nice == "idle" else ["nice", "-n", str(nice)] if nice else []),
    ]
    before = {w: lag_buckets(r.text) for w, r in scrape_each(url, "/metrics", workers, _metrics_worker).items()}
    load = os.getloadavg()[0]
    steal = _steal_seconds()
    started = time.time()
    if nice is None:
        time.sleep(args.duration)
        result: dict[str, Any] = {"rps": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"), "non2xx": 0.0}
    else:
        result = run_wrk(url, script, args.duration, args.connections, prefix)
    ended = time.time()
    steal = _steal_seconds() - steal
    after = {w: lag_buckets(r.text) for w, r in scrape_each(url, "/metrics", workers, _metrics_worker).items()}
    probes = scrape_each(url, "/_probe/lag", workers, lambda r: r.json()["worker"])
    # The service's own histogram over the run (delta per worker): the p99 bucket, worst worker.
    result["hist_p99_ms"] = max(
        bucket_p99_ms([(b, c - dict(before[w]).get(b, 0.0)) for b, c in after[w]]) for w in after
    )
    samples = [s for r in probes.values() for s in r.json()["samples"] if started + 1.0 <= s[0] <= ended - 0.2]
    lag = [s[1] * 1000 for s in samples]
    wait = [s[3] * 1000 for s in samples]
    held = [max(0.0, s[1] - s[3]) * 1000 for s in samples]  # lag not covered by run-queue delay
    sched = [min(s[1], s[3]) * 1000 for s in samples]  # at most this much of the lag was waiting for a core
    busy = [s[2] / (0.05 + s[1]) for s in samples]  # the loop thread's CPU share over the sample
    # Task steps: how long one piece of Python work holds the loop (wall), and on the CPU (thread time).
    steps = [s for r in probes.values() for s in r.json()["steps"] if started + 1.0 <= s[0] <= ended - 0.2]
    step_wall = [s[1] * 1000 for s in steps]
    step_cpu = [s[2] * 1000 for s in steps]
    result.update(
        samples=len(samples),
        lag_p50_ms=percentile(lag, 50),
        lag_p99_ms=percentile(lag, 99),
        lag_max_ms=max(lag),
        over_5ms=sum(v > 5 for v in lag) / len(lag),
        held_p99_ms=percentile(held, 99),
        sched_p99_ms=percentile(sched, 99),
        wait_per_sample_p99_ms=percentile(wait, 99),
        loop_busy=sum(busy) / len(busy),
        step_wall_p99_ms=percentile(step_wall, 99),
        step_cpu_p99_ms=percentile(step_cpu, 99),
        step_cpu_max_ms=max(step_cpu, default=float("nan")),
        step_offcpu_share=1 - sum(step_cpu) / max(sum(step_wall), 1e-9),
        steal_s=steal,
        load_before=load,
    )
    return result


def lag_study(args: argparse.Namespace, flags: list[str], script: Path, directory: str) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in LAG_CONFIGS}
    for workers in (2, 1):
        configs = [c for c in LAG_CONFIGS if c[1] == workers]
        port = free_port()
        server = start_probe_service(
            args.model, port, [*flags, "--workers", str(workers)], Path(directory, f"probe-{workers}.log")
        )
        try:
            run_wrk(server.url, script, 3, args.connections)  # warm-up
            for repeat in range(args.lag_repeats):
                for name, _, nice, pin, wrk_cpus in configs if repeat % 2 == 0 else configs[::-1]:
                    result = lag_run(server, workers, script, args, nice, pin, wrk_cpus)
                    results[name].append(result)
                    print(
                        f"{name:<32} {result['rps']:7.0f} req/s  lag p99 {result['lag_p99_ms']:5.2f} ms "
                        f"(histogram <= {result['hist_p99_ms']:g} ms, max {result['lag_max_ms']:.1f}, "
                        f"{result['over_5ms'] * 100:.1f}% > 5 ms)  held p99 {result['held_p99_ms']:.2f}  "
                        f"sched p99 {result['sched_p99_ms']:.2f}  loop busy {result['loop_busy'] * 100:.0f}%  "
                        f"step wall/cpu p99 {result['step_wall_p99_ms']:.2f}/{result['step_cpu_p99_ms']:.2f} "
                        f"(max cpu {result['step_cpu_max_ms']:.2f}, {result['step_offcpu_share'] * 100:.0f}% off-CPU) "
                        f"steal {result['steal_s']:.2f} s  load {result['load_before']:.1f}",
                        flush=True,
                    )
        finally:
            server.stop()

    def span(values: list[float], digits: int = 2) -> str:
        low, high = min(values), max(values)
        return (
            f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}-{high:.{digits}f}"
        )

    print(
        f"\nevent-loop lag, ~9k-token chat, wrk -c {args.connections}, {args.duration}s x {args.lag_repeats} "
        "per configuration (ranges over the repeats; lag from the probe's exact samples, pooled over workers)"
    )
    columns = (
        ("req/s", "rps", 0, 11),
        ("lag p99 ms", "lag_p99_ms", 2, 13),
        ("hist p99 <=", "hist_p99_ms", 0, 12),
        ("held p99", "held_p99_ms", 2, 11),
        ("sched p99", "sched_p99_ms", 2, 13),
        ("% > 5 ms", "over_5ms", 1, 10),
        ("loop busy %", "loop_busy", 0, 12),
        ("step cpu p99", "step_cpu_p99_ms", 2, 13),
        ("step cpu max", "step_cpu_max_ms", 2, 13),
    )
    print(f"{'configuration':<32}" + "".join(f"{title:>{width}}" for title, _, _, width in columns))
    for name, runs in results.items():
        if runs:
            scale = {"over_5ms": 100, "loop_busy": 100}
            print(
                f"{name:<32}"
                + "".join(
                    f"{span([r[key] * scale.get(key, 1) for r in runs], digits):>{width}}"
                    for _, key, digits, width in columns
                )
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", help="model folder (default: the tiny Qwen3 example model, built into a temp folder)"
    )
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--lag-study", action="store_true", help="only the event-loop lag study (see above)")
    parser.add_argument("--lag-repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    args.model = example_model_dir(args.model)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    workload = render_bench.build_workload(render_bench.SCENARIOS["long9k"], 1, 8)
    flags = [
        "--served-model-name",
        "tinyqwen3",
        "--reasoning-parser",
        "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--max-model-len",
        "16384",
    ]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for n, body in enumerate(workload.bodies, 1):
            Path(directory, f"body{n}.json").write_bytes(body)
        script = Path(directory, "rotate.lua")
        script.write_text(LUA % {"count": len(workload.bodies), "dir": directory})
        if args.lag_study:
            study = lag_study(args, flags, script, directory)
            if args.json_out:
                Path(args.json_out).write_text(orjson.dumps(study, option=orjson.OPT_INDENT_2).decode())
            return
        targets = [("ours 1 worker", ["--workers", "1"]), ("ours 2 workers", ["--workers", "2"])]
        for name, extra in targets:
            port = free_port()
            server = start_render_service(
                args.model, port, [*flags, *extra], log=Path(directory, f"ours-{extra[1]}.log")
            )
            try:
                url = f"http://127.0.0.1:{port}"
                run_wrk(url, script, 3, args.connections)  # warm-up
                results[name] = run_wrk(url, script, args.duration, args.connections)
                workers = int(extra[1])
                texts = scrape_workers(url, workers)
                results[name]["loop_lag_p99_ms"] = max(lag_p99_ms(t) for t in texts.values())
                # the part of the lag the loop's own work caused (run-queue wait taken out)
                results[name]["loop_held_p99_ms"] = max(
                    lag_p99_ms(t, "render_event_loop_held_seconds") for t in texts.values()
                )
                if workers == 2:
                    results["stream hit rate, 2 workers, no Redis"] = stream_hit_rate(url, args.model)
            finally:
                server.stop()
            print(name, json.dumps(results[name]), flush=True)
        if not args.skip_vllm:
            port = free_port()
            server = start_vllm_render(args.model, port, flags)
            try:
                url = f"http://127.0.0.1:{port}"
                run_wrk(url, script, 3, args.connections)
                results["vLLM"] = run_wrk(url, script, args.duration, args.connections)
            finally:
                server.stop()
            print("vLLM", json.dumps(results["vLLM"]), flush=True)
    one, two = results["ours 1 worker"], results["ours 2 workers"]
    print(f"\n~9k-token chat render, wrk -c {args.connections}, {args.duration}s per target")
    print(f"{'target':<16}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'loop lag p99 ms':>17}{'loop held p99 ms':>18}")
    for name in ("ours 1 worker", "ours 2 workers", "vLLM"):
        if name in results:
            r = results[name]
            print(
                f"{name:<16}{r['rps']:>9.1f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
                f"{r.get('loop_lag_p99_ms', float('nan')):>17.1f}{r.get('loop_held_p99_ms', float('nan')):>18.1f}"
            )
    print(f"2 workers / 1 worker: {two['rps'] / one['rps']:.2f}x req/s")
    if "vLLM" in results:
        print(
            f"2 workers / vLLM: {two['rps'] / results['vLLM']['rps']:.1f}x req/s "
            f"(p99 ours {two['p99_ms']:.0f} ms vs vLLM {results['vLLM']['p99_ms']:.0f} ms)"
        )
    hit = results["stream hit rate, 2 workers, no Redis"]
    print(
        f"streaming, 2 workers, no Redis, keep-alive client: {hit['hit_rate'] * 100:.1f}% of chunks hit the "
        f"in-process snapshot ({int(hit['hits'])} hits, {int(hit['misses'])} misses, {int(hit['replays'])} replays)"
    )
    if args.json_out:
        Path(args.json_out).write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
