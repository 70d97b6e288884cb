"""Settings and CLI: vLLM flag names, failures at start, and the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from render_service.cli import _parser
from render_service.settings import Settings, SettingsError, apply_environment, settings_from_args


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_service.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_vllm_flags_parse() -> None:
    args = _parser().parse_args(
        [
            "serve",
            "m",
            "--served-model-name",
            "a",
            "b",
            "--max-model-len",
            "16k",
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "hermes",
            "--enable-auto-tool-choice",
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
            "--override-generation-config",
            '{"temperature": 0.1}',
            "--chat-template-content-format",
            "openai",
            "--max-logprobs",
            "5",
            "--trust-request-chat-template",
            "--trust-request-mm-kwargs",
            "--mm-processor-kwargs",
            '{"max_pixels": 1003520}',
        ]
    )
    settings = settings_from_args(args)
    assert settings.trust_request_mm_kwargs and settings.mm_processor_kwargs == {"max_pixels": 1003520}
    assert settings.served_names == ["a", "b"] and settings.max_model_len == 16000
    assert settings.default_template_kwargs == {"enable_thinking": False, "cohere_format": "cmd4"}
    assert settings.override_generation_config == {"temperature": 0.1}


@pytest.mark.parametrize(
    "values, message",
    [
        ({"reasoning_parser": "nope"}, "--reasoning-parser 'nope' is not supported"),
        ({"tool_call_parser": "muse_glimmer"}, "--tool-call-parser 'muse_glimmer' is not supported"),
        ({"enable_auto_tool_choice": True}, "--enable-auto-tool-choice requires --tool-call-parser"),
        ({"redis_url": "redis://x"}, "--snapshot-key"),
        ({"mm_cache_redis": True}, "--mm-cache-redis needs --redis-url"),
        (
            {"mm_cache_redis": True, "redis_url": "redis://x", "snapshot_key": "k", "mm_cache_redis_ttl_seconds": 0},
            "must be positive",
        ),
        ({"mm_processor_kwargs": {"do_resize": False}}, "--mm-processor-kwargs: do_resize not supported"),
        ({"mm_processor_kwargs": {"max_pixels": "big"}}, "max_pixels must be a positive integer"),
        ({"mm_processor_kwargs": {"size": {"height": 10}}}, "size must be a mapping of shortest_edge"),
        ({"prefill_engine": ["http://p:8000"]}, "--prefill-engine and --decode-engine go together"),
        ({"decode_engine": ["http://d:8000"]}, "--prefill-engine and --decode-engine go together"),
        (
            {"engine": ["http://e:8000"], "prefill_engine": ["http://p:8000"], "decode_engine": ["http://d:8000"]},
            "either --engine or the --prefill-engine / --decode-engine pools",
        ),
        ({"prefill_engine": ["p:8000"], "decode_engine": ["http://d:8000"]}, "--prefill-engine 'p:8000' must be"),
        ({"engine": ["http://e:8000"], "prefill_fallback_recompute": True}, "--prefill-fallback-recompute needs"),
        ({"engine": ["http://e:8000"], "prefill_kv_by_prompt": True}, "--prefill-kv-by-prompt needs"),
        ({"engine_affinity_prefix_tokens": -1}, "--engine-affinity-prefix-tokens must be 0"),
    ],
)
def test_bad_settings_fail_at_start(values: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings(model="m", **values).validate()


def test_gateway_pool_flags_parse() -> None:
    args = _parser().parse_args(
        [
            "serve",
            "m",
            "--prefill-engine",
            "http://p1:8000/",
            "--prefill-engine",
            "http://p2:8000",
            "--decode-engine",
            "http://d1:8000",
            "--prefill-fallback-recompute",
            "--prefill-kv-by-prompt",
            "--engine-affinity-prefix-tokens",
            "256",
        ]
    )
    settings = settings_from_args(args)
    assert settings.prefill_engine == ["http://p1:8000", "http://p2:8000"]
    assert settings.decode_engine == ["http://d1:8000"] and settings.engine == []
    assert settings.prefill_fallback_recompute and settings.engine_affinity_prefix_tokens == 256
    assert settings.prefill_kv_by_prompt
    assert settings.gateway_mode
    assert not Settings(model="m").validate().gateway_mode


def test_unknown_flag_and_parser_fail_with_clear_messages(qwen3_model_dir: Path) -> None:
    result = run_cli("serve", str(qwen3_model_dir), "--tensor-parallel-size", "2")
    assert result.returncode == 2 and "unrecognized arguments: --tensor-parallel-size" in result.stderr
    # A name no registry knows (registered names start a server: this must fail before that).
    result = run_cli("serve", str(qwen3_model_dir), "--reasoning-parser", "no_such_parser")
    assert result.returncode == 2 and "--reasoning-parser 'no_such_parser' is not supported" in result.stderr
    result = run_cli("serve", "/does/not/exist/model", "--port", "0")
    assert result.returncode == 2 and "cannot find model" in result.stderr


def test_every_flag_from_the_environment() -> None:
    parser = _parser()
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    apply_environment(
        serve,
        {
            "RENDER_MODEL": "/models/x",
            "RENDER_MAX_MODEL_LEN": "8192",
            "RENDER_ENABLE_AUTO_TOOL_CHOICE": "true",
            "RENDER_TOOL_CALL_PARSER": "hermes",
            "RENDER_SERVED_MODEL_NAME": "a b",
            "RENDER_PORT": "9000",
        },
    )
    args = parser.parse_args(["serve"])
    assert (args.model, args.max_model_len, args.enable_auto_tool_choice, args.served_model_name, args.port) == (
        "/models/x",
        8192,
        True,
        ["a", "b"],
        9000,
    )
    assert parser.parse_args(["serve", "/other", "--port", "1"]).port == 1  # the command line wins


def test_redis_topology_and_tls_flags_parse(tmp_path: Path) -> None:
    from tests.certs import make_pki

    pki = make_pki(tmp_path)
    flags = [
        *("serve", "m", "--snapshot-key", "k", "--redis-url", "rediss://:pw@/2"),
        *("--redis-sentinel", "10.0.0.1:26379", "--redis-sentinel", "[::1]:26380", "--redis-sentinel", "s3"),
        *("--redis-sentinel-master", "mymaster", "--redis-sentinel-password", "sp"),
        *("--redis-ssl-ca-certs", str(pki.ca), "--redis-ssl-certfile", str(pki.client_cert)),
        *("--redis-ssl-keyfile", str(pki.client_key)),
        *("--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key)),
        *("--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2", "--ssl-ciphers", "ECDHE+AESGCM"),
    ]
    args = _parser().parse_args(flags)
    settings = settings_from_args(args)
    from render_service.redis_target import SENTINEL, RedisTarget
    from render_service.server.tls import tls_options

    target = RedisTarget.from_settings(settings)
    assert target is not None and target.mode == SENTINEL and target.tls
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("s3", 26379))
    assert (target.sentinel_master, target.sentinel_password) == ("mymaster", "sp")
    assert target.url_parts()["password"] == "pw" and target.url_parts()["db"] == 2
    assert tls_options(settings) == {
        "ssl_keyfile": str(pki.server_key),
        "ssl_certfile": str(pki.server_cert),
        "ssl_ca_certs": str(pki.ca),
        "ssl_cert_reqs": 2,
        "ssl_ciphers": "ECDHE+AESGCM",
    }
    cluster = settings_from_args(
        _parser().parse_args(["serve", "m", "--snapshot-key", "k", "--redis-url", "redis://n1:7000", "--redis-cluster"])
    )
    assert RedisTarget.from_settings(cluster).mode == "cluster"  # type: ignore[union-attr]
    assert tls_options(cluster) == {} and RedisTarget.from_settings(Settings(model="m")) is None


@pytest.mark.parametrize(
    "values, message",
    [
        ({"redis_sentinel": ["s:26379"]}, "--redis-sentinel needs --redis-sentinel-master"),
        (
            {"redis_sentinel": ["s:26379"], "redis_sentinel_master": "m", "redis_url": "redis://host:6379/0"},
            "carries only the scheme, credentials and database",
        ),
        ({"redis_sentinel": ["s:port"], "redis_sentinel_master": "m"}, "--redis-sentinel 's:port' is not HOST:PORT"),
        ({"redis_sentinel": ["s:1"], "redis_sentinel_master": "m", "redis_cluster": True}, "exclude each other"),
        ({"redis_url": "redis://h:1", "redis_sentinel_master": "m"}, "--redis-sentinel-master needs --redis-sentinel"),
        ({"redis_url": "unix:///tmp/r.sock", "redis_cluster": True}, "--redis-cluster needs a --redis-url"),
        ({"redis_url": "redis://h:1", "redis_ssl_ca_certs": "/ca.pem"}, "need a rediss:// --redis-url"),
        ({"redis_url": "rediss://h:1", "redis_ssl_keyfile": "/k.pem"}, "--redis-ssl-keyfile needs"),
        ({"redis_url": "rediss://h:1", "redis_ssl_ca_certs": "/does/not/exist.pem"}, "No such file"),
        ({"redis_url": "http://h:1"}, "must start with redis://"),
        ({"redis_cluster": True}, "need --redis-url"),
    ],
)
def test_bad_redis_topology_fails_at_start(values: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings(model="m", snapshot_key="k", **values).validate()


def test_bad_tls_options_fail_at_start(tmp_path: Path) -> None:
    from tests.certs import make_pki

    pki = make_pki(tmp_path)
    cert, key = str(pki.server_cert), str(pki.server_key)
    cases = [
        ({"ssl_keyfile": key}, "--ssl-keyfile needs --ssl-certfile"),
        ({"ssl_certfile": cert, "ssl_keyfile": key, "ssl_cert_reqs": 2}, "needs --ssl-ca-certs"),
        ({"ssl_certfile": cert, "ssl_keyfile": key, "ssl_cert_reqs": 5}, "must be 0"),
        ({"ssl_ca_certs": str(pki.ca)}, "need --ssl-certfile"),
        ({"ssl_certfile": cert, "ssl_keyfile": str(pki.client_key)}, "KEY_VALUES_MISMATCH"),
        ({"ssl_certfile": cert, "ssl_keyfile": key, "ssl_ciphers": "NOT-A-CIPHER"}, "cipher"),
        ({"ssl_certfile": str(tmp_path / "missing.pem")}, "No such file"),
    ]
    for values, message in cases:
        with pytest.raises(SettingsError, match=message):
            Settings(model="m", **values).validate()
    # vLLM's default: plain HTTP, no client certificates.
    settings = Settings(model="m").validate()
    assert (settings.ssl_certfile, settings.ssl_cert_reqs, settings.ssl_ciphers) == (None, 0, None)
