"""Where Redis is and how to reach it: one Redis (`redis://`, `rediss://`, `unix://`), a Sentinel
master set, or a Cluster, with or without TLS. Both Redis users (the snapshot store and the
image cache's Redis tier) build their connections from one `RedisTarget`.

- Standalone: `--redis-url`.
- Sentinel (`--redis-sentinel HOST:PORT`, repeatable, and `--redis-sentinel-master NAME`): the
  master's address is asked of the sentinels whenever a connection is opened, so after a failover
  the next connection goes to the promoted replica. `--redis-url` is then optional and carries only
  the scheme (`rediss://`: TLS to the sentinels and the master), the credentials and the database.
- Cluster (`--redis-cluster`): `--redis-url` names any node; the slot map comes from the cluster.
- TLS (`rediss://`): the server is verified against `--redis-ssl-ca-certs` (the system's CAs
  without it); `--redis-ssl-certfile`/`--redis-ssl-keyfile` present a client certificate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

STANDALONE, SENTINEL, CLUSTER = "standalone", "sentinel", "cluster"


def parse_host_port(text: str, default_port: int = 26379) -> tuple[str, int]:
    """`host:port`, `host` or `[v6]:port`; ValueError when it is not one of those."""
    text = text.strip()
    if not text:
        raise ValueError("empty address")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not host or (port and not port.isdigit()) or not 0 < (number := int(port or default_port)) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, number


def _sentinel_address(text: str) -> tuple[str, int]:
    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise ValueError(f"--redis-sentinel {exc}") from None


@dataclass(frozen=True)
class RedisTarget:
    url: str = "redis://"
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str | None = None
    sentinel_password: str | None = None
    cluster: bool = False
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> RedisTarget | None:
        """The target the settings describe, or None without Redis."""
        if not settings.redis_url and not settings.redis_sentinel:
            return None
        return cls(
            url=settings.redis_url or "redis://",
            sentinels=tuple(_sentinel_address(s) for s in settings.redis_sentinel),
            sentinel_master=settings.redis_sentinel_master,
            sentinel_password=settings.redis_sentinel_password,
            cluster=settings.redis_cluster,
            ssl_ca_certs=settings.redis_ssl_ca_certs,
            ssl_certfile=settings.redis_ssl_certfile,
            ssl_keyfile=settings.redis_ssl_keyfile,
        )

    @property
    def mode(self) -> str:
        return SENTINEL if self.sentinels else CLUSTER if self.cluster else STANDALONE

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def unix(self) -> bool:
        return urlsplit(self.url).scheme == "unix"

    def url_parts(self) -> dict[str, Any]:
        """host, port, db, username, password of the URL (host/port absent in Sentinel mode)."""
        from redis.connection import parse_url

        parts = parse_url(self.url)
        return {
            "host": parts.get("host"),
            "port": int(parts.get("port", 6379)),
            "db": int(parts.get("db", 0)),
            "username": parts.get("username"),
            "password": parts.get("password"),
        }

    def validate(self) -> None:
        """Raise ValueError with the flag to fix."""
        split = urlsplit(self.url)
        if split.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("--redis-url must start with redis://, rediss:// or unix://")
        if self.mode == SENTINEL:
            if not self.sentinel_master:
                raise ValueError("--redis-sentinel needs --redis-sentinel-master (the master set's name)")
            if split.hostname or split.port or split.scheme == "unix":
                raise ValueError(
                    "with --redis-sentinel, --redis-url carries only the scheme, credentials and database "
                    "(e.g. rediss://:PASSWORD@/0): the master's address comes from the sentinels"
                )
            if self.cluster:
                raise ValueError("--redis-sentinel and --redis-cluster exclude each other")
        elif self.sentinel_master:
            raise ValueError("--redis-sentinel-master needs --redis-sentinel")
        if self.cluster and (split.scheme == "unix" or not split.hostname):
            raise ValueError("--redis-cluster needs a --redis-url with a node's host and port")
        if (self.ssl_ca_certs or self.ssl_certfile or self.ssl_keyfile) and not self.tls:
            raise ValueError("--redis-ssl-* options need a rediss:// --redis-url")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("--redis-ssl-keyfile needs --redis-ssl-certfile")
        if self.tls:
            self.ssl_context()  # unreadable or mismatched files fail at start, not per connection

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client context of the fast paths (redis-py builds its own from `redis_py_ssl`)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ssl_ca_certs)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def redis_py_ssl(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": "required"}
        if self.ssl_ca_certs:
            options["ssl_ca_certs"] = self.ssl_ca_certs
        if self.ssl_certfile:
            options["ssl_certfile"] = self.ssl_certfile
            options["ssl_keyfile"] = self.ssl_keyfile
        return options

    def _sentinel(self, module: Any, timeout: float) -> Any:
        parts = self.url_parts()
        sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if self.sentinel_password:
            sentinel_kwargs["password"] = self.sentinel_password
        if self.tls:
            sentinel_kwargs.update(ssl=True, **self.redis_py_ssl())
        return module.Sentinel(
            list(self.sentinels),
            sentinel_kwargs=sentinel_kwargs,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
            db=parts["db"],
            username=parts["username"],
            password=parts["password"],
            ssl=self.tls,
            **self.redis_py_ssl(),
        )

    def async_client(self, timeout: float) -> Any:
        """A redis-py asyncio client: `Redis`, a Sentinel-managed `Redis` or a `RedisCluster`.
        Commands fail fast (no retries): the callers have a cheaper fallback than waiting."""
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        ssl_options = self.redis_py_ssl()
        if self.mode == SENTINEL:
            return self.async_sentinel(timeout).master_for(self.sentinel_master)
        if self.mode == CLUSTER:
            return redis.RedisCluster.from_url(
                self.url,
                retry=Retry(NoBackoff(), 0),
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                **ssl_options,
            )
        return redis.Redis.from_url(
            self.url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False, **ssl_options
        )

    def async_sentinel(self, timeout: float) -> Any:
        from redis.asyncio import sentinel

        return self._sentinel(sentinel, timeout)

    def sync_sentinel(self, timeout: float) -> Any:
        from redis import sentinel

        return self._sentinel(sentinel, timeout)
