"""HTTPS for the worker pool: vLLM's `--ssl-*` flags as uvicorn options, and `--enable-ssl-refresh`
(a rotated certificate, key or CA bundle is loaded without a restart, as vLLM does)."""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

logger = logging.getLogger("render_service.server.tls")

# How often (in uvicorn ticks of 0.1 s) each worker looks at the files: a stat per file per second.
CHECK_EVERY_TICKS = 10


def tls_options(settings: Any) -> dict[str, Any]:
    """uvicorn's TLS options from vLLM's flags, as vLLM passes them (empty: plain HTTP)."""
    if not settings.ssl_certfile:
        return {}
    return {
        "ssl_keyfile": settings.ssl_keyfile,
        "ssl_certfile": settings.ssl_certfile,
        "ssl_ca_certs": settings.ssl_ca_certs,
        "ssl_cert_reqs": settings.ssl_cert_reqs,
        "ssl_ciphers": settings.ssl_ciphers,
    }


def _stamp(path: str | None) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (a Kubernetes Secret volume swaps a symlink)."""
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class CertificateWatcher:
    """Reloads the certificate chain (and the CA bundle) into a worker's live SSLContext when the files
    change: new handshakes use them, open connections keep theirs. Runs on the worker's event loop
    (uvicorn's tick), so the context never changes under a handshake in another thread. A file
    caught half-written fails to load and is tried again on the next check."""

    def __init__(self, context: ssl.SSLContext, options: dict[str, Any]) -> None:
        self.context = context
        self.certfile: str = options["ssl_certfile"]
        self.keyfile: str | None = options.get("ssl_keyfile")
        self.ca_certs: str | None = options.get("ssl_ca_certs")
        self._chain = (_stamp(self.certfile), _stamp(self.keyfile))
        self._ca = _stamp(self.ca_certs)

    def check(self) -> None:
        chain = (_stamp(self.certfile), _stamp(self.keyfile))
        if chain != self._chain and None not in chain[: 2 if self.keyfile else 1]:
            try:
                self.context.load_cert_chain(self.certfile, self.keyfile)
                self._chain = chain
                logger.info("reloaded the TLS certificate chain from %s", self.certfile)
            except (OSError, ssl.SSLError) as exc:
                logger.warning("TLS certificate chain not reloaded yet (%s); trying again", exc)
        ca = _stamp(self.ca_certs)
        if ca != self._ca and ca is not None:
            try:
                self.context.load_verify_locations(self.ca_certs)  # adds to the trusted CAs, as vLLM
                self._ca = ca
                logger.info("reloaded the TLS CA bundle from %s", self.ca_certs)
            except (OSError, ssl.SSLError) as exc:
                logger.warning("TLS CA bundle not reloaded yet (%s); trying again", exc)


def watching_server(config: Any, options: dict[str, Any]) -> Any:
    """A uvicorn Server that, with `options` (tls_options), checks the certificate files once a second."""
    import uvicorn

    class Server(uvicorn.Server):
        watcher: CertificateWatcher | None = None

        async def on_tick(self, counter: int) -> bool:
            if counter % CHECK_EVERY_TICKS == 0:
                if self.watcher is None and self.config.ssl is not None:
                    self.watcher = CertificateWatcher(self.config.ssl, options)
                elif self.watcher is not None:
                    self.watcher.check()
            return await super().on_tick(counter)

    return Server(config)
