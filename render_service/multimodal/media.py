"""Getting image bytes from a request: `data:` URLs and http(s) URLs, with limits.

vLLM's defaults where it has them (5 s fetch timeout, 178,956,970 decoded pixels); stricter
where it has none: redirects are off, private/loopback/link-local addresses are refused unless
allowed, and bodies and `data:` payloads are capped. Refusals are 400s, except what vLLM answers
with a 422 (`_wrap_media_fetch_error`): a URL whose server answers a 4xx other than 408/429, or
a body over the size limit.
"""

from __future__ import annotations

import asyncio
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from render_service.exceptions import BadRequestError, UnprocessableEntityError


@dataclass(frozen=True)
class MediaLimits:
    fetch_timeout: float = 5.0  # VLLM_IMAGE_FETCH_TIMEOUT
    max_fetch_bytes: int = 32 * 1024 * 1024
    max_data_url_bytes: int = 32 * 1024 * 1024  # decoded size
    max_image_pixels: int = 178_956_970  # VLLM_MAX_IMAGE_PIXELS
    allow_redirects: bool = False
    allowed_domains: tuple[str, ...] | None = None  # --allowed-media-domains
    allow_private_addresses: bool = False
    max_images_per_prompt: int = 999  # --limit-mm-per-prompt image (vLLM's default)


def media_error(message: str) -> BadRequestError:
    return BadRequestError(message, param="messages")


def unprocessable(message: str, url: str) -> UnprocessableEntityError:
    """vLLM's VLLMUnprocessableEntityError for a media URL (parameter and value in the message)."""
    return UnprocessableEntityError(
        f"Failed to fetch media from URL: {message} (parameter=image_url, value={url})", param="image_url"
    )


try:  # vLLM's own decoder (pybase64, SIMD): ~60x faster than the stdlib on a 720p image
    import pybase64

    def _b64decode(payload: str) -> bytes:
        return pybase64.b64decode(payload, validate=True)
except ImportError:  # pragma: no cover - a dependency; the stdlib gives the same bytes, slower

    def _b64decode(payload: str) -> bytes:
        return binascii.a2b_base64(payload, strict_mode=True)


def decode_data_url(url: str, limits: MediaLimits) -> bytes:
    """The bytes of a `data:<type>;base64,<payload>` URL (vLLM accepts base64 only)."""
    header, sep, payload = url[5:].partition(",")
    if not sep or not header.endswith(";base64"):
        raise media_error("Invalid data URL: only base64-encoded `data:` URLs are supported.")
    # base64 grows 4/3: refuse before decoding anything too large.
    if len(payload) > (limits.max_data_url_bytes * 4) // 3 + 4:
        raise media_error(f"data: URL payload exceeds the limit of {limits.max_data_url_bytes} bytes.")
    try:
        return _b64decode(payload)
    except (binascii.Error, ValueError) as exc:
        raise media_error(f"Invalid base64 in data: URL: {exc}") from None


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str, limits: MediaLimits) -> tuple[str, str]:
    """(scheme, host) of an allowed http(s) URL; otherwise a 400."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise media_error(f"Unsupported image URL scheme {parts.scheme!r}: use data:, http or https.")
    host = (parts.hostname or "").lower()
    if not host:
        raise media_error("Image URL has no host.")
    if limits.allowed_domains is not None and host not in limits.allowed_domains:
        raise media_error(
            f"The URL must be from one of the allowed domains: {list(limits.allowed_domains)}. Input URL domain: {host}"
        )
    return parts.scheme, host


def _too_large(url: str, limits: MediaLimits) -> UnprocessableEntityError:
    return unprocessable(f"Remote media download exceeds the limit of {limits.max_fetch_bytes} bytes", url)


async def _check_resolved(host: str, port: int, limits: MediaLimits) -> None:
    if limits.allow_private_addresses:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise media_error(f"Cannot resolve image URL host {host!r}: {exc}") from None
    for info in infos:
        if not _is_public(str(info[4][0])):
            raise media_error(f"Image URL host {host!r} resolves to a non-public address; refused.")


async def fetch(client: httpx.AsyncClient, url: str, limits: MediaLimits) -> bytes:
    """GET an image URL within the limits (a 400 for any failure the client caused)."""
    scheme, host = check_url(url, limits)
    port = urlsplit(url).port or (443 if scheme == "https" else 80)
    try:
        async with asyncio.timeout(limits.fetch_timeout):
            await _check_resolved(host, port, limits)
            async with client.stream("GET", url, follow_redirects=limits.allow_redirects) as response:
                if response.is_redirect:
                    raise media_error(f"Image URL redirected ({response.status_code}); redirects are not followed.")
                status = response.status_code
                if 400 <= status < 500 and status not in (408, 429):
                    raise unprocessable(f"HTTP {status} error", url)
                if status != 200:
                    raise media_error(f"Failed to fetch image from {url}: HTTP {status}.")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limits.max_fetch_bytes:
                    raise _too_large(url, limits)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limits.max_fetch_bytes:
                        raise _too_large(url, limits)
                return bytes(body)
    except TimeoutError:
        raise media_error(f"Timed out fetching image from {url} after {limits.fetch_timeout} s.") from None
    except httpx.HTTPError as exc:
        raise media_error(f"Failed to fetch image from {url}: {exc}") from None


def image_urls(messages: Any, include_data: bool = False) -> list[str]:
    """Every http(s) image URL in the messages, in order (fetched before rendering); with
    `include_data`, data: URLs too (the string objects themselves)."""
    urls: list[str] = []
    if not isinstance(messages, list):
        return urls
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            url = part_image_url(part)
            if url is not None and (include_data or not url.startswith("data:")):
                urls.append(url)
    return urls


def part_image_url(part: Any) -> str | None:
    if not isinstance(part, dict):
        return None
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


async def fetch_all(urls: list[str], limits: MediaLimits) -> dict[str, bytes]:
    """Fetch distinct URLs concurrently; the first failure is the request's 400."""
    distinct = list(dict.fromkeys(urls))
    if not distinct:
        return {}
    async with httpx.AsyncClient(timeout=limits.fetch_timeout, trust_env=False) as client:
        bodies = await asyncio.gather(*(fetch(client, url, limits) for url in distinct))
    return dict(zip(distinct, bodies, strict=True))


class FetchedImages(dict[str, bytes]):
    """The fetched bodies by URL, plus what the processed-image Redis tier (`imagecache`) learned
    about every image of the request before its render: bytes (data: URLs decoded once) and mm_hash.

    `known` is keyed by the id of the URL string the conversation holds (the same object reaches
    the render's collector), with that object kept alongside: a multi-megabyte data: URL is then
    never hashed as a dict key, and the id cannot be reused while the entry lives."""

    def __init__(self, bodies: dict[str, bytes], hash_kwargs: dict[str, Any]) -> None:
        super().__init__(bodies)
        self.hash_kwargs = hash_kwargs  # the ImageOptions.hash_kwargs the digests were computed under
        self.known: dict[int, tuple[str, bytes, str | None]] = {}

    def lookup(self, url: str) -> tuple[bytes, str | None] | None:
        """(bytes, mm_hash or None) for a URL the tier saw, else None."""
        entry = self.known.get(id(url))
        if entry is None or entry[0] is not url:
            return None
        return entry[1], entry[2]
