"""Shared helpers for the benchmark scripts in this folder (not part of the service, not a test).

- starting / stopping servers: render-service and vLLM's `vllm launch render` (with the python of
  the vLLM 0.33 env named by VLLM_ORACLE_PYTHON or --oracle-python), each as a child process;
- the model folder: the tiny Qwen3 example model, built into a temporary folder unless --model;
- measuring a server from the outside: CPU time (utime+stime of the whole process tree, reaped
  children included) and memory (RSS and PSS summed over the tree) from /proc;
- small statistics and a plain-text table printer.

Linux only (/proc). Every server is stopped by its own PID (and the PIDs of its descendants).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# The python of a vLLM 0.33 env (fixtures.md section 3B); the benchmarks start its render tier with it.
DEFAULT_ORACLE_PYTHON = os.environ.get("VLLM_ORACLE_PYTHON")


# -- /proc ----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return raw[raw.rindex(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))  # fields[1] = ppid
    return children


def process_tree(pid: int) -> list[int]:
    """`pid` and all its live descendants (empty if `pid` is gone)."""
    if _stat_fields(pid) is None:
        return []
    children = _children_map()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid`'s process tree, all threads included.

    Sums utime+stime of every live process in the tree plus cutime+cstime (the time of children
    that already exited and were waited for), so work done by short-lived helpers still counts
    and nothing is counted twice.
    """
    ticks = 0
    for member in process_tree(pid):
        fields = _stat_fields(member)
        if fields is not None:
            # After "pid (comm) ": state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14.
            ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / CLK_TCK


def tree_schedstat_seconds(pid: int) -> float:
    """CPU seconds of the live threads of `pid`'s process tree, from /proc/PID/task/TID/schedstat.

    The scheduler's nanosecond count: utime/stime tick at 10 ms, which is 15 ticks for 100 requests
    of 1.5 ms. Threads and children that already exited are not counted (servers keep theirs);
    `tree_cpu_seconds` is the cross-check that includes them.
    """
    total = 0
    for member in process_tree(pid):
        try:
            tids = os.listdir(f"/proc/{member}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            try:
                with open(f"/proc/{member}/task/{tid}/schedstat", "rb") as handle:
                    total += int(handle.read().split(None, 1)[0])
            except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
                continue
    return total / 1e9


@dataclass(frozen=True)
class Memory:
    rss_bytes: int  # sum of RSS over the tree (shared pages counted once per process)
    pss_bytes: int | None  # sum of PSS over the tree (shared pages split), if readable
    processes: int


def tree_memory(pid: int) -> Memory:
    rss = 0
    pss: int | None = 0
    members = process_tree(pid)
    for member in members:
        try:
            rss += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * PAGE_SIZE
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = None if pss is None else pss + int(line.split()[1]) * 1024
                    break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pss = None
    return Memory(rss, pss, len(members))


# -- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def wait_healthy(base_url: str, timeout: float, pid: int | None = None, log: Path | None = None) -> None:
    """Poll GET /health until 200; fail early if `pid` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid is not None and _stat_fields(pid) is None:
            raise RuntimeError(f"server {pid} exited during start-up{_log_tail(log)}")
        if http_status(f"{base_url}/health") == 200:
            return
        time.sleep(0.25)
    raise RuntimeError(f"{base_url} not healthy after {timeout:.0f}s{_log_tail(log)}")


def _log_tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log}:\n" + "\n".join(tail)


def stop_process_tree(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM `pid`, wait for it, then SIGKILL whatever is left of its tree (by PID)."""
    members = process_tree(pid)
    if not members:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(m) for m in members):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        time.sleep(0.1)
    for member in members:
        if _alive(member):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


@dataclass
class Server:
    """A server under test: where it listens, its PID if known, and whether we must stop it."""

    name: str
    url: str
    pid: int | None
    owned: bool = False
    log: Path | None = None
    info: dict[str, str] = field(default_factory=dict)

    def cpu_seconds(self) -> float | None:
        return None if self.pid is None else tree_cpu_seconds(self.pid)

    def cpu_seconds_precise(self) -> float | None:
        return None if self.pid is None else tree_schedstat_seconds(self.pid)

    def memory(self) -> Memory | None:
        return None if self.pid is None else tree_memory(self.pid)

    def stop(self) -> None:
        if self.owned and self.pid is not None:
            stop_process_tree(self.pid)
            self.owned = False


# This checkout: the installed `render-service` script imports whichever checkout the package was
# installed from (an editable install elsewhere, a git worktree), not necessarily this one.
CHECKOUT = Path(__file__).resolve().parents[1]


def start_render_service(
    model_dir: str,
    port: int,
    args: Sequence[str],
    *,
    log: Path,
    timeout: float = 120.0,
    checkout: Path = CHECKOUT,
) -> Server:
    """`render-service serve MODEL_DIR --port PORT ARGS...` as a child process, healthy, running
    `checkout`'s code (its root first on the child's PYTHONPATH)."""
    executable = shutil.which("render-service")
    command = [executable] if executable else [sys.executable, "-m", "render_service.cli"]
    command += ["serve", model_dir, "--port", str(port), *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout.resolve()), env.get("PYTHONPATH")]))
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    server = Server(
        "ours", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log, info={"command": " ".join(command)}
    )
    try:
        wait_healthy(server.url, timeout, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def start_floor_server(
    model_dir: str, port: int, args: Sequence[str], *, log: Path, name: str = "floor-srv", timeout: float = 120.0
) -> Server:
    """benchmarks/floor_server.py (a bare Starlette + orjson + jinja2 + fastokens render) as a child process."""
    script = Path(__file__).resolve().parent / "floor_server.py"
    command = [sys.executable, str(script), model_dir, "--port", str(port), *args]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = Server(
        name, f"http://127.0.0.1:{port}", process.pid, owned=True, log=log, info={"command": " ".join(command)}
    )
    try:
        wait_healthy(server.url, timeout, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def start_vllm_render(
    model_dir: str,
    port: int,
    args: Sequence[str],
    *,
    python: str | None = DEFAULT_ORACLE_PYTHON,
    timeout: float = 300.0,
) -> Server:
    """vLLM's `vllm launch render MODEL_DIR --port PORT ARGS...` on CPU torch as a child process, healthy."""
    if not python:
        raise RuntimeError("no vLLM 0.33 env: set VLLM_ORACLE_PYTHON (or pass --oracle-python)")
    scratch = Path(tempfile.gettempdir())
    command = [
        python,
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
        "launch",
        "render",
        model_dir,
        "--port",
        str(port),
        *args,
    ]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    env.setdefault("VLLM_CACHE_ROOT", str(scratch / "vllmcache"))
    log = scratch / f"oracle-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=scratch,
            start_new_session=True,
        )
    server = Server(
        "vLLM", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log, info={"command": " ".join(command)}
    )
    try:
        wait_healthy(server.url, timeout, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def example_model_dir(model_dir: str | None) -> str:
    """`model_dir`, or the tiny Qwen3 example model (real Qwen3 vocabulary) built into a new temp folder
    that is removed when the benchmark exits."""
    if model_dir:
        return model_dir
    from render_service.model.example import build_example_model

    folder = tempfile.mkdtemp(prefix="render-bench-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return str(build_example_model(Path(folder) / "tinyqwen3", "qwen3"))


# -- statistics and tables ------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | int | str | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "-"
    return f"{value:.{digits}f}"


def fmt_bytes(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.0f} MiB"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned; an empty row is a rule."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    rule = "  ".join("-" * w for w in widths)
    out = [title] if title else []
    out += [line(headers), rule]
    out += [rule if not row else line(row) for row in rows]
    return "\n".join(out)
