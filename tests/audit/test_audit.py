"""`render-service audit` without vLLM: real render-service replicas (create_app on real loopback
ports) with planted mismatches, fake tokens-only engines that answer like vLLM's, endpoints files,
the continuous audit's gauges and readiness, and the CLI's exit codes.

Every planted mismatch must be reported under the component that differs, and nothing else may
be reported as a mismatch (no false positives)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from render_service.audit.audit import (
    AuditReport,
    ContinuousAudit,
    EndpointsFileError,
    Finding,
    load_endpoints,
    main_audit,
    run_audit,
)
from render_service.model.loader import Model, load_model
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.integration.engine_fixture import app_server, free_port

pytestmark = pytest.mark.timeout(300)

BASE: dict[str, Any] = {
    "served_model_name": ["tinyqwen3"],
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "enable_auto_tool_choice": True,
    "max_model_len": 8192,
}
BASE_FLAGS = [
    "--served-model-name",
    "tinyqwen3",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "hermes",
    "--enable-auto-tool-choice",
    "--max-model-len",
    "8192",
]


def settings_for(model_dir: Path, **overrides: Any) -> Settings:
    return Settings(model=str(model_dir), **{**BASE, **overrides}).validate()


@contextmanager
def replica(model_dir: Path, **overrides: Any) -> Iterator[str]:
    with app_server(create_app(settings_for(model_dir, **overrides))) as url:
        yield url


def errors(report: AuditReport) -> set[tuple[str, str]]:
    return {(f.peer, f.component) for f in report.mismatches}


@pytest.fixture(scope="module")
def local(qwen3_model_dir: Path) -> tuple[Settings, Model]:
    settings = settings_for(qwen3_model_dir)
    return settings, load_model(settings)


@pytest.fixture(scope="module")
def root(qwen3_model_dir: Path) -> str:
    """The model root a matching engine reports in /v1/models."""
    return str(qwen3_model_dir)


@pytest.fixture(scope="module")
def base_replica(qwen3_model_dir: Path) -> Iterator[str]:
    with replica(qwen3_model_dir) as url:
        yield url


@pytest.fixture(scope="module")
def variant_template(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    config = json.loads((qwen3_model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("templates") / "variant.jinja"
    path.write_text("{{- '# audited deployment\\n' }}" + config["chat_template"], encoding="utf-8")
    return str(path)


# -- render replicas -------------------------------------------------------------------------------


def test_matching_replicas_agree(qwen3_model_dir: Path, base_replica: str, local: tuple[Settings, Model]) -> None:
    with replica(qwen3_model_dir) as twin:
        report = run_audit([base_replica, twin], [], local=None)
        assert report.exit_code == 0, report.to_table()
        assert not report.warnings
        assert report.reference == f"render replica {base_replica}"
        checked = {f.component for f in report.findings if f.peer == twin and f.severity == "ok"}
        assert {
            "fingerprint",
            "chat_template",
            "max_model_len",
            "parsers",
            "generation_defaults",
            "default_chat_template_kwargs",
            "served_model_names",
            "tokenizer_files",
            "vllm_version",
        } <= checked

        report = run_audit([base_replica, twin], [], local=local)
        assert report.exit_code == 0, report.to_table()
        assert not report.warnings
        assert report.peers[twin]["fingerprint"] == report.peers[base_replica]["fingerprint"]


PLANTED = {
    "chat_template": ({"chat_template": "VARIANT"}, {"chat_template"}),
    "max_model_len": ({"max_model_len": 4096}, {"max_model_len"}),
    "reasoning_parser": ({"reasoning_parser": None}, {"parsers"}),
    "tool_parser": ({"tool_call_parser": None, "enable_auto_tool_choice": False}, {"parsers"}),
    "template_kwargs": ({"default_chat_template_kwargs": {"enable_thinking": False}}, {"default_chat_template_kwargs"}),
    "generation": ({"override_generation_config": {"temperature": 0.2}}, {"generation_defaults"}),
    "served_name": ({"served_model_name": ["other-name"]}, {"served_model_names"}),
    "max_logprobs": ({"max_logprobs": 5}, {"max_logprobs"}),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_planted_replica_mismatch(
    case: str, qwen3_model_dir: Path, base_replica: str, variant_template: str, local: tuple[Settings, Model]
) -> None:
    overrides, components = PLANTED[case]
    overrides = {k: (variant_template if v == "VARIANT" else v) for k, v in overrides.items()}
    expected = {*components, "fingerprint"}
    with replica(qwen3_model_dir, **overrides) as other:
        # Replica against replica (the first is the reference), then against the local configuration.
        for report in (run_audit([base_replica, other], [], local=None), run_audit([other], [], local=local)):
            assert report.exit_code == 1, report.to_table()
            assert errors(report) == {(other, c) for c in expected}, report.to_table()
            assert not report.warnings, report.to_table()
            table = report.to_table()
            for component in expected:
                assert component in table


def test_fingerprint_rows_show_the_differing_values(qwen3_model_dir: Path, base_replica: str) -> None:
    with replica(qwen3_model_dir, max_model_len=4096, reasoning_parser=None) as other:
        report = run_audit([base_replica, other], [], local=None)
    rows = {f.component: f for f in report.findings if f.peer == other}
    assert rows["max_model_len"].ours == "8192" and rows["max_model_len"].theirs == "4096"
    assert '"reasoning_parser":"qwen3"' in rows["parsers"].ours
    assert '"reasoning_parser":null' in rows["parsers"].theirs
    assert rows["chat_template"].severity == "ok"


def test_render_replica_path_only_difference_is_a_warning_against_local(
    qwen3_model_dir: Path, base_replica: str, tmp_path: Path
) -> None:
    """The same model folder elsewhere: a warning against the local configuration (replicas compared with
    each other would refuse each other's derender calls, so there it is an error)."""
    copy_dir = tmp_path / qwen3_model_dir.name
    copy_dir.mkdir()
    for item in qwen3_model_dir.iterdir():
        (copy_dir / item.name).write_bytes(item.read_bytes())
    settings = settings_for(copy_dir)
    report = run_audit([base_replica], [], local=(settings, load_model(settings)))
    assert report.exit_code == 0, report.to_table()
    assert {(f.component, f.severity) for f in report.warnings} >= {("model", "warning"), ("fingerprint", "warning")}
    assert report.strict_exit_code() == 1
    with replica(copy_dir) as other:
        report = run_audit([base_replica, other], [], local=None)
    assert errors(report) == {(other, "model"), (other, "fingerprint")}, report.to_table()


def test_api_key(qwen3_model_dir: Path, local: tuple[Settings, Model], root: str) -> None:
    with replica(qwen3_model_dir, api_key="sekret") as keyed:
        report = run_audit([keyed], [], local=local)
        assert report.exit_code == 2
        assert "--api-key" in report.to_table()
        assert run_audit([keyed], [], local=local, api_key="sekret").exit_code == 0


# -- fake engines ------------------------------------------------------------------------------------


def fake_engine(
    root: str,
    *,
    version: str = "0.33.0",
    served: tuple[str, ...] = ("tinyqwen3",),
    max_model_len: int = 8192,
    token: int = 42,
    generate_status: int | None = None,
    seen: list[dict[str, Any]] | None = None,
) -> Starlette:
    """Answers like vLLM 0.33 `vllm serve --tokens-only` (no tokenizer, no /server_info)."""
    no_tokenizer = {
        "error": {
            "message": "Tokenizer not available when `skip_tokenizer_init=True`",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }

    async def version_route(request: Request) -> JSONResponse:
        return JSONResponse({"version": version})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "root": root, "parent": None, "max_model_len": max_model_len}
                    for name in served
                ],
            }
        )

    async def tokenizer_routes(request: Request) -> JSONResponse:
        return JSONResponse(no_tokenizer, status_code=400)

    def error(status: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
        )

    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        if seen is not None:
            seen.append(body)
        if generate_status == 403:
            return error(403, "PermissionDeniedError", "Scale-out endpoints are disabled.")
        if body.get("model") and body["model"] not in served:
            return error(404, "NotFoundError", f"The model `{body['model']}` does not exist.")
        sampling = body["sampling_params"]
        if sampling.get("stop"):
            return error(400, "BadRequestError", "stop strings need a tokenizer")
        count = len(body["token_ids"])
        if count + sampling.get("max_tokens", 1) > max_model_len:
            return error(
                400,
                "BadRequestError",
                f"The decoder prompt (length {count}) plus the number of requested "
                f"output tokens (at least 1) is longer than the maximum model length "
                f"of {max_model_len}.",
            )
        return JSONResponse(
            {
                "request_id": "generate-tokens-" + body["request_id"],
                "model": body.get("model"),
                "usage": {"prompt_tokens": count, "completion_tokens": 1, "total_tokens": count + 1},
                "output_mode": "tokens",
                "choices": [
                    {"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": [token], "logprobs": None}
                ],
            }
        )

    return Starlette(
        routes=[
            Route("/version", version_route),
            Route("/v1/models", models),
            Route("/tokenizer_info", tokenizer_routes),
            Route("/tokenize", tokenizer_routes, methods=["POST"]),
            Route("/inference/v1/generate", generate, methods=["POST"]),
        ]
    )


def test_matching_engine_is_probed_for_real(local: tuple[Settings, Model], root: str) -> None:
    seen: list[dict[str, Any]] = []
    with app_server(fake_engine(root, seen=seen)) as engine:
        report = run_audit([], [engine], local=local)
    assert report.exit_code == 0, report.to_table()
    rows = {f.component: f for f in report.findings}
    assert rows["generate_probe"].severity == "ok"
    assert rows["long_prompt_probe"].severity == "ok"
    assert rows["tokenizer"].severity == "info" and report.peers[engine]["tokens_only"] is True
    short, long = seen
    assert short["model"] == "tinyqwen3" and short["sampling_params"]["max_tokens"] == 1
    assert short["sampling_params"]["temperature"] == 0.0
    assert short["token_ids"][:2] == [151644, 8948]  # <|im_start|>system: this render's own ids
    assert len(long["token_ids"]) == 8191 and long["sampling_params"]["max_tokens"] == 1
    assert max(long["token_ids"]) < local[1].vocab_size


@pytest.mark.parametrize(
    "version, severity", [("0.33.0", "ok"), ("0.32.0", "info"), ("0.33.1", "info"), ("0.30.1", "warning")]
)
def test_engine_versions(version: str, severity: str, local: tuple[Settings, Model], root: str) -> None:
    with app_server(fake_engine(root, version=version)) as engine:
        report = run_audit([], [engine], local=local, long_probe=False)
    row = next(f for f in report.findings if f.component == "vllm_version")
    assert (row.severity, row.theirs) == (severity, version)
    assert report.exit_code == 0
    assert report.strict_exit_code() == (1 if severity == "warning" else 0)


@pytest.mark.parametrize(
    "kwargs, components",
    [
        ({"max_model_len": 4096}, {"max_model_len", "long_prompt_probe"}),
        ({"served": ("other",)}, {"served_model_names"}),
        ({"generate_status": 403}, {"generate_endpoint"}),
    ],
)
def test_engine_mismatches(
    kwargs: dict[str, Any], components: set[str], local: tuple[Settings, Model], root: str
) -> None:
    with app_server(fake_engine(root, **kwargs)) as engine:
        report = run_audit([], [engine], local=local)
    assert report.exit_code == 1
    assert errors(report) == {(engine, c) for c in components}, report.to_table()


def test_shorter_engine_found_by_the_long_probe_alone(local: tuple[Settings, Model], root: str) -> None:
    """An engine whose /v1/models claims our max_model_len but rejects a max_model_len - 1 prompt."""
    app = fake_engine(root, max_model_len=4096)
    real = fake_engine(root, max_model_len=8192)
    app.router.routes[1] = real.router.routes[1]  # /v1/models says 8192
    with app_server(app) as engine:
        report = run_audit([], [engine], local=local)
    assert errors(report) == {(engine, "max_model_len"), (engine, "long_prompt_probe")}, report.to_table()
    assert "8191" in report.to_table()


def test_engines_compared_with_each_other(local: tuple[Settings, Model], root: str) -> None:
    with (
        app_server(fake_engine(root, token=42)) as one,
        app_server(fake_engine(root, token=42)) as two,
        app_server(fake_engine(root, token=7)) as three,
    ):
        report = run_audit([], [one, two, three], local=local, long_probe=False)
    assert errors(report) == {(three, "greedy_token")}, report.to_table()
    row = next(f for f in report.findings if f.component == "greedy_token" and f.peer == three)
    assert (row.ours, row.theirs) == ("42", "7")


def test_engines_without_reference(local: tuple[Settings, Model], root: str) -> None:
    with app_server(fake_engine(root)) as engine:
        report = run_audit([], [engine], local=None)
    assert report.exit_code == 0, report.to_table()
    assert any(f.component == "generate_probe" and f.severity == "info" for f in report.findings)


def test_reference_from_a_replica_probes_engines(base_replica: str, root: str) -> None:
    seen: list[dict[str, Any]] = []
    with app_server(fake_engine(root, seen=seen)) as engine:
        report = run_audit([base_replica], [engine], local=None)
    assert report.exit_code == 0, report.to_table()
    assert len(seen) == 2 and len(seen[1]["token_ids"]) == 8191


def test_unreachable(local: tuple[Settings, Model], root: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    report = run_audit([], [dead], local=local, timeout=1)
    assert report.exit_code == 2
    assert report.unreachable[0].peer == dead
    with app_server(fake_engine(root, max_model_len=4096)) as engine:
        report = run_audit([dead], [engine], local=local, timeout=1)
    assert report.exit_code == 1  # a mismatch that was found wins over an unreachable peer
    assert {f.peer for f in report.unreachable} == {dead}


# -- report formats ----------------------------------------------------------------------------------


def test_table_and_json() -> None:
    report = AuditReport(
        reference="local (m)",
        findings=[
            Finding("http://a", "max_model_len", "8192", "4096", "error", "lengths differ"),
            Finding("http://a", "vllm_version", "0.33.0", "0.33.0", "ok"),
        ],
        peers={"http://a": {"role": "engine"}},
    )
    table = report.to_table()
    lines = table.splitlines()
    assert lines[0] == "render-service audit: reference = local (m)"
    assert lines[2].split() == ["STATUS", "PEER", "COMPONENT", "OURS", "THEIRS"]
    assert lines[4].split() == ["ERROR", "http://a", "max_model_len", "8192", "4096"]
    assert "[error] http://a max_model_len: lengths differ" in table
    assert table.endswith("-> exit code 1")
    data = json.loads(report.to_json())
    assert data["exit_code"] == 1 and data["summary"]["error"] == 1
    assert data["findings"][0] == {
        "peer": "http://a",
        "component": "max_model_len",
        "ours": "8192",
        "theirs": "4096",
        "severity": "error",
        "detail": "lengths differ",
    }


# -- endpoints files ---------------------------------------------------------------------------------


def test_endpoints_json_and_yaml(tmp_path: Path) -> None:
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"render": ["http://r1:8000/", "r2:8000"], "engines": ["http://e1:8000"]}))
    assert load_endpoints(path) == (["http://r1:8000", "http://r2:8000"], ["http://e1:8000"])
    path = tmp_path / "e.yaml"
    path.write_text(
        "render:\n  - http://r1:8000\nengines:\n  - http://e1:8000\n  - http://e2:8000\n"
        "---\n- url: http://r3:8000\n  role: render\n"
    )
    assert load_endpoints(path) == (["http://r1:8000", "http://r3:8000"], ["http://e1:8000", "http://e2:8000"])


def test_endpoints_kubernetes_objects(tmp_path: Path) -> None:
    path = tmp_path / "k8s.yaml"
    path.write_text("""
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Endpoints
  metadata: {name: vllm-render}
  subsets:
  - addresses: [{ip: 10.0.0.1}, {ip: 10.0.0.2}]
    notReadyAddresses: [{ip: 10.0.0.9}]
    ports: [{name: metrics, port: 9090}, {name: http, port: 8000}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: decode-abcde
    labels: {kubernetes.io/service-name: decode}
  addressType: IPv6
  endpoints:
  - addresses: ["fd00::1"]
    conditions: {ready: true}
  - addresses: ["fd00::2"]
    conditions: {ready: false}
  ports: [{name: https, port: 8443}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: pool-xyz
    labels: {render-service/role: render}
  endpoints: [{addresses: [10.1.0.5]}]
  ports: [{port: 8200}]
""")
    render, engines = load_endpoints(path)
    assert render == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.1.0.5:8200"]
    assert engines == ["https://[fd00::1]:8443"]


@pytest.mark.parametrize(
    "text",
    [
        '["http://x:1"]',
        "render: [{kind: Endpoints, subsets: [{addresses: []}]}]",
        '{"url": "http://x", "role": "router"}',
        "42",
    ],
)
def test_endpoints_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(EndpointsFileError):
        load_endpoints(path)


# -- continuous audit ---------------------------------------------------------------------------------


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_continuous_audit_gauges_and_health(
    qwen3_model_dir: Path, base_replica: str, local: tuple[Settings, Model]
) -> None:
    registry = CollectorRegistry()
    with replica(qwen3_model_dir, max_model_len=4096) as short:
        audit = ContinuousAudit([short], [], local=local, registry=registry, interval=3600, unhealthy_after=2)
        assert audit.healthy  # nothing known yet: readiness is not blocked at start
        audit.run_once()
        assert sample(registry, "render_config_mismatch", peer=short, component="max_model_len") == 1
        assert sample(registry, "render_config_mismatch", peer=short, component="chat_template") == 0
        assert sample(registry, "render_audit_peer_reachable", peer=short) == 1
        assert audit.healthy  # one failing audit of two allowed
        audit.run_once()
        assert not audit.healthy
        assert time.time() - sample(registry, "render_last_audit_timestamp_seconds") < 60
        # The mismatched replica is replaced by a matching one: its series go to 0 and readiness recovers.
        audit.render_urls = [base_replica]
        audit.run_once()
    assert audit.healthy
    assert sample(registry, "render_config_mismatch", peer=short, component="max_model_len") == 0
    assert sample(registry, "render_config_mismatch", peer=base_replica, component="max_model_len") == 0


def test_continuous_audit_thread(local: tuple[Settings, Model], root: str) -> None:
    registry = CollectorRegistry()
    reports: list[AuditReport] = []
    with app_server(fake_engine(root, max_model_len=4096)) as engine:
        with ContinuousAudit(
            [], [engine], local=local, registry=registry, interval=0.2, on_report=reports.append
        ) as audit:
            deadline = time.monotonic() + 60
            while len(reports) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(reports) >= 2
        assert not audit.healthy
        assert sample(registry, "render_config_mismatch", peer=engine, component="max_model_len") == 1
        # The long probe is off in continuous mode: only short generate probes were sent.
        assert sample(registry, "render_config_mismatch", peer=engine, component="long_prompt_probe") is None


# -- CLI ---------------------------------------------------------------------------------------------


def test_cli(
    qwen3_model_dir: Path, base_replica: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], root: str
) -> None:
    assert main_audit([]) == 3
    assert main_audit(["--endpoints", str(tmp_path / "missing.json")]) == 3
    with ExitStack() as stack:
        short = stack.enter_context(replica(qwen3_model_dir, max_model_len=4096))
        engine = stack.enter_context(app_server(fake_engine(root)))
        capsys.readouterr()
        assert main_audit(["--render", f"{base_replica},{short}", "--json"]) == 1
        data = json.loads(capsys.readouterr().out)
        assert data["exit_code"] == 1
        assert {(f["peer"], f["component"]) for f in data["findings"] if f["severity"] == "error"} == {
            (short, "max_model_len"),
            (short, "fingerprint"),
        }
        endpoints = tmp_path / "endpoints.json"
        endpoints.write_text(json.dumps({"render": [base_replica], "engines": [engine]}))
        code = main_audit(["--endpoints", str(endpoints), str(qwen3_model_dir), *BASE_FLAGS])
        out = capsys.readouterr().out
        assert code == 0, out
        assert out.startswith(f"render-service audit: reference = local ({qwen3_model_dir})")
        assert "generate_probe" in out and out.rstrip().endswith("-> exit code 0")
        assert main_audit(["--engine", engine, "--strict", str(qwen3_model_dir), *BASE_FLAGS]) == 0
        assert main_audit(["--engine", engine, str(qwen3_model_dir), "--max-model-len", "4096"]) == 1


def test_template_history_probe_runs_once_per_configuration(
    qwen3_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The continuous audit re-runs every interval; the template's verdict cannot change, so the
    render context behind the probe is built once per configuration, not once per interval."""
    from render_service.audit import audit
    from render_service.render import pipeline

    settings = Settings(model=str(qwen3_model_dir), served_model_name=["tinyqwen3"]).validate()
    model = load_model(settings)
    built: list[Settings] = []
    make_context = pipeline.make_context
    monkeypatch.setattr(pipeline, "make_context", lambda m, s: built.append(s) or make_context(m, s))
    reports = [audit.run_audit([], [], local=(settings, model)) for _ in range(3)]
    assert len(built) == 1
    notes = [[(f.severity, f.ours) for f in r.findings if f.component == "template_history"] for r in reports]
    assert notes[0] == notes[1] == notes[2] != []
    other = Settings(model=str(qwen3_model_dir), served_model_name=["tinyqwen3"]).validate()
    audit.run_audit([], [], local=(other, model))
    assert len(built) == 2  # a new configuration is probed again
