"""CPU sizing report: step the offered load against a running target and size the render tier.

    python -m loadtests.size --host http://127.0.0.1:8000 --pid PID --scenario long9k \
        --slo-p99-ms 100 --out loadtests/reports/NAME

Closed-loop concurrency steps (1, 2, 4, ... connections, each sending the scenario's pre-built
bodies back to back) from a cheap asyncio + httpx generator in this one process: locust's own
CPU would compete with the server on a small machine and hide its scaling. For each step it
records throughput, p50/p99 latency, errors and the server's CPU: utime+stime of the server's
whole process tree from /proc when --pid is given (all workers), else the sum over workers of
`render_cpu_seconds_total` from /metrics (request-handling CPU only, so a lower bound). It then
finds the highest load whose p99 meets the objective and writes report.md plus PNG charts
(latency vs load, CPU per request vs load, req/s per core) saying how many cores and replicas
a target req/s needs. Loopback targets only.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson

from benchmarks._common import tree_cpu_seconds
from loadtests import payloads

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Step:
    concurrency: int
    seconds: float
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_seconds: float  # server CPU during the step
    cores_used: float  # cpu_seconds / seconds
    cpu_ms_per_request: float
    rps_per_core: float
    client_cores: float = 0.0  # this load generator's own CPU during the step
    meets_slo: bool = False


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class CpuProbe:
    """Server CPU seconds: /proc of the process tree, or render_cpu_seconds_total per worker."""

    def __init__(self, host: str, pid: int | None, workers_hint: int = 8) -> None:
        self.host, self.pid, self.workers_hint = host, pid, workers_hint
        self.source = (
            "/proc/<pid>/stat, whole process tree (utime+stime, all workers)"
            if pid
            else "/metrics render_cpu_seconds_total summed over workers (request CPU only, lower bound)"
        )

    def read(self) -> float:
        if self.pid:
            return tree_cpu_seconds(self.pid)
        per_worker: dict[str, float] = {}
        with httpx.Client(base_url=self.host, timeout=10) as http:
            for _ in range(self.workers_hint * 4):  # each scrape lands on one worker
                text = http.get("/metrics", headers={"connection": "close"}).text
                worker, total = "0", 0.0
                for line in text.splitlines():
                    if line.startswith("render_worker_info{"):
                        worker = line.split('"')[1]
                    elif line.startswith("render_cpu_seconds_total"):
                        total += float(line.rsplit(" ", 1)[1])
                per_worker[worker] = total
        return sum(per_worker.values())


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client for pre-built requests: a fraction of httpx's CPU per
    request, so the generator leaves the machine's cores to the server."""

    def __init__(self, host: str) -> None:
        parts = urlsplit(host)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.authority = parts.netloc
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def request(self, path: str, body: bytes) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nhost: {self.authority}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def send(self, raw: bytes) -> int:
        """Sends one pre-built request, reads the whole answer; returns the status code."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(*self.address)
        assert self.reader is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked, close = 0, False, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            await self.reader.readexactly(length)
        if close:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer, self.reader = None, None


async def run_step(
    host: str,
    bodies: tuple[bytes, ...],
    concurrency: int,
    seconds: float,
    warmup: float,
    probe: CpuProbe,
    tick: asyncio.Queue[float] | None = None,
    client_kind: str = "raw",
) -> Step:
    latencies: list[float] = []
    errors = 0
    measuring = False
    stop_at = time.perf_counter() + warmup + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=host, timeout=60, limits=limits) as client:

        async def connection(index: int) -> None:
            nonlocal errors
            n = index
            raw = RawConnection(host)
            prebuilt = [raw.request(payloads.RENDER_PATH, body) for body in bodies]
            while time.perf_counter() < stop_at:
                body = bodies[n % len(bodies)]
                t0 = time.perf_counter()
                try:
                    if client_kind == "raw":
                        ok = await raw.send(prebuilt[n % len(bodies)]) == 200
                    else:
                        response = await client.post(payloads.RENDER_PATH, content=body, headers=payloads.HEADERS)
                        ok = response.status_code == 200
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError):
                    ok = False
                    await raw.close()
                n += concurrency
                if measuring:
                    if ok:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors += 1

        tasks = [asyncio.create_task(connection(i)) for i in range(concurrency)]
        await asyncio.sleep(warmup)
        measuring = True
        cpu0, t0, own0 = probe.read(), time.perf_counter(), time.process_time()
        while time.perf_counter() < stop_at - 0.05:
            await asyncio.sleep(min(1.0, stop_at - time.perf_counter()))
            if tick is not None:
                tick.put_nowait(1.0)
        measuring = False
        elapsed, cpu = time.perf_counter() - t0, probe.read() - cpu0
        own = time.process_time() - own0
        await asyncio.gather(*tasks)
    done = len(latencies)
    rps = done / elapsed
    cores = cpu / elapsed
    return Step(
        concurrency,
        elapsed,
        done,
        errors,
        rps,
        percentile(latencies, 50) * 1000,
        percentile(latencies, 99) * 1000,
        cpu,
        cores,
        cpu / max(1, done) * 1000,
        rps / cores if cores > 0 else float("nan"),
        own / elapsed,
    )


def charts(steps: list[Step], slo_ms: float, out: Path, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rps = [s.rps for s in steps]
    made = []

    def save(fig: object, name: str) -> None:
        fig.tight_layout()  # type: ignore[attr-defined]
        fig.savefig(out / name, dpi=90)  # type: ignore[attr-defined]
        plt.close(fig)  # type: ignore[arg-type]
        made.append(name)

    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(rps, [s.p50_ms for s in steps], "o-", label="p50")
    ax.plot(rps, [s.p99_ms for s in steps], "s-", label="p99")
    ax.axhline(slo_ms, color="red", linestyle="--", label=f"p99 objective {slo_ms:g} ms")
    for s in steps:
        ax.annotate(f"c={s.concurrency}", (s.rps, s.p99_ms), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set(xlabel="throughput (req/s)", ylabel="latency (ms)", title=f"{title}: latency vs load")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "latency_vs_load.png")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(rps, [s.cpu_ms_per_request for s in steps], "o-")
    ax.set(
        xlabel="throughput (req/s)",
        ylabel="server CPU ms per request",
        title=f"{title}: CPU per request",
        ylim=(0, max(s.cpu_ms_per_request for s in steps) * 1.2),
    )
    ax.grid(alpha=0.3)
    save(fig, "cpu_per_request_vs_load.png")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.bar([str(s.concurrency) for s in steps], [s.rps_per_core for s in steps], color="tab:green")
    ax2 = ax.twinx()
    ax2.plot([str(s.concurrency) for s in steps], [s.cores_used for s in steps], "ko-", label="cores used")
    ax.set(xlabel="concurrent connections", ylabel="req/s per core busy", title=f"{title}: req/s per core")
    ax2.set_ylabel("server cores used")
    ax2.set_ylim(0, max(max(s.cores_used for s in steps) * 1.15, 1.0))
    ax2.legend(loc="lower right")
    save(fig, "rps_per_core.png")
    return made


def report(
    args: argparse.Namespace,
    steps: list[Step],
    probe: CpuProbe,
    command: str,
    images: list[str],
    prompt_tokens: int | None,
) -> str:
    ok = [s for s in steps if s.p99_ms <= args.slo_p99_ms and s.errors == 0]
    best = max(ok, key=lambda s: s.rps) if ok else None
    cpus = len(os.sched_getaffinity(0))
    lines = [
        f"# Sizing report: `{args.scenario}` chat render, p99 <= {args.slo_p99_ms:g} ms",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node()} ({cpus} CPUs usable, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}).",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Target: `{args.host}`{f' ({args.label})' if args.label else ''}. Scenario: "
        f"{payloads.SCENARIOS[args.scenario].description}"
        + (f", {prompt_tokens} prompt tokens (first variant)" if prompt_tokens else "")
        + f", {payloads.VARIANTS} rotating variants. Load: closed-loop concurrency steps, "
        f"{args.step_seconds:g} s each after {args.warmup_seconds:g} s warm-up, from one asyncio process "
        f"({'a minimal HTTP/1.1 keep-alive client over pre-built requests' if args.client == 'raw' else 'httpx'}"
        f", one connection per concurrent client). Server CPU: {probe.source}.",
        "",
    ]
    if best:
        per_core = best.rps_per_core
        reached = any(not s.meets_slo for s in steps)
        lines += [
            "## Headline",
            "",
            f"- **Capacity at the objective: {'' if reached else 'at least '}{best.rps:.1f} req/s per replica"
            "**"
            + ("" if reached else " (every step met the objective: the machine, not the latency, bounded the run)")
            + f" (concurrency "
            f"{best.concurrency}, p50 {best.p50_ms:.1f} ms, p99 {best.p99_ms:.1f} ms), using "
            f"{best.cores_used:.2f} cores.",
            f"- **{per_core:.1f} req/s per core** at that point ({best.cpu_ms_per_request:.1f} CPU-ms per request).",
            f"- Planning at {args.headroom:.0%} of capacity: one replica like this one serves "
            f"{best.rps * args.headroom:.0f} req/s; one core serves {per_core * args.headroom:.0f} req/s.",
            "",
        ]
        lines += [
            "## How many cores and replicas",
            "",
            f"Replicas are this replica's shape ({best.cores_used:.1f} cores busy at capacity); cores = "
            f"target / ({per_core:.1f} req/s per core x {args.headroom:.0%} headroom), rounded up.",
            "",
            "| target req/s | cores | replicas of this shape |",
            "|---:|---:|---:|",
        ]
        for target in sorted({*args.target_rps}):
            cores = math.ceil(target / (per_core * args.headroom))
            replicas = math.ceil(target / (best.rps * args.headroom))
            lines.append(f"| {target:g} | {cores} | {replicas} |")
        lines.append("")
    else:
        lines += [
            "## Headline",
            "",
            f"**No step met p99 <= {args.slo_p99_ms:g} ms without errors**: "
            "the objective is below this target's single-request latency; relax it or add capacity.",
            "",
        ]
    lines += [
        "## Steps",
        "",
        "| connections | req/s | p50 ms | p99 ms | errors | server cores | CPU ms/req | req/s per core | "
        "generator cores | meets objective |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for s in steps:
        lines.append(
            f"| {s.concurrency} | {s.rps:.1f} | {s.p50_ms:.1f} | {s.p99_ms:.1f} | {s.errors} | "
            f"{s.cores_used:.2f} | {s.cpu_ms_per_request:.2f} | {s.rps_per_core:.1f} | "
            f"{s.client_cores:.2f} | {'yes' if s.meets_slo else 'no'} |"
        )
    busiest = max(steps, key=lambda s: s.cores_used + s.client_cores)
    if busiest.cores_used + busiest.client_cores > 0.85 * cpus:
        lines += [
            "",
            f"**Note:** at {busiest.concurrency} connections the server ({busiest.cores_used:.2f} cores) and "
            f"this load generator ({busiest.client_cores:.2f} cores) together used "
            f"{busiest.cores_used + busiest.client_cores:.2f} of the {cpus} CPUs: the machine, not the "
            "server's workers, bounds the last steps. Per-core figures still hold; per-replica req/s on a "
            "dedicated host is higher (server cores used x req/s per core).",
        ]
    lines += ["", "## Charts", ""] + [f"![{name[:-4]}]({name})" for name in images]
    lines += [
        "",
        "## How to read it",
        "",
        "- *latency vs load*: each point is one concurrency step; throughput grows until the server's "
        "cores are saturated, then only latency grows. The capacity is the last point under the red line.",
        "- *CPU per request*: flat means the work per request does not grow with load (no contention "
        "overhead); a rise near saturation is queueing or lock contention.",
        "- *req/s per core*: throughput divided by the cores the server actually used (bars), and the "
        "cores used (line). Cores used stop growing at the worker count (or the machine's cores).",
        "- The load generator shares the machine: on a small host its CPU is not available to the server, "
        "so capacity per core is the number to carry to larger hosts, not per-replica req/s.",
        "",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[Step]:
    bodies = payloads.chat_bodies(args.scenario)
    probe = args.probe
    total = len(args.concurrency) * (args.step_seconds + args.warmup_seconds)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    bar = tqdm(total=round(total), unit="s", desc="sizing", file=sys.stderr) if tqdm else None
    steps: list[Step] = []
    for concurrency in args.concurrency:
        if bar is not None:
            bar.set_postfix_str(f"c={concurrency}")
            bar.update(round(args.warmup_seconds))
        ticks: asyncio.Queue[float] = asyncio.Queue()

        async def drain(q: asyncio.Queue[float] = ticks) -> None:
            while True:
                await q.get()
                if bar is not None:
                    bar.update(1)

        drainer = asyncio.create_task(drain())
        step = await run_step(
            args.host, bodies, concurrency, args.step_seconds, args.warmup_seconds, probe, ticks, args.client
        )
        drainer.cancel()
        step.meets_slo = step.p99_ms <= args.slo_p99_ms and step.errors == 0
        steps.append(step)
        message = (
            f"c={concurrency:>3}: {step.rps:7.1f} req/s  p50 {step.p50_ms:7.1f} ms  p99 {step.p99_ms:7.1f} ms"
            f"  cores {step.cores_used:.2f}  {step.cpu_ms_per_request:.2f} CPU-ms/req  errors {step.errors}"
            f"  generator cores {step.client_cores:.2f}"
        )
        (bar.write if bar is not None else print)(message)
        if not step.meets_slo and args.stop_after_miss and len(steps) > 1 and not steps[-2].meets_slo:
            break  # two steps past the objective: the rest only adds queueing
    if bar is not None:
        bar.close()
    return steps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.size", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", required=True, help="loopback URL of a running target")
    parser.add_argument("--pid", type=int, help="server PID: read CPU from /proc of its process tree")
    parser.add_argument("--scenario", default="long9k", choices=sorted(payloads.SCENARIOS))
    parser.add_argument("--slo-p99-ms", type=float, default=100.0)
    parser.add_argument(
        "--concurrency",
        default="1,2,3,4,6,8,12,16",
        type=lambda s: [int(x) for x in s.split(",")],
        help="comma-separated steps",
    )
    parser.add_argument("--step-seconds", type=float, default=20.0)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--target-rps", default="500,1000,5000,20000", type=lambda s: [float(x) for x in s.split(",")])
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: minimal asyncio HTTP/1.1 keep-alive client (cheapest); httpx: httpx.AsyncClient",
    )
    parser.add_argument("--headroom", type=float, default=0.8, help="plan at this fraction of measured capacity")
    parser.add_argument("--label", default="", help="what the target is, for the report (e.g. 'ours, 2 workers')")
    parser.add_argument(
        "--no-stop-after-miss",
        dest="stop_after_miss",
        action="store_false",
        help="run every step even after two steps miss the objective",
    )
    parser.add_argument("--out", required=True, type=Path, help="report folder (report.md, *.png, steps.json)")
    args = parser.parse_args(argv)
    if urlsplit(args.host).hostname not in LOOPBACK:
        parser.error("only loopback targets (127.0.0.1, localhost, ::1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.probe = CpuProbe(args.host, args.pid)
    prompt_tokens = None
    with httpx.Client(base_url=args.host, timeout=60) as http:
        response = http.post(
            payloads.RENDER_PATH, content=payloads.chat_bodies(args.scenario)[0], headers=payloads.HEADERS
        )
        if response.status_code != 200:
            raise SystemExit(f"{args.host} answered {response.status_code}: {response.text[:300]}")
        prompt_tokens = len(response.json()["token_ids"])
    steps = asyncio.run(main_async(args))
    command = "python -m loadtests.size " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    images = charts(steps, args.slo_p99_ms, args.out, args.scenario)
    (args.out / "report.md").write_text(report(args, steps, args.probe, command, images, prompt_tokens))
    (args.out / "steps.json").write_bytes(orjson.dumps([asdict(s) for s in steps], option=orjson.OPT_INDENT_2))
    best = [s for s in steps if s.meets_slo]
    print(
        f"report: {args.out / 'report.md'}"
        + (f"; capacity {max(s.rps for s in best):.1f} req/s at p99 <= {args.slo_p99_ms:g} ms" if best else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
