"""Image URLs whose server refuses them, against the goldens recorded from vLLM 0.33's render tier
(tests/parity/golden_mm_fetch: a Qwen3-VL example model, the image server on loopback).

vLLM answers a media server's 4xx with a 422 `UnprocessableEntityError` on `image_url`
(`_wrap_media_fetch_error`). `{server}` in the goldens stands for the image server's address.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_mm_fetch"
GOLDENS = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(GOLDEN_DIR.glob("*.json"))]


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from render_service.model.example import build_example_model

    model_dir = build_example_model(tmp_path_factory.mktemp("vl") / "tinyvl", "qwen3-vl")
    settings = Settings(
        model=str(model_dir), served_model_name=["tinyvl"], max_model_len=16384, media_allow_private_addresses=True
    ).validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _fill(value: Any, server: str) -> Any:
    return json.loads(json.dumps(value).replace("{server}", server))


def test_goldens_present() -> None:
    assert {g["case"] for g in GOLDENS} == {"chat_image_url_404", "messages_image_url_404", "responses_image_url_404"}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_refused_image_url_matches_vllm(golden: dict[str, Any], client: TestClient, server: str) -> None:
    response = client.post(golden["path"], json=_fill(golden["body"], server))
    assert (response.status_code, response.json()) == (golden["status"], _fill(golden["response"], server))
