"""Chaos behind a real load balancer (the default-run size; `python -m tests.chaos.report` runs the
full one: 3 replicas per pool, 200 streams per pool in flight, and prints the numbers).

HAProxy (round-robin per request, no stickiness) in front of two pools of replicas (stream state
`full` and `compact`) sharing a real redis-server; streaming derenders (llm-d-style clients echoing
`stream_state`) and renders run while the fault script SIGKILLs a replica and restarts it, restarts
Redis, freezes it (SIGSTOP), fills it to maxmemory, and rolls every replica to a build with another
fingerprint. Every stream must equal its batch derender, every render its reference ids; the only
client-visible errors are the protocol's (409 with a stream restart, 503 with Retry-After, a
balancer 5xx or dropped connection resent), and replica memory and fds stay bounded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.chaos.report import problems, render_text
from tests.chaos.run import ChaosConfig, run_chaos, summary

pytestmark = [pytest.mark.redis, pytest.mark.timeout(900)]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (CI installs it from Debian)")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_chaos_behind_haproxy(qwen3_model_dir: Path, tmp_path: Path) -> None:
    config = ChaosConfig(
        replicas=2,
        concurrency=12,
        render_concurrency=3,
        chunk_pause=0.05,
        warmup=3.0,
        baseline=3.0,
        settle=2.0,
        freeze_seconds=5.0,
        full_seconds=3.0,
        replica_down_seconds=1.0,
    )
    result = run_chaos(qwen3_model_dir, tmp_path, config)
    numbers = summary(result)
    print(render_text(numbers))
    assert not problems(result, numbers)
    # Each fault was injected, and the load ran through every one of them.
    assert set(numbers["faults"]) == {
        "replica SIGKILL",
        "replica restart",
        "Redis restart",
        "Redis SIGSTOP",
        "Redis at maxmemory",
        "rolled to the new build",
    }
    assert numbers["faults"]["rolled to the new build"] == 2 * config.replicas
    assert all(window["chunks"] > 0 for window in numbers["windows"]), numbers["windows"]
    # Streams were cut by the faults and recovered by the protocol's retry, not by luck.
    assert numbers["restarts_by_code"].get("fingerprint_mismatch", 0) > 0
    assert numbers["counters"]["render_stream_replays_total"] > 0
    assert numbers["streams"] >= 2 * config.concurrency
