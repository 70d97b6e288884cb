"""A real vLLM `--tokens-only` engine for integration tests: the weighted tiny model and the process.

The render tier needs no weights, but an engine does. `build_weighted_model()` copies the
example model folder (real Qwen3 tokenizer, head_dim 32 config, generation_config.json) and
adds random bf16 weights written by transformers in the engine's own venv (torch lives only
there). The result is cached under the temp dir, keyed by the config and a recipe version, so
a test session pays for it once (a few seconds).

`engine_python()` is None when no engine env is configured (VLLM_ENGINE_PYTHON, the python of a
vLLM CPU engine venv): tests call `require_engine()` to skip cleanly.

The engine takes ~40 s to start and ~4 GB RSS; on a 2-core machine run one at a time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECIPE_VERSION = 1
SERVED_NAME = "tinyqwen3"

# Runs inside the engine venv (torch + transformers there): random weights, saved next to the tokenizer.
_WEIGHTS_SCRIPT = """
import sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.manual_seed(0)
config = Qwen3Config.from_pretrained(sys.argv[1])
model = Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
"""


def engine_python() -> str | None:
    """The python of the vLLM engine env (VLLM_ENGINE_PYTHON), or None when unset or missing."""
    env = os.environ.get("VLLM_ENGINE_PYTHON")
    return env if env and Path(env).exists() else None


def require_engine() -> str:
    python = engine_python()
    if python is None:
        import pytest

        pytest.skip("no vLLM engine env (set VLLM_ENGINE_PYTHON)")
    return python


def render_oracle_python() -> str | None:
    """The python of a vLLM 0.33 env for `vllm launch render` (VLLM_ORACLE_PYTHON), or None."""
    env = os.environ.get("VLLM_ORACLE_PYTHON")
    return env if env and Path(env).exists() else None


def require_render_oracle() -> str:
    python = render_oracle_python()
    if python is None:
        import pytest

        pytest.skip("no vLLM 0.33 env (set VLLM_ORACLE_PYTHON)")
    return python


def build_weighted_model(cache_root: str | Path | None = None) -> Path:
    """The example qwen3 folder plus random weights, built once and cached (safe across processes)."""
    from render_service.model.example import QWEN3_CONFIG

    python = require_engine()
    return cached_weighted_model(
        "tinyqwen3", "qwen3", [RECIPE_VERSION, QWEN3_CONFIG, python], _WEIGHTS_SCRIPT, cache_root=cache_root
    )


def cached_weighted_model(
    name: str,
    family: str,
    recipe: list[Any],
    weights_script: str,
    script_args: tuple[str, ...] = (),
    cache_root: str | Path | None = None,
) -> Path:
    """The `family` example folder plus the weights `weights_script FOLDER *script_args` writes in
    the engine venv, built once per `recipe` under a file lock and renamed into place when complete."""
    from render_service.model.example import build_example_model

    python = require_engine()
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_root or tempfile.gettempdir()) / "render-service-engine-models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{key}"
    with (root / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=root))
        try:
            build_example_model(staging, family)
            subprocess.run(
                [python, "-c", weights_script, str(staging), *script_args],
                check=True,
                capture_output=True,
                timeout=600,
                env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
            )
            # save_pretrained rewrites config.json (and may touch generation_config.json): keep ours.
            build_example_model(staging, family)
            if not any(staging.glob("*.safetensors")):
                raise RuntimeError(f"no weights were written to {staging}")
            (staging / ".complete").write_text("ok\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmProcess:
    """A vLLM server we started (engine or render), stopped by its own PID and process group."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 60.0) -> None:
        """Stop it: its own process group (vLLM forks an engine-core child), by our PID."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left of the group we created (engine core, workers)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(30)


def start_engine(
    model_dir: str | Path,
    *flags: str,
    port: int | None = None,
    max_model_len: int = 8192,
    served_name: str = SERVED_NAME,
    env: dict[str, str] | None = None,
    tokens_only: bool = True,
    timeout: float = 300.0,
) -> VllmProcess:
    """`vllm serve MODEL --tokens-only` in the engine env (or, with `tokens_only=False`, an engine with its
    tokenizer and `--enable-scale-out`); waits for GET /health = 200."""

    python = require_engine()
    port = port or free_port()
    log = Path(tempfile.gettempdir()) / f"vllm-engine-{port}.log"
    command = [
        python,
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
        "serve",
        str(model_dir),
        "--tokens-only" if tokens_only else "--enable-scale-out",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--served-model-name",
        served_name,
        *flags,
    ]
    process_env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CACHE_ROOT": os.path.join(tempfile.gettempdir(), "vllmcache-eng"),
        **(env or {}),
    }
    return _start(command, process_env, port, log, timeout, "vLLM engine")


def start_render_oracle(
    model_dir: str | Path,
    *flags: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
) -> VllmProcess:
    """vLLM 0.33's `vllm launch render MODEL` (CPU torch, no weights needed); waits for GET /health = 200."""
    python = require_render_oracle()
    port = port or free_port()
    log = Path(tempfile.gettempdir()) / f"vllm-render-{port}.log"
    command = [
        python,
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
        "launch",
        "render",
        str(model_dir),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        *flags,
    ]
    process_env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CACHE_ROOT": os.path.join(tempfile.gettempdir(), "vllmcache"),
        **(env or {}),
    }
    return _start(command, process_env, port, log, timeout, "vLLM render server")


def _start(command: list[str], env: dict[str, str], port: int, log: Path, timeout: float, what: str) -> VllmProcess:
    import httpx

    with log.open("wb") as fh:
        process = subprocess.Popen(
            command, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir(), start_new_session=True
        )
    server = VllmProcess(process, port, log)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"{what} not healthy after {timeout:.0f}s:\n{_tail(log)}")
        time.sleep(1)


@contextmanager
def engine(model_dir: str | Path, *flags: str, **kwargs: object) -> Iterator[VllmProcess]:
    started = start_engine(model_dir, *flags, **kwargs)  # type: ignore[arg-type]
    try:
        yield started
    finally:
        started.stop()


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


@contextmanager
def app_server(app: object, port: int | None = None) -> Iterator[str]:
    """Any ASGI app (ours from `create_app`, or a fake peer) on a real loopback port, in a thread."""
    import threading

    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", access_log=False)
    )
    thread = threading.Thread(target=server.run, name=f"app-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the app on port {port} failed to start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the app on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
