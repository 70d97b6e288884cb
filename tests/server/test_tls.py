"""HTTPS with vLLM's flags, on the real worker pool: every worker wraps its own SO_REUSEPORT socket,
and with `--ssl-cert-reqs 2` (mTLS) a client without a certificate of the CA is refused."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.certs import Pki, make_pki, new_server_certificate
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


@contextmanager
def https_service(model_dir: Path, ready: ssl.SSLContext, *args: str) -> Iterator[str]:
    """`render-service serve` with TLS flags; yields https://127.0.0.1:PORT once /health answers."""
    port = free_port()
    command = [sys.executable, "-m", "render_service.cli", "serve", str(model_dir), "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port), *args],
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                raise RuntimeError(f"service exited with {process.returncode}:\n{output[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2, verify=ready).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("service did not become healthy")
            time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_https_on_every_worker(qwen3_model_dir: Path, pki: Pki) -> None:
    trusted = client_context(pki)
    flags = ["--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key), "--workers", "2"]
    with https_service(qwen3_model_dir, trusted, *flags) as url:
        seen: set[str] = set()
        for _ in range(40):  # a new connection each time: the kernel spreads them over both workers
            with httpx.Client(verify=trusted, timeout=10) as client:
                response = client.get(f"{url}/metrics")
                assert response.status_code == 200
                seen.update(re.findall(r'render_worker_info\{worker="(\d+)"\}', response.text))
                rendered = client.post(
                    f"{url}/v1/completions/render", json={"model": str(qwen3_model_dir), "prompt": "Hello"}
                )
                assert rendered.status_code == 200, rendered.text
                assert rendered.json()[0]["token_ids"]
            if seen == {"0", "1"}:
                break
        assert seen == {"0", "1"}, "both workers must answer over TLS"
        # The certificate is the one configured, and it is verified against the test CA only.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/health", verify=ssl.create_default_context(), timeout=5)
        # Plain HTTP to the TLS port gets no HTTP answer.
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https://", "http://") + "/health", timeout=5)


def test_mutual_tls_refuses_a_client_without_a_certificate(qwen3_model_dir: Path, pki: Pki) -> None:
    with_cert = client_context(pki, pki.client_cert, pki.client_key)
    flags = [
        "--ssl-certfile",
        str(pki.server_cert),
        "--ssl-keyfile",
        str(pki.server_key),
        "--ssl-ca-certs",
        str(pki.ca),
        "--ssl-cert-reqs",
        str(int(ssl.CERT_REQUIRED)),
        "--ssl-ciphers",
        "ECDHE+AESGCM:ECDHE+CHACHA20",
        "--workers",
        "1",
    ]
    with https_service(qwen3_model_dir, with_cert, *flags) as url:
        assert httpx.get(f"{url}/health", verify=with_cert, timeout=5).status_code == 200
        for refused in (client_context(pki), client_context(pki, pki.stranger_cert, pki.stranger_key)):
            # TLS 1.3 reports the refusal after the handshake, on the first read: any transport error.
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                httpx.get(f"{url}/health", verify=refused, timeout=5)
        # The cipher list applies to TLS 1.2: a client limited to a suite outside it is refused.
        legacy = client_context(pki, pki.client_cert, pki.client_key)
        legacy.maximum_version = ssl.TLSVersion.TLSv1_2
        legacy.set_ciphers("ECDHE+AESGCM")
        assert httpx.get(f"{url}/health", verify=legacy, timeout=5).status_code == 200
        outside = client_context(pki, pki.client_cert, pki.client_key)
        outside.maximum_version = ssl.TLSVersion.TLSv1_2
        outside.set_ciphers("ECDHE-ECDSA-AES128-SHA256")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", verify=outside, timeout=5)


def served_serial(url: str, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new connection is handed."""
    host, port = url.removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_rotated_certificate_is_served_without_a_restart(qwen3_model_dir: Path, pki: Pki, tmp_path: Path) -> None:
    """--enable-ssl-refresh: every worker loads a rotated certificate for its next handshakes (the
    key replaced after the certificate: the mismatch in between is retried, not served)."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    trusted = client_context(pki)
    flags = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--enable-ssl-refresh", "--workers", "2"]
    with https_service(qwen3_model_dir, trusted, *flags) as url:
        from cryptography import x509

        first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
        assert served_serial(url, trusted) == first
        new_cert, new_key, serial = new_server_certificate(pki)
        for path, data in ((cert, new_cert), (key, new_key)):  # replaced as a Secret volume does: atomically
            staged = path.with_suffix(".new")
            staged.write_bytes(data)
            os.replace(staged, path)
            time.sleep(1.5)
        deadline = time.monotonic() + 20
        served: set[int] = set()
        while time.monotonic() < deadline:
            served = {served_serial(url, trusted) for _ in range(12)}  # new connections: both workers
            if served == {serial}:
                break
            time.sleep(0.5)
        assert served == {serial}
        assert httpx.get(f"{url}/health", verify=trusted, timeout=5).status_code == 200
