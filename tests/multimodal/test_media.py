"""media: data: URLs and http(s) fetching with limits, against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import base64
import http.server
import threading
from collections.abc import Iterator

import pytest

from render_service.exceptions import BadRequestError, UnprocessableEntityError
from render_service.multimodal.media import MediaLimits, decode_data_url, fetch_all

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/image.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
        elif self.path == "/big":
            self.send_response(200)
            self.end_headers()  # no Content-Length: the streamed size is what counts
            self.wfile.write(b"x" * 5000)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/image.png")
            self.end_headers()
        elif self.path == "/slow":
            threading.Event().wait(2)
            self.send_response(200)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


LOCAL = MediaLimits(allow_private_addresses=True, fetch_timeout=1.0, max_fetch_bytes=1000)


def _fetch(url: str, limits: MediaLimits) -> bytes:
    return asyncio.run(fetch_all([url], limits))[url]


def test_fetch_from_allowed_loopback(server: str) -> None:
    assert _fetch(f"{server}/image.png", LOCAL) == PNG


@pytest.mark.parametrize(
    ("path", "limits", "message"),
    [
        ("/image.png", MediaLimits(), "non-public address"),
        ("/redirect", LOCAL, "redirects are not followed"),
        ("/slow", LOCAL, "Timed out"),
        ("/image.png", MediaLimits(allowed_domains=("example.com",)), "allowed domains"),
    ],
)
def test_fetch_refusals_are_400s(server: str, path: str, limits: MediaLimits, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        _fetch(f"{server}{path}", limits)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/missing", "Failed to fetch media from URL: HTTP 404 error (parameter=image_url, value={url})"),
        (
            "/big",
            "Failed to fetch media from URL: Remote media download exceeds the limit of 1000 bytes "
            "(parameter=image_url, value={url})",
        ),
    ],
)
def test_fetch_refusals_vllm_answers_with_422(server: str, path: str, message: str) -> None:
    """vLLM's `_wrap_media_fetch_error`: a client error of the media server, or a body over the limit."""
    url = f"{server}{path}"
    with pytest.raises(UnprocessableEntityError) as info:
        _fetch(url, LOCAL)
    body = info.value.body()["error"]
    assert (info.value.status_code, body["type"], body["param"]) == (422, "UnprocessableEntityError", "image_url")
    assert body["message"] == message.format(url=url)


def test_redirect_followed_only_when_allowed(server: str) -> None:
    limits = MediaLimits(allow_private_addresses=True, allow_redirects=True)
    assert _fetch(f"{server}/redirect", limits) == PNG


def test_other_schemes_refused() -> None:
    with pytest.raises(BadRequestError, match="scheme"):
        _fetch("file:///etc/passwd", LOCAL)


def test_data_url_limits() -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert decode_data_url(url, MediaLimits()) == PNG
    with pytest.raises(BadRequestError, match="exceeds the limit"):
        decode_data_url(url, MediaLimits(max_data_url_bytes=10))
    with pytest.raises(BadRequestError, match="base64"):
        decode_data_url("data:image/png,rawbytes", MediaLimits())
    with pytest.raises(BadRequestError, match="Invalid base64"):
        decode_data_url("data:image/png;base64,!!!", MediaLimits())


def test_every_render_path_fetches_http_images(server: str, tmp_path) -> None:
    """Chat, Messages and Responses render an http(s) image the same way as its data: URL."""
    from starlette.testclient import TestClient

    from render_service.model.example import build_example_model
    from render_service.server.app import create_app
    from render_service.settings import Settings

    model_dir = build_example_model(tmp_path / "vl", "qwen3-vl")
    settings = Settings(
        model=str(model_dir), served_model_name=["vl"], max_model_len=4096, media_allow_private_addresses=True
    ).validate()
    url = f"{server}/image.png"
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    with TestClient(create_app(settings)) as client:

        def chat(image: str) -> dict:
            return client.post(
                "/v1/chat/completions/render",
                json={
                    "model": "vl",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": image}},
                                {"type": "text", "text": "What is it?"},
                            ],
                        }
                    ],
                },
            ).json()

        expected = chat(data_url)
        assert chat(url)["features"]["mm_hashes"] == expected["features"]["mm_hashes"]
        anthropic = client.post(
            "/v1/messages/render",
            json={
                "model": "vl",
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": url}},
                            {"type": "text", "text": "What is it?"},
                        ],
                    }
                ],
            },
        )
        assert anthropic.status_code == 200, anthropic.text
        assert anthropic.json()["token_ids"] == expected["token_ids"]
        assert anthropic.json()["features"]["mm_hashes"] == expected["features"]["mm_hashes"]
        openai = client.post(
            "/v1/responses/render",
            json={
                "model": "vl",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": url},
                            {"type": "input_text", "text": "What is it?"},
                        ],
                    }
                ],
            },
        )
        assert openai.status_code == 200, openai.text
        assert openai.json()["features"]["mm_hashes"] == expected["features"]["mm_hashes"]
        refused = client.post(
            "/v1/messages/render",
            json={
                "model": "vl",
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": f"{server}/missing"}}],
                    }
                ],
            },
        )
        # vLLM: a media server's 4xx is a 422 UnprocessableEntityError on `image_url`
        assert refused.status_code == 422
        assert (refused.json()["error"]["type"], refused.json()["error"]["param"]) == (
            "UnprocessableEntityError",
            "image_url",
        )
