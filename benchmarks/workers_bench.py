"""1 worker vs 2 workers (and vLLM) on the ~9k-token chat render, driven by wrk; plus the
in-process snapshot hit rate of streaming derender with 2 workers and no Redis.

wrk (Debian's) generates the load with a Lua script rotating pre-built bodies, so the load
generator takes little CPU itself. Run on an otherwise idle machine:

    python3 benchmarks/workers_bench.py [--duration 20] [--connections 8] [--skip-vllm]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import render_bench
from _common import free_port, start_render_service, start_vllm_render

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


def run_wrk(url: str, script: Path, duration: int, connections: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{duration}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True, check=True).stdout
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
    return sum(float(line.split()[-1]) for line in text.splitlines() if (line.startswith(name) and "{" in line)
               or line.startswith(name + " "))


def lag_p99_ms(text: str) -> float:
    buckets = []
    total = 0.0
    for line in text.splitlines():
        match = re.match(r'render_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([\d.e+]+)', line)
        if match:
            buckets.append((float(match.group(1)), float(match.group(2))))
        if line.startswith("render_event_loop_lag_seconds_count"):
            total = float(line.split()[-1])
    for bound, count in buckets:
        if total and count >= 0.99 * total:
            return bound * 1000
    return float("nan")


def stream_hit_rate(url: str, model_dir: str, streams: int = 8, tokens: int = 300) -> dict[str, float]:
    with httpx.Client(base_url=url, timeout=30) as http:  # one keep-alive connection per client
        chat = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Think, then answer."}]}
        prompt = http.post("/v1/chat/completions/render", json=chat).json()["token_ids"]
        output = http.post("/tokenize", json={"prompt": "<think>" + "reason step by step " * tokens}).json()["tokens"]
    for stream in range(streams):
        with httpx.Client(base_url=url, timeout=30) as http:
            state = None
            for token in output[:tokens]:
                body = {"stream": True, "model": "tinyqwen3", "chat_request": chat, "prompt_token_ids": prompt,
                        "stream_state": state, "generate_chunk": {
                            "request_id": f"generate-tokens-{stream}",
                            "choices": [{"index": 0, "finish_reason": None, "token_ids": [token]}]}}
                state = http.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
    texts = scrape_workers(url, 2).values()
    hits = sum(metric_sum(t, "render_snapshot_hits_total") for t in texts)
    misses = sum(metric_sum(t, "render_snapshot_misses_total") for t in texts)
    replays = sum(metric_sum(t, "render_stream_replays_total") for t in texts)
    return {"hits": hits, "misses": misses, "replays": replays, "hit_rate": hits / max(1.0, hits + misses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/work/fixtures/tinyqwen3")
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    workload = render_bench.build_workload(render_bench.SCENARIOS["long9k"], 1, 8)
    flags = ["--served-model-name", "tinyqwen3", "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
             "--tool-call-parser", "hermes", "--max-model-len", "16384"]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for n, body in enumerate(workload.bodies, 1):
            Path(directory, f"body{n}.json").write_bytes(body)
        script = Path(directory, "rotate.lua")
        script.write_text(LUA % {"count": len(workload.bodies), "dir": directory})
        targets = [("ours 1 worker", ["--workers", "1"]), ("ours 2 workers", ["--workers", "2"])]
        for name, extra in targets:
            port = free_port()
            server = start_render_service(args.model, port, [*flags, *extra],
                                          log=Path(directory, f"ours-{extra[1]}.log"))
            try:
                url = f"http://127.0.0.1:{port}"
                run_wrk(url, script, 3, args.connections)  # warm-up
                results[name] = run_wrk(url, script, args.duration, args.connections)
                workers = int(extra[1])
                texts = scrape_workers(url, workers)
                results[name]["loop_lag_p99_ms"] = max(lag_p99_ms(t) for t in texts.values())
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
    print(f"{'target':<16}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'loop lag p99 ms':>17}")
    for name in ("ours 1 worker", "ours 2 workers", "vLLM"):
        if name in results:
            r = results[name]
            print(f"{name:<16}{r['rps']:>9.1f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
                  f"{r.get('loop_lag_p99_ms', float('nan')):>17.1f}")
    print(f"2 workers / 1 worker: {two['rps'] / one['rps']:.2f}x req/s")
    if "vLLM" in results:
        print(f"2 workers / vLLM: {two['rps'] / results['vLLM']['rps']:.1f}x req/s "
              f"(p99 ours {two['p99_ms']:.0f} ms vs vLLM {results['vLLM']['p99_ms']:.0f} ms)")
    hit = results["stream hit rate, 2 workers, no Redis"]
    print(f"streaming, 2 workers, no Redis, keep-alive client: {hit['hit_rate'] * 100:.1f}% of chunks hit the "
          f"in-process snapshot ({int(hit['hits'])} hits, {int(hit['misses'])} misses, {int(hit['replays'])} replays)")
    if args.json_out:
        Path(args.json_out).write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
