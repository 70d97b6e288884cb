#!/usr/bin/env python3
"""Chat render with 1 and 4 images of 1280x720 (JPEG): render-service vs `vllm launch render`,
side by side, each a separate server process measured from the outside.

    python3 -m benchmarks.mm_bench [--oracle-url URL --oracle-pid PID] [--json out.json] [--baseline DIR]

--baseline DIR adds a second build of ours (another checkout's root, e.g. `git archive main
render_service | tar -x -C DIR`) to the sequential rounds, to compare two versions under one load.

Without --oracle-url the script starts vLLM 0.33's render tier itself (the python of
VLLM_ORACLE_PYTHON, with the patched torchvision overlay of tests/parity/record_mm.py on PYTHONPATH:
--mm-torchvision, default $VLLM_TORCHVISION_OVERLAY). Ours is `python -m render_service.cli serve` with PYTHONPATH set to
this checkout, so the code measured is the code next to this script. Both serve the Qwen3-VL
example folder, built into a temporary folder (or --model-dir: the folder an external oracle
serves, as given on its command line; vLLM hashes images with that path).

Scenarios: 1 or 4 images per request; "new": every request carries images never seen before
(each JPEG gets a unique 12-byte COM segment: same pixels, new bytes, so a new mm_hash and a
cache miss); "repeated": every request re-sends the same images (the next turn of a conversation).

1. Before anything is timed, both servers must return the same token ids, mm_hashes and pixel
   tensors (dtype, shape, sha256) for a 1- and a 4-image request.
2. Sequential CPU: N requests one after another to each server, in alternating rounds; server
   CPU per request = utime+stime of the server's process tree (/proc) over the round / N; the
   median round is reported, with vLLM/ours.
3. Load: wrk at --connections (8) for --duration seconds per target: ours with 1 worker, ours
   with 2 workers, vLLM; req/s, p50/p99 latency, server CPU per request and CPU cores used.
   wrk's Lua script builds each "new" request from pre-split parts and a counter, so the client
   costs little (it still shares the machine's cores with the servers).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import (
    Server,
    format_table,
    free_port,
    start_vllm_render,
    stop_process_tree,
    tree_cpu_seconds,
    wait_healthy,
)
from tests.parity.mm_corpus import MM_MAX_MODEL_LEN, MM_MODEL_NAME, build_mm_model, make_image, summarize_item

ROOT = Path(__file__).resolve().parents[1]
# The model folder both servers load, as given on their command lines (set in main).
MODEL_DIR = ""
RENDER_PATH = "/v1/chat/completions/render"
MARKER = "@" * 16  # stands for the 16 base64 characters of a JPEG COM payload (never base64 itself)
SCENARIOS = [(1, "new"), (1, "repeated"), (4, "new"), (4, "repeated")]


# -- payloads ---------------------------------------------------------------------------------


def jpeg_template(seed: int) -> str:
    """A 1280x720 JPEG data URL with MARKER where 12 bytes of a COM segment go.

    The COM segment follows Pillow's 18-byte APP0 (JFIF) segment: SOI(2) + APP0(18) + COM marker
    and length(4) = 24 bytes, a multiple of 3, and the 12 payload bytes end at byte 36, another
    one, so its 16 base64 characters can be swapped without touching the rest of the encoding."""
    buffer = io.BytesIO()
    make_image(1280, 720, seed).save(buffer, "JPEG", quality=85)
    data = buffer.getvalue()
    assert data[:4] == b"\xff\xd8\xff\xe0" and data[4:6] == b"\x00\x10", "expected a JFIF APP0 first"
    head = data[:20] + b"\xff\xfe\x00\x0e"
    return "data:image/jpeg;base64," + base64.b64encode(head).decode() + MARKER + base64.b64encode(data[20:]).decode()


def fill(template: str, counter: int) -> str:
    return template.replace(MARKER, f"{counter:016d}")


MM_PAYLOAD = "tensors"  # --mm-payload: "none" is what llm-d's router asks for (hashes and placeholders only)


def body(urls: list[str]) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    request = {
        "model": MM_MODEL_NAME,
        "messages": [{"role": "user", "content": [*content, {"type": "text", "text": "?"}]}],
    }
    if MM_PAYLOAD != "tensors":
        request["mm_payload"] = MM_PAYLOAD
    return request


class Payloads:
    """Request bodies per scenario; "new" ones never repeat within a run (a global counter)."""

    def __init__(self) -> None:
        self.templates = [jpeg_template(seed) for seed in range(101, 105)]
        self.counter = 10**9  # the repeated images use counters below this

    def new(self, images: int) -> bytes:
        urls = []
        for template in self.templates[:images]:
            self.counter += 1
            urls.append(fill(template, self.counter))
        return json.dumps(body(urls)).encode()

    def repeated(self, images: int) -> bytes:
        return json.dumps(body([fill(t, i) for i, t in enumerate(self.templates[:images])])).encode()

    def template_body(self, images: int) -> str:
        """The "new" body for wrk: MARKER in each image, filled there with a per-request counter."""
        return json.dumps(body(self.templates[:images]))


# -- servers ----------------------------------------------------------------------------------


def start_ours(workers: int, log_dir: Path, root: Path = ROOT, name: str = "") -> Server:
    """Our server from the checkout at `root` (PYTHONPATH; --baseline gives another one)."""
    port = free_port()
    name = name or f"ours w{workers}"
    log = log_dir / f"{name.replace(' ', '-')}.log"
    command = [
        sys.executable,
        "-m",
        "render_service.cli",
        "serve",
        MODEL_DIR,
        "--port",
        str(port),
        "--served-model-name",
        MM_MODEL_NAME,
        "--max-model-len",
        str(MM_MAX_MODEL_LEN),
        "--workers",
        str(workers),
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=str(root),
        )
    server = Server(
        name,
        f"http://127.0.0.1:{port}",
        process.pid,
        owned=True,
        log=log,
        info={"command": f"PYTHONPATH={root} " + " ".join(command)},
    )
    try:
        wait_healthy(server.url, 180, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def start_vllm(torchvision_path: str | None) -> Server:
    if not torchvision_path:
        raise SystemExit("vLLM's Qwen3-VL needs a torchvision overlay: set --mm-torchvision (see record_mm.py)")
    os.environ["PYTHONPATH"] = torchvision_path  # inherited by the oracle process (and only it)
    try:
        return start_vllm_render(
            MODEL_DIR, free_port(), ["--served-model-name", MM_MODEL_NAME, "--max-model-len", str(MM_MAX_MODEL_LEN)]
        )
    finally:
        del os.environ["PYTHONPATH"]


def same_work(ours: Server, vllm: Server, payloads: Payloads) -> None:
    """Abort unless both servers return the same ids, hashes and pixels."""
    for images in (1, 4):
        data = payloads.new(images)
        answers = []
        for server in (ours, vllm):
            response = httpx.post(
                server.url + RENDER_PATH, content=data, timeout=600, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 200, f"{server.name}: {response.status_code} {response.text[:300]}"
            result = response.json()
            features = result["features"]
            kwargs = features["kwargs_data"]  # null with --mm-payload none
            answers.append(
                (
                    result["token_ids"],
                    features["mm_hashes"],
                    features["mm_placeholders"],
                    None
                    if kwargs is None
                    else [summarize_item(item)["pixel_values"] | {"field": None} for item in kwargs["image"]],
                )
            )
        if answers[0] != answers[1]:
            raise SystemExit(f"{images} image(s): ours and vLLM differ; not benchmarking different work")
    print("precheck: token ids, mm_hashes, placeholders and pixel tensors identical", flush=True)


# -- sequential CPU ---------------------------------------------------------------------------


def sequential(
    servers: list[Server], payloads: Payloads, images: int, mode: str, n: int, rounds: int
) -> dict[str, float]:
    """Median over rounds of server CPU ms per request (and wall ms per request)."""
    cpu: dict[str, list[float]] = {s.name: [] for s in servers}
    wall: dict[str, list[float]] = {s.name: [] for s in servers}
    clients = {
        s.name: httpx.Client(base_url=s.url, timeout=600, headers={"Content-Type": "application/json"}) for s in servers
    }
    try:
        if mode == "repeated":
            for server in servers:  # the first turn that put the images in (our) cache
                clients[server.name].post(RENDER_PATH, content=payloads.repeated(images))
        for _ in range(rounds):
            for server in servers:
                bodies = [payloads.new(images) if mode == "new" else payloads.repeated(images) for _ in range(n)]
                client = clients[server.name]
                start_cpu, start_wall = tree_cpu_seconds(server.pid), time.perf_counter()
                for data in bodies:
                    response = client.post(RENDER_PATH, content=data)
                    assert response.status_code == 200, response.text[:300]
                wall[server.name].append((time.perf_counter() - start_wall) / n * 1000)
                cpu[server.name].append((tree_cpu_seconds(server.pid) - start_cpu) / n * 1000)
    finally:
        for client in clients.values():
            client.close()
    return {
        **{f"{k} cpu_ms": statistics.median(v) for k, v in cpu.items()},
        **{f"{k} wall_ms": statistics.median(v) for k, v in wall.items()},
    }


# -- load (wrk) -------------------------------------------------------------------------------

LUA = """
local parts = {}
local fixed = nil
local counter = tonumber(os.getenv("MM_BENCH_COUNTER"))
local f = io.open("%(path)s", "rb")
local text = f:read("*all")
f:close()
if %(unique)s then
  local start = 1
  while true do
    local i, j = string.find(text, "%(marker)s", start, true)
    if not i then break end
    parts[#parts + 1] = string.sub(text, start, i - 1)
    start = j + 1
  end
  parts[#parts + 1] = string.sub(text, start)
else
  fixed = wrk.format("POST", "%(path_url)s", {["Content-Type"] = "application/json"}, text)
end
request = function()
  if fixed then return fixed end
  local out = {parts[1]}
  for k = 2, #parts do
    counter = counter + 1
    out[#out + 1] = string.format("%%016d", counter)
    out[#out + 1] = parts[k]
  end
  return wrk.format("POST", "%(path_url)s", {["Content-Type"] = "application/json"}, table.concat(out))
end
"""


def run_wrk(server: Server, script: Path, duration: int, connections: int, counter: int) -> dict[str, float]:
    env = {**os.environ, "MM_BENCH_COUNTER": str(counter)}
    start_cpu, start_wall = tree_cpu_seconds(server.pid), time.perf_counter()
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{duration}s",
            "--latency",
            "--timeout",
            "60s",
            "-s",
            str(script),
            server.url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    elapsed = time.perf_counter() - start_wall
    cpu = tree_cpu_seconds(server.pid) - start_cpu
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    lat = {}
    for pct in ("50", "99"):
        match = re.search(rf"\s{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)\b", out)
        value, unit = float(match.group(1)), match.group(2)
        lat[pct] = value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    timeouts = re.search(r"timeout (\d+)", out)
    return {
        "rps": requests / duration,
        "p50_ms": lat["50"],
        "p99_ms": lat["99"],
        "requests": requests,
        "cpu_ms_per_req": cpu / max(requests, 1) * 1000,
        "cores": cpu / elapsed,
        "errors": (int(errors.group(1)) if errors else 0) + (int(timeouts.group(1)) if timeouts else 0),
    }


def load(
    servers: list[Server], payloads: Payloads, tmp: Path, duration: int, connections: int
) -> dict[str, dict[str, dict[str, float]]]:
    results: dict[str, dict[str, dict[str, float]]] = {}
    counter = 2 * 10**9
    for images, mode in SCENARIOS:
        name = f"{images}x720p {mode}"
        path = tmp / f"body-{images}-{mode}.json"
        path.write_text(payloads.template_body(images) if mode == "new" else payloads.repeated(images).decode())
        script = tmp / f"wrk-{images}-{mode}.lua"
        script.write_text(
            LUA
            % {"path": path, "unique": "true" if mode == "new" else "false", "marker": MARKER, "path_url": RENDER_PATH}
        )
        results[name] = {}
        for server in servers:
            run_wrk(server, script, 2, connections, counter)  # warm-up (and, repeated: fill the cache)
            counter += 10**6
            results[name][server.name] = run_wrk(server, script, duration, connections, counter)
            counter += 10**6
            r = results[name][server.name]
            print(
                f"  {name:16s} {server.name:8s} {r['rps']:6.1f} req/s  p99 {r['p99_ms']:7.0f} ms  "
                f"{r['cpu_ms_per_req']:6.1f} CPU-ms/req  {r['cores']:.2f} cores  errors {r['errors']}",
                flush=True,
            )
    return results


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle-url", help="a running vLLM render tier serving --model-dir (else started here)")
    parser.add_argument("--oracle-pid", type=int)
    parser.add_argument(
        "--mm-torchvision",
        default=os.environ.get("VLLM_TORCHVISION_OVERLAY"),
        help="the patched torchvision overlay folder for the oracle (default: $VLLM_TORCHVISION_OVERLAY)",
    )
    parser.add_argument("--n", type=int, default=10, help="requests per round, new images")
    parser.add_argument("--n-repeated", type=int, default=40, help="requests per round, repeated images")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=15, help="seconds per wrk run (0: no load phase)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument(
        "--scenarios",
        default=",".join(f"{images} {mode}" for images, mode in SCENARIOS),
        help="comma-separated subset of the sequential scenarios (default: %(default)s)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout's root (e.g. `git archive main render_service | tar -x -C DIR`): its server "
        "joins the sequential rounds as 'baseline', to compare two versions of ours under the same load",
    )
    parser.add_argument(
        "--model-dir",
        help="the Qwen3-VL example folder (python -m render_service.model.example DIR qwen3-vl) as an external "
        "--oracle-url serves it; default: built into a temporary folder",
    )
    parser.add_argument(
        "--mm-payload",
        default="tensors",
        choices=("tensors", "none"),
        help="none: the router's request (no kwargs_data in the response)",
    )
    args = parser.parse_args()
    global MM_PAYLOAD
    MM_PAYLOAD = args.mm_payload
    if args.duration and shutil.which("wrk") is None:
        raise SystemExit("wrk is needed for the load phase (apt-get install wrk), or pass --duration 0")
    if args.oracle_url and not args.model_dir:
        raise SystemExit("--model-dir is needed with --oracle-url: the folder that oracle serves, as given to it")

    tmp = Path(tempfile.mkdtemp(prefix="mm_bench."))
    global MODEL_DIR
    MODEL_DIR = args.model_dir or str(build_mm_model(tmp))
    payloads = Payloads()
    started: list[Server] = []
    try:
        if args.oracle_url:
            if args.oracle_pid is None:
                raise SystemExit("--oracle-pid is needed with --oracle-url (its CPU is read from /proc)")
            vllm = Server("vLLM", args.oracle_url.rstrip("/"), args.oracle_pid)
        else:
            vllm = start_vllm(args.mm_torchvision)
            started.append(vllm)
        ours = start_ours(1, tmp)
        started.append(ours)
        print(f"ours: {ours.info['command']}\nvLLM: {vllm.url} (pid {vllm.pid})", flush=True)
        same_work(ours, vllm, payloads)
        measured = [ours, vllm]
        if args.baseline:
            baseline = start_ours(1, tmp, args.baseline.resolve(), "baseline")
            started.append(baseline)
            same_work(baseline, vllm, payloads)
            measured = [ours, baseline, vllm]

        seq: dict[str, dict[str, float]] = {}
        print(f"\nSequential: server CPU ms per request, median of {args.rounds} alternating rounds")
        chosen = [(int(i), m) for i, m in (name.split() for name in args.scenarios.split(","))]
        for images, mode in chosen:
            n = args.n if mode == "new" else args.n_repeated
            seq[f"{images}x720p {mode}"] = sequential(measured, payloads, images, mode, n, args.rounds)
        rows = []
        for name, r in seq.items():
            rows.append(
                [
                    name,
                    f"{r['ours w1 cpu_ms']:.1f}",
                    f"{r['vLLM cpu_ms']:.1f}",
                    f"{r['vLLM cpu_ms'] / max(r['ours w1 cpu_ms'], 1e-9):.1f}x",
                    f"{r['ours w1 wall_ms']:.1f}",
                    f"{r['vLLM wall_ms']:.1f}",
                    f"{r['ours w1 wall_ms'] / max(r['vLLM wall_ms'], 1e-9):.2f}",
                ]
            )
        headers = [
            "scenario",
            "ours CPU-ms",
            "vLLM CPU-ms",
            "vLLM/ours",
            "ours wall-ms",
            "vLLM wall-ms",
            "wall ours/vLLM",
        ]
        print(format_table(headers, rows))
        if args.baseline:
            print(
                format_table(
                    ["scenario", "baseline CPU-ms", "baseline/ours", "baseline wall-ms"],
                    [
                        [
                            name,
                            f"{r['baseline cpu_ms']:.1f}",
                            f"{r['baseline cpu_ms'] / max(r['ours w1 cpu_ms'], 1e-9):.2f}",
                            f"{r['baseline wall_ms']:.1f}",
                        ]
                        for name, r in seq.items()
                    ],
                )
            )

        loaded: dict[str, Any] = {}
        if args.duration:
            ours2 = start_ours(2, tmp)
            started.append(ours2)
            print(f"\nLoad: wrk -c {args.connections}, {args.duration}s per target (after a 2s warm-up)", flush=True)
            loaded = load([ours, ours2, vllm], payloads, tmp, args.duration, args.connections)
            rows = []
            for name, per in loaded.items():
                for target, r in per.items():
                    rows.append(
                        [
                            f"{name} / {target}",
                            f"{r['rps']:.1f}",
                            f"{r['p50_ms']:.0f}",
                            f"{r['p99_ms']:.0f}",
                            f"{r['cpu_ms_per_req']:.1f}",
                            f"{r['cores']:.2f}",
                            str(r["errors"]),
                        ]
                    )
                rows.append([])
            print(
                format_table(
                    ["scenario / target", "req/s", "p50 ms", "p99 ms", "CPU-ms/req", "cores", "errors"], rows[:-1]
                )
            )
        if args.json_out:
            Path(args.json_out).write_text(
                json.dumps({"sequential": seq, "load": loaded, "ours": ours.info["command"]}, indent=1)
            )
    finally:
        for server in reversed(started):
            if server.owned and server.pid is not None:
                stop_process_tree(server.pid)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
