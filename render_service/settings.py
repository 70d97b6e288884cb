"""Every option of the service, named as vLLM names its flags, validated once at start."""

from __future__ import annotations

import argparse
import json
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from render_service.model.lora import LoRAModuleError, LoRAModulePath, parse_lora_modules, runtime_updating_allowed

CONTENT_FORMATS = ("auto", "string", "openai")
STREAM_STATE_MODES = ("full", "compact")


class SettingsError(ValueError):
    """An option that cannot work: reported at start with the flag's name."""


@dataclass
class Settings:
    model: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    revision: str | None = None
    tokenizer_revision: str | None = None
    trust_remote_code: bool = False
    tokenizer_mode: str = "auto"
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    cohere_format: str = "cmd4"
    trust_request_chat_template: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    # vLLM's plugin files (they need the vLLM extra: render_service/adapter).
    tool_parser_plugin: str = ""
    reasoning_parser_plugin: str = ""
    enable_auto_tool_choice: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    max_model_len: int | None = None
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    max_logprobs: int = 20
    api_key: str | None = None
    tokenizer_backend: str = "auto"
    max_request_body_bytes: int = 64 << 20
    redis_url: str | None = None
    # Redis as operators run it (render_service/redis_target.py): Sentinel, Cluster, TLS.
    redis_sentinel: list[str] = field(default_factory=list)  # HOST:PORT of each sentinel
    redis_sentinel_master: str | None = None
    redis_sentinel_password: str | None = None
    redis_cluster: bool = False
    redis_ssl_ca_certs: str | None = None
    redis_ssl_certfile: str | None = None
    redis_ssl_keyfile: str | None = None
    snapshot_key: str | None = None
    stream_state_mode: str = "full"
    snapshot_ttl_seconds: int = 600
    log_level: str = "info"
    audit_engine: list[str] = field(default_factory=list)
    audit_render: list[str] = field(default_factory=list)
    audit_interval: float = 60.0
    audit_gates_readiness: bool = False
    workers: int = 0  # 0: the CPUs this process may use (affinity and cgroup quota)
    max_inflight: int = 256  # per worker; above it requests get a fast 503 with Retry-After
    # Gateway mode (render_service/gateway): --tokens-only engines behind /v1/chat/completions etc.
    engine: list[str] = field(default_factory=list)
    engine_timeout: float = 600.0  # seconds an engine may stay silent (connect, first token, between tokens)
    engine_health_interval: float = 5.0  # seconds between GET /health probes of each engine
    engine_max_inflight: int = 0  # requests in flight per engine per worker; 0: no limit
    # Prefill/decode disaggregation: prefill pool, then the decode pool with the KV hand-off.
    prefill_engine: list[str] = field(default_factory=list)
    decode_engine: list[str] = field(default_factory=list)
    prefill_fallback_recompute: bool = False  # a failed prefill: decode-only (recompute) instead of an error
    # The engines' KV connector finds a prefill's KV by the prompt (vLLM's ExampleConnector, LMCache):
    # a prefill answered without kv_transfer_params has handed off, and the decode goes with the prompt alone.
    prefill_kv_by_prompt: bool = False
    # Prefix affinity: requests sharing their first N prompt tokens go to the same healthy engine; 0: off.
    engine_affinity_prefix_tokens: int = 0
    # HTTPS, with vLLM's flags and meanings (uvicorn's options; ssl_cert_reqs as the ssl module's int).
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE; 1: optional, 2: required (mTLS)
    ssl_ciphers: str | None = None
    enable_ssl_refresh: bool = False
    # Multimodal (a Qwen3-VL model folder): vLLM's names where vLLM has the option.
    limit_mm_per_prompt: dict[str, Any] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_request_mm_kwargs: bool = False
    allowed_media_domains: list[str] | None = None
    media_allow_private_addresses: bool = False
    media_allow_redirects: bool = False
    media_fetch_timeout: float = 5.0
    media_max_bytes: int = 32 << 20
    mm_cache_bytes: int = 512 << 20
    # Token ids of prompt pieces between added tokens, reused across turns (render/segments.py); 0: off.
    segment_cache_bytes: int = 128 << 20
    # Template every chat prompt in full: turns incremental templating (render/history.py) off.
    full_templating: bool = False
    # Token-identical continuation (render/continuation.py): derender hands out signed handles to the
    # generated ids, and a chat render that asks for it splices them back in.
    preserve_generated_tokens: bool = False
    preserve_generated_tokens_ttl_seconds: int = 3600
    mm_cache_redis: bool = False  # share processed images between replicas through --redis-url
    mm_cache_redis_ttl_seconds: int = 600
    mm_cache_redis_max_entry_bytes: int = 32 << 20
    # LoRA adapters (vLLM's --lora-modules; `name=path` strings are parsed by `validate`).
    lora_modules: list[LoRAModulePath | str] = field(default_factory=list)
    allow_runtime_lora_updating: bool = False  # VLLM_ALLOW_RUNTIME_LORA_UPDATING (vLLM has no flag)
    # The vLLM adapter's live parser streams, per worker (render_service/adapter/streams.py).
    adapter_stream_cache_entries: int = 4096
    adapter_stream_cache_bytes: int = 256 << 20

    @property
    def served_names(self) -> list[str]:
        return self.served_model_name or [self.model]

    @property
    def redis_enabled(self) -> bool:
        return bool(self.redis_url or self.redis_sentinel)

    @property
    def default_template_kwargs(self) -> dict[str, Any]:
        """vLLM's `_renderer_default_chat_template_kwargs`: `--cohere-format` folded in."""
        kwargs = dict(self.default_chat_template_kwargs)
        if self.cohere_format:
            kwargs.setdefault("cohere_format", self.cohere_format)
        return kwargs

    @property
    def lora_module_paths(self) -> list[LoRAModulePath]:
        return [m for m in self.lora_modules if isinstance(m, LoRAModulePath)]

    def _validate_lora_modules(self) -> None:
        """Entries from the environment or code arrive as strings: parse them as the flag does. Name
        clashes fail here, as vLLM's start-up fails on them (the paths are checked when the set loads)."""
        try:
            self.lora_modules = [
                m
                for item in self.lora_modules
                for m in (parse_lora_modules([item]) if isinstance(item, str) else [item])
            ]
        except LoRAModuleError as exc:
            raise SettingsError(str(exc)) from None
        seen: set[str] = set()
        for module in self.lora_module_paths:
            if not module.name or not module.path:
                raise SettingsError(f"--lora-modules: both a name and a path are needed ({module})")
            if module.name in self.served_names:
                raise SettingsError(f"The lora adapter '{module.name}' conflicts with a served base model.")
            if module.name in seen:
                raise SettingsError(
                    f"The lora adapter '{module.name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True."
                )
            seen.add(module.name)

    @property
    def gateway_mode(self) -> bool:
        """Whether engines are configured (`--engine`, or the prefill and decode pools)."""
        return bool(self.engine or self.decode_engine)

    def _validate_engines(self) -> None:
        for flag, urls in (
            ("--engine", self.engine),
            ("--prefill-engine", self.prefill_engine),
            ("--decode-engine", self.decode_engine),
        ):
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise SettingsError(f"{flag} {url!r} must be an http:// or https:// base URL")
        self.engine = [url.rstrip("/") for url in self.engine]
        self.prefill_engine = [url.rstrip("/") for url in self.prefill_engine]
        self.decode_engine = [url.rstrip("/") for url in self.decode_engine]
        if bool(self.prefill_engine) != bool(self.decode_engine):
            raise SettingsError("--prefill-engine and --decode-engine go together (one or more of each)")
        if self.engine and self.decode_engine:
            raise SettingsError("use either --engine or the --prefill-engine / --decode-engine pools, not both")
        if self.prefill_fallback_recompute and not self.decode_engine:
            raise SettingsError("--prefill-fallback-recompute needs --prefill-engine and --decode-engine")
        if self.prefill_kv_by_prompt and not self.decode_engine:
            raise SettingsError("--prefill-kv-by-prompt needs --prefill-engine and --decode-engine")
        if self.engine_affinity_prefix_tokens < 0:
            raise SettingsError("--engine-affinity-prefix-tokens must be 0 (off) or positive")
        if self.engine_timeout <= 0 or self.engine_health_interval <= 0:
            raise SettingsError("--engine-timeout and --engine-health-interval must be positive")
        if self.engine_max_inflight < 0:
            raise SettingsError("--engine-max-inflight must be 0 (no limit) or positive")

    def validate(self) -> Settings:
        self._validate_lora_modules()
        from render_service.render.renderers import TOKENIZER_MODES

        self.tokenizer_mode = self.tokenizer_mode.lower()  # vLLM lowercases it too
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise SettingsError(
                f"No tokenizer registered for tokenizer_mode={self.tokenizer_mode!r} (--tokenizer-mode: "
                f"one of {', '.join(TOKENIZER_MODES)})"
            )
        # Names without a native parser (and plugin files) need vLLM's parsers: render_service/adapter.
        from render_service import adapter

        try:
            adapter.check_settings(self)
        except adapter.AdapterUnavailable as exc:
            raise SettingsError(str(exc)) from None
        if self.adapter_stream_cache_entries < 0 or self.adapter_stream_cache_bytes < 0:
            raise SettingsError("--adapter-stream-cache-entries and --adapter-stream-cache-bytes must be non-negative")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise SettingsError("--enable-auto-tool-choice requires --tool-call-parser")
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise SettingsError("--chat-template-content-format must be one of auto, string, openai")
        if self.stream_state_mode not in STREAM_STATE_MODES:
            raise SettingsError("--stream-state-mode must be full or compact")
        if self.max_logprobs < -1:
            raise SettingsError("--max-logprobs must be -1 or non-negative")
        if self.max_model_len is not None and self.max_model_len < -1:
            raise SettingsError("--max-model-len must be positive, or -1 for the model's value")
        self._validate_engines()
        if self.redis_enabled and not self.snapshot_key:
            raise SettingsError(
                "--redis-url needs --snapshot-key (or RENDER_SNAPSHOT_KEY): replicas must share "
                "the HMAC key that signs parser snapshots"
            )
        self._validate_redis()
        if self.mm_cache_redis and not self.redis_enabled:
            raise SettingsError(
                "--mm-cache-redis needs --redis-url (and --snapshot-key, whose key also "
                "authenticates the cached images)"
            )
        self._validate_ssl()
        if self.mm_cache_redis_ttl_seconds <= 0 or self.mm_cache_redis_max_entry_bytes <= 0:
            raise SettingsError("--mm-cache-redis-ttl-seconds and --mm-cache-redis-max-entry-bytes must be positive")
        if self.tokenizer_backend not in ("auto", "hf"):
            raise SettingsError("--tokenizer-backend must be auto or hf")
        if self.segment_cache_bytes < 0:
            raise SettingsError("--segment-cache-bytes must be 0 (off) or positive")
        if self.preserve_generated_tokens_ttl_seconds <= 0:
            raise SettingsError("--preserve-generated-tokens-ttl-seconds must be positive")
        if self.mm_processor_kwargs:
            from render_service.exceptions import RenderServiceError
            from render_service.multimodal import qwen3_vl as multimodal

            try:  # the folder's bounds are unknown here; keys and values are checked
                multimodal.server_bounds(self.mm_processor_kwargs, 1, 1)
            except RenderServiceError as exc:
                raise SettingsError(f"--mm-processor-kwargs: {exc}") from None
        return self

    def _validate_redis(self) -> None:
        from render_service.redis_target import RedisTarget

        if not self.redis_enabled:
            if self.redis_sentinel_master or self.redis_cluster or self.redis_ssl_ca_certs or self.redis_ssl_certfile:
                raise SettingsError("the --redis-* options need --redis-url (or --redis-sentinel)")
            return
        try:
            target = RedisTarget.from_settings(self)
            assert target is not None
            target.validate()
        except (ValueError, OSError, ssl.SSLError) as exc:  # OSError, SSLError: the certificate files
            raise SettingsError(str(exc)) from None

    def _validate_ssl(self) -> None:
        """What uvicorn would only find out in each worker: a missing or mismatched file, a cipher
        string OpenSSL refuses, client certificates asked for with nothing to verify them by."""
        if self.ssl_keyfile and not self.ssl_certfile:
            raise SettingsError("--ssl-keyfile needs --ssl-certfile")
        if self.ssl_cert_reqs not in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
            raise SettingsError("--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required)")
        if not self.ssl_certfile:
            if self.ssl_ca_certs or self.ssl_cert_reqs or self.ssl_ciphers or self.enable_ssl_refresh:
                raise SettingsError(
                    "--ssl-ca-certs, --ssl-cert-reqs, --ssl-ciphers and --enable-ssl-refresh need --ssl-certfile"
                )
            return
        if self.ssl_cert_reqs and not self.ssl_ca_certs:
            raise SettingsError("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CA that signs client certificates)")
        try:
            server_ssl_context(self)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(f"--ssl-*: {exc}") from None


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The context uvicorn builds from the same options (each worker builds its own)."""
    if not settings.ssl_certfile:
        return None
    from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

    return create_ssl_context(
        certfile=settings.ssl_certfile,
        keyfile=settings.ssl_keyfile,
        password=None,
        ssl_version=SSL_PROTOCOL_VERSION,
        cert_reqs=settings.ssl_cert_reqs,
        ca_certs=settings.ssl_ca_certs,
        ciphers=settings.ssl_ciphers,
    )


def _json_dict(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object: {exc}") from exc
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object")
        return value

    return parse


def _max_model_len(text: str) -> int:
    """vLLM accepts 1k/1K/1m-style suffixes and -1/auto."""
    lowered = text.strip().lower()
    if lowered in ("auto", "-1"):
        return -1
    multipliers = {"k": 1000, "m": 1000**2, "g": 1000**3}
    if lowered[-1:] in multipliers:
        unit = (
            multipliers[lowered[-1]]
            if text.strip()[-1].islower()
            else {"k": 1024, "m": 1024**2, "g": 1024**3}[lowered[-1]]
        )
        return int(float(lowered[:-1]) * unit)
    return int(lowered)


class _LoRAModulesAction(argparse.Action):
    """vLLM's `LoRAParserAction`: each value `name=path` or a JSON object; a repeated flag replaces."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        try:
            setattr(namespace, self.dest, parse_lora_modules(values or []))
        except LoRAModuleError as exc:
            parser.error(str(exc))


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `serve` and `fingerprint`: everything that shapes outputs."""
    parser.add_argument("model", help="local model folder or Hugging Face id")
    parser.add_argument("--served-model-name", nargs="+", default=[])
    parser.add_argument("--tokenizer")
    parser.add_argument("--revision")
    parser.add_argument("--tokenizer-revision")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument(
        "--tokenizer-mode",
        default="auto",
        help="the renderer, as vLLM names it: auto (from the model), hf, deepseek_v32, deepseek_v4, "
        "deepseek_v41, kimi_k3 (vLLM's other modes fail at start)",
    )
    parser.add_argument("--chat-template", help="a file path or an inline Jinja template")
    parser.add_argument("--chat-template-content-format", default="auto", choices=CONTENT_FORMATS)
    parser.add_argument("--default-chat-template-kwargs", type=_json_dict("--default-chat-template-kwargs"), default={})
    parser.add_argument("--cohere-format", default="cmd4")
    parser.add_argument("--trust-request-chat-template", action="store_true")
    parser.add_argument("--reasoning-parser")
    parser.add_argument("--tool-call-parser")
    parser.add_argument(
        "--tool-parser-plugin",
        default="",
        help="a Python file registering vLLM tool parsers (needs the render-service[vllm] extra)",
    )
    parser.add_argument(
        "--reasoning-parser-plugin",
        default="",
        help="a Python file registering vLLM reasoning parsers (needs the render-service[vllm] extra)",
    )
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--exclude-tools-when-tool-choice-none", action="store_true")
    parser.add_argument("--max-model-len", type=_max_model_len)
    parser.add_argument("--generation-config", default="auto")
    parser.add_argument("--override-generation-config", type=_json_dict("--override-generation-config"), default={})
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument(
        "--tokenizer-backend",
        default="auto",
        choices=("auto", "hf"),
        help="auto: fastokens when its self-test matches HF tokenizers",
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=_json_dict("--limit-mm-per-prompt"),
        default={},
        help='e.g. {"image": 4} (vLLM default: 999 per modality)',
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=_json_dict("--mm-processor-kwargs"),
        default={},
        help='image processor overrides, e.g. {"max_pixels": 1003520} (size, min_pixels, max_pixels)',
    )
    parser.add_argument(
        "--trust-request-mm-kwargs",
        action="store_true",
        help="accept per-request mm_processor_kwargs (they change preprocessing cost)",
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        action=_LoRAModulesAction,
        default=[],
        metavar="NAME=PATH|JSON",
        help='LoRA adapters served by name: name=path, or {"name": ..., "path": ..., "base_model_name": ...}',
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="or VLLM_API_KEY")
    parser.add_argument("--max-request-body-bytes", type=int, default=64 << 20)
    parser.add_argument(
        "--redis-url",
        default=None,
        help="redis://, rediss:// (TLS) or unix:// URL of the Redis that shares snapshots between replicas; "
        "with --redis-cluster any node of the cluster; with --redis-sentinel only scheme, credentials "
        "and database (e.g. rediss://:PASSWORD@/0)",
    )
    parser.add_argument(
        "--redis-sentinel",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a Redis Sentinel (repeatable): the master of --redis-sentinel-master is found through them, "
        "again after a failover",
    )
    parser.add_argument("--redis-sentinel-master", default=None, metavar="NAME", help="the Sentinel master set name")
    parser.add_argument(
        "--redis-sentinel-password",
        default=None,
        help="password of the sentinels themselves, when they have one (the master's is in --redis-url)",
    )
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="--redis-url is a node of a Redis Cluster: keys are spread over its slots",
    )
    parser.add_argument(
        "--redis-ssl-ca-certs", default=None, metavar="FILE", help="CA bundle that verifies a rediss:// server"
    )
    parser.add_argument(
        "--redis-ssl-certfile", default=None, metavar="FILE", help="client certificate for rediss:// (mutual TLS)"
    )
    parser.add_argument("--redis-ssl-keyfile", default=None, metavar="FILE", help="private key of --redis-ssl-certfile")
    parser.add_argument("--snapshot-key", default=None, help="HMAC key for snapshots (or RENDER_SNAPSHOT_KEY)")
    parser.add_argument("--stream-state-mode", default="full", choices=STREAM_STATE_MODES)
    parser.add_argument("--snapshot-ttl-seconds", type=int, default=600)
    parser.add_argument(
        "--adapter-stream-cache-entries",
        type=int,
        default=4096,
        help="streams whose vLLM-adapter parser objects each worker keeps live between chunks",
    )
    parser.add_argument(
        "--adapter-stream-cache-bytes",
        type=int,
        default=256 << 20,
        help="estimated bytes those live parser objects may hold per worker (least recently used go first)",
    )
    parser.add_argument("--log-level", default="info")
    # HTTPS: vLLM's flags, with its types and defaults (uvicorn applies them in every worker).
    parser.add_argument("--ssl-keyfile", default=None, help="the file path to the SSL key file")
    parser.add_argument("--ssl-certfile", default=None, help="the file path to the SSL cert file")
    parser.add_argument("--ssl-ca-certs", default=None, help="the CA certificates file (verifies client certificates)")
    parser.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=int(ssl.CERT_NONE),
        help="whether client certificate is required (see stdlib ssl module's): 0 none, 1 optional, 2 required",
    )
    parser.add_argument(
        "--ssl-ciphers", default=None, help="SSL cipher suites for HTTPS (TLS 1.2 and below only), OpenSSL syntax"
    )
    parser.add_argument(
        "--enable-ssl-refresh",
        action="store_true",
        help="refresh SSL context when SSL certificate files change (checked once a second by every worker)",
    )
    parser.add_argument(
        "--audit-engine",
        action="append",
        default=[],
        metavar="URL",
        help="audit this engine continuously (repeatable); see `render-service audit`",
    )
    parser.add_argument(
        "--audit-render",
        action="append",
        default=[],
        metavar="URL",
        help="audit this render replica continuously (repeatable)",
    )
    parser.add_argument("--audit-interval", type=float, default=60.0, help="seconds between audits")
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="gateway mode: a vLLM --tokens-only engine's base URL (repeatable); adds /v1/chat/completions "
        "and /v1/completions, which render here, generate there and derender here",
    )
    parser.add_argument(
        "--engine-timeout",
        type=float,
        default=600.0,
        help="seconds an engine may stay silent (connecting, before the first token, between tokens)",
    )
    parser.add_argument(
        "--engine-health-interval", type=float, default=5.0, help="seconds between GET /health probes of each engine"
    )
    parser.add_argument(
        "--engine-max-inflight",
        type=int,
        default=0,
        help="requests in flight per engine (per worker) above which it is not picked; 0: no limit",
    )
    parser.add_argument(
        "--prefill-engine",
        action="append",
        default=[],
        metavar="URL",
        help="gateway mode with prefill/decode disaggregation: a prefill engine's base URL (repeatable; "
        "needs --decode-engine); each request is prefilled there (max_tokens 1, do_remote_decode) first",
    )
    parser.add_argument(
        "--decode-engine",
        action="append",
        default=[],
        metavar="URL",
        help="a decode engine's base URL (repeatable; needs --prefill-engine): it generates with the "
        "prefill's kv_transfer_params",
    )
    parser.add_argument(
        "--prefill-fallback-recompute",
        action="store_true",
        help="when no prefill engine can serve a request, generate on a decode engine alone "
        "(recomputing the prompt) instead of answering 503",
    )
    parser.add_argument(
        "--prefill-kv-by-prompt",
        action="store_true",
        help="the engines' KV connector finds a prefill's KV by the prompt tokens (vLLM's ExampleConnector, "
        "LMCache), so a prefill answered without kv_transfer_params has handed its KV off: the decode "
        "request goes with the prompt alone (without this flag such a prefill counts as failed)",
    )
    parser.add_argument(
        "--engine-affinity-prefix-tokens",
        type=int,
        default=0,
        help="prefix affinity: requests whose first N prompt tokens match go to the same healthy engine "
        "(their KV prefix cache is there); 0: off, least-outstanding-requests only",
    )
    parser.add_argument(
        "--audit-gates-readiness", action="store_true", help="/health answers 503 while an audit mismatch persists"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="worker processes on one listening socket (0: the CPUs available to this process)",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="requests in flight per worker before answering 503 with Retry-After",
    )
    parser.add_argument(
        "--allowed-media-domains", nargs="+", default=None, help="only fetch image URLs from these hosts"
    )
    parser.add_argument(
        "--media-allow-private-addresses",
        action="store_true",
        help="allow image URLs that resolve to loopback/private/link-local addresses",
    )
    parser.add_argument("--media-allow-redirects", action="store_true", help="follow redirects on image URLs")
    parser.add_argument("--media-fetch-timeout", type=float, default=5.0, help="seconds per image URL")
    parser.add_argument(
        "--media-max-bytes", type=int, default=32 << 20, help="largest image (fetched body or decoded data: URL)"
    )
    parser.add_argument(
        "--mm-cache-bytes", type=int, default=512 << 20, help="in-process cache of processed images, by content hash"
    )
    parser.add_argument(
        "--segment-cache-bytes",
        type=int,
        default=128 << 20,
        help="per-worker cache of the token ids of prompt pieces between special tokens, and of recent "
        "conversations' prompts (a turn re-sending its history reuses them); 0 turns it off",
    )
    parser.add_argument(
        "--full-templating",
        action="store_true",
        help="template every chat prompt in full: turns off incremental templating (a turn whose history this "
        "worker rendered is templated from its previous prompt, checked per kind of turn); the segment cache stays",
    )
    parser.add_argument(
        "--preserve-generated-tokens",
        action="store_true",
        help="token-identical continuation: derender returns a signed handle to each reply's generated ids "
        "(kept in-process and in --redis-url), and a chat render with preserve_generated_tokens: true "
        "splices them back in, so the next prompt extends the last prompt + output token for token",
    )
    parser.add_argument(
        "--preserve-generated-tokens-ttl-seconds",
        type=int,
        default=3600,
        help="how long a reply's generated ids are kept for the next turn (in-process and in Redis)",
    )
    parser.add_argument(
        "--mm-cache-redis",
        action="store_true",
        help="also share processed images between replicas in --redis-url (a re-sent image "
        "another replica processed costs a Redis GET instead of a decode and resize)",
    )
    parser.add_argument(
        "--mm-cache-redis-ttl-seconds", type=int, default=600, help="how long a processed image lives in Redis"
    )
    parser.add_argument(
        "--mm-cache-redis-max-entry-bytes",
        type=int,
        default=32 << 20,
        help="processed images larger than this are not stored in Redis (a 1280x720 image with tensors is ~7.2 MB)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    values = {name: getattr(args, name) for name in Settings.__dataclass_fields__ if hasattr(args, name)}
    settings = Settings(**values)
    if settings.api_key is None:
        settings.api_key = os.environ.get("VLLM_API_KEY") or None
    if settings.snapshot_key is None:
        settings.snapshot_key = os.environ.get("RENDER_SNAPSHOT_KEY") or None
    settings.allow_runtime_lora_updating = runtime_updating_allowed()
    return settings.validate()


ENV_PREFIX = "RENDER_"


def apply_environment(parser: argparse.ArgumentParser, environ: dict[str, str] | None = None) -> None:
    """Every option can come from the environment as RENDER_<FLAG> (e.g. RENDER_MAX_MODEL_LEN=8192,
    RENDER_ENABLE_AUTO_TOOL_CHOICE=true, RENDER_SERVED_MODEL_NAME="a b"); flags on the command line
    win. This is what container images and Helm values set."""
    environ = dict(os.environ if environ is None else environ)
    defaults: dict[str, Any] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = environ.get(ENV_PREFIX + action.dest.upper())
        if value is None:
            continue
        if action.nargs == 0:  # store_true
            defaults[action.dest] = value.strip().lower() in ("1", "true", "yes", "on")
        elif action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
            defaults[action.dest] = (
                [convert(v) for v in value.split()] if callable(convert := action.type) else value.split()
            )
        else:
            defaults[action.dest] = convert(value) if callable(convert := action.type) else value
    if "model" in [a.dest for a in parser._actions] and environ.get(ENV_PREFIX + "MODEL"):
        for action in parser._actions:
            if action.dest == "model":
                action.nargs = "?"
                action.default = environ[ENV_PREFIX + "MODEL"]
    parser.set_defaults(**defaults)
