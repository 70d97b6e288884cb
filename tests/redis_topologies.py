"""Real redis-server topologies on loopback for the tests: a TLS server, a Sentinel set (master,
replica, sentinel) and a 3-master Cluster. Every process is killed on exit."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.certs import Pki
from tests.helpers import free_port


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (CI installs redis-server from Debian)")
    return path


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Node:
    port: int
    process: subprocess.Popen[bytes]
    client_kwargs: dict[str, Any] = field(default_factory=dict)

    def client(self, **extra: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **self.client_kwargs, **extra)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def redis_node(*args: str, port: int | None = None, client_kwargs: dict[str, Any] | None = None) -> Iterator[Node]:
    """One redis-server (or sentinel, with `--sentinel` in `args`) on 127.0.0.1, pinged before use."""
    binary = _binary("redis-server")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="redis-") as folder:  # a replica's sync writes an RDB file here
        process = subprocess.Popen(
            [binary, *args, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ([] if "--dir" in args else ["--dir", folder])
            + ([] if "--tls-port" in args else ["--port", str(port)]),
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        node = Node(port, process, client_kwargs or {})
        try:
            wait_until(lambda: node.client().ping(), 10, f"redis on port {port}")
            yield node
        finally:
            node.kill()


def tls_client_kwargs(pki: Pki) -> dict[str, Any]:
    return {
        "ssl": True,
        "ssl_ca_certs": str(pki.ca),
        "ssl_certfile": str(pki.client_cert),
        "ssl_keyfile": str(pki.client_key),
    }


@contextmanager
def tls_redis(pki: Pki, *, auth_clients: str = "yes") -> Iterator[Node]:
    """A redis-server that speaks only TLS (no plain port), client certificates `auth_clients`."""
    port = free_port()
    args = (
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(pki.server_cert),
        "--tls-key-file",
        str(pki.server_key),
        "--tls-ca-cert-file",
        str(pki.ca),
        "--tls-auth-clients",
        auth_clients,
    )
    with redis_node(*args, port=port, client_kwargs=tls_client_kwargs(pki)) as node:
        yield node


@dataclass
class SentinelSet:
    master: Node
    replica: Node
    sentinel: Node
    name: str = "mymaster"

    def master_port(self) -> int:
        return int(self.sentinel.client().sentinel_get_master_addr_by_name(self.name)[1])


@contextmanager
def sentinel_set(folder: Path, name: str = "mymaster") -> Iterator[SentinelSet]:
    """Master, one replica and one sentinel (quorum 1, 500 ms to declare the master down)."""
    with ExitStack() as stack:
        master = stack.enter_context(redis_node())
        replica = stack.enter_context(redis_node("--replicaof", "127.0.0.1", str(master.port)))
        wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", 20, "replication link")
        port = free_port()
        config = folder / f"sentinel-{port}.conf"  # a sentinel rewrites its config file: one of its own
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {name} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {name} 500\n"
            f"sentinel failover-timeout {name} 3000\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        process = subprocess.Popen(
            [_binary("redis-server"), str(config), "--sentinel"],
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        sentinel = Node(port, process)
        stack.callback(sentinel.kill)
        wait_until(lambda: sentinel.client().ping(), 10, "sentinel")
        # The sentinel has found the replica (through the master's INFO) and can fail over to it.
        wait_until(
            lambda: any(
                r["master-link-status"] == "ok" and not r["is_disconnected"]
                for r in sentinel.client().sentinel_slaves(name)
            ),
            20,
            "the sentinel to see a healthy replica",
        )
        yield SentinelSet(master, replica, sentinel, name)


@dataclass
class Cluster:
    nodes: list[Node]

    @property
    def seed_url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def node_for_key(self, key: str) -> Node:
        from redis.crc import key_slot

        return self.node_for_slot(key_slot(key.encode()))

    def node_for_slot(self, slot: int) -> Node:
        for start, end, (_, port, *_), *_ in self.nodes[0].client().execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return next(n for n in self.nodes if n.port == int(port))
        raise LookupError(slot)

    def node_id(self, node: Node) -> str:
        return node.client().execute_command("CLUSTER MYID").decode()


@contextmanager
def redis_cluster(folder: Path, masters: int = 3) -> Iterator[Cluster]:
    """`masters` cluster-enabled redis-servers joined by `redis-cli --cluster create` (no replicas)."""
    cli = _binary("redis-cli")
    with ExitStack() as stack:
        nodes = []
        for _ in range(masters):
            port = free_port()
            nodes.append(
                stack.enter_context(
                    redis_node(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(folder / f"nodes-{port}.conf"),
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-port",  # the default, port + 10000, may be past 65535
                        str(free_port()),
                        "--dir",
                        str(folder),
                        port=port,
                    )
                )
            )
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for node in nodes:
            wait_until(
                lambda node=node: node.client().execute_command("CLUSTER INFO").get("cluster_state") == "ok",
                30,
                "cluster state ok",
            )
        yield Cluster(nodes)
