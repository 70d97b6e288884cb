"""The config fingerprint: exposed, stable, component-wise, and enforced on derender (409)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def make(model_dir: Path, **overrides) -> TestClient:
    values = dict(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=8192,
    )
    values.update(overrides)
    return TestClient(create_app(Settings(**values).validate()))


def test_config_endpoint_and_headers(qwen3_model_dir: Path) -> None:
    with make(qwen3_model_dir) as client:
        config = client.get("/v1/render/config").json()
        assert len(config["fingerprint"]) == 32
        assert {
            "tokenizer_files",
            "chat_template",
            "parsers",
            "max_model_len",
            "generation_defaults",
            "served_model_names",
            "service_version",
        } <= set(config["components"])
        assert config["vllm_parity_version"] == "0.33.0"
        rendered = client.post("/v1/chat/completions/render", json=CHAT)
        assert rendered.headers["X-Render-Fingerprint"] == config["fingerprint"]
        assert "chat_template=" in rendered.headers["X-Render-Fingerprint-Components"]


def test_fingerprint_names_what_differs(qwen3_model_dir: Path) -> None:
    with make(qwen3_model_dir) as a, make(qwen3_model_dir, max_model_len=4096) as b, make(qwen3_model_dir) as same:
        fa, fb = a.get("/v1/render/config").json(), b.get("/v1/render/config").json()
        assert fa["fingerprint"] == same.get("/v1/render/config").json()["fingerprint"]
        assert fa["fingerprint"] != fb["fingerprint"]
        assert [k for k in fa["components"] if fa["components"][k] != fb["components"][k]] == ["max_model_len"]

        rendered = a.post("/v1/chat/completions/render", json=CHAT)
        headers = {
            "X-Render-Fingerprint": rendered.headers["X-Render-Fingerprint"],
            "X-Render-Fingerprint-Components": rendered.headers["X-Render-Fingerprint-Components"],
        }
        body = {
            "chat_request": CHAT,
            "prompt_token_ids": rendered.json()["token_ids"],
            "generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": [9707]}]},
        }
        assert a.post("/v1/chat/completions/derender", json=body, headers=headers).status_code == 200
        refused = b.post("/v1/chat/completions/derender", json=body, headers=headers)
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "fingerprint_mismatch"
        assert "differing components: max_model_len" in error["message"]


def test_stream_state_from_another_fingerprint_is_refused(qwen3_model_dir: Path) -> None:
    with make(qwen3_model_dir) as a, make(qwen3_model_dir, default_chat_template_kwargs={"x": 1}) as b:
        rendered = a.post("/v1/chat/completions/render", json=CHAT).json()
        body = {
            "stream": True,
            "chat_request": CHAT,
            "prompt_token_ids": rendered["token_ids"],
            "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [151667]}]},
        }
        state = a.post("/v1/chat/completions/derender", json=body).json()["stream_state"]
        assert state["rs_fp"]
        body["stream_state"] = state
        assert a.post("/v1/chat/completions/derender", json=body).status_code == 200
        assert b.post("/v1/chat/completions/derender", json=body).status_code == 409
        # A vLLM-produced state (no rs_fp) is accepted anywhere: it carries no claim.
        body["stream_state"] = {k: v for k, v in state.items() if not k.startswith("rs_")}
        assert b.post("/v1/chat/completions/derender", json=body).status_code == 200


def test_fingerprint_cli_matches_the_server(qwen3_model_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "render_service.cli",
            "fingerprint",
            str(qwen3_model_dir),
            "--served-model-name",
            "tinyqwen3",
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "hermes",
            "--enable-auto-tool-choice",
            "--max-model-len",
            "8192",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    with make(qwen3_model_dir) as client:
        assert printed["fingerprint"] == client.get("/v1/render/config").json()["fingerprint"]


def test_continuous_audit_exports_mismatches_and_gates_readiness(qwen3_model_dir: Path) -> None:
    import time

    from tests.helpers import metric, service

    with service(
        qwen3_model_dir,
        "--served-model-name",
        "tinyqwen3",
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--max-model-len",
        "4096",
    ) as peer:
        with make(qwen3_model_dir, audit_render=[peer], audit_interval=3600, audit_gates_readiness=True) as client:
            deadline = time.monotonic() + 120
            text = ""
            while time.monotonic() < deadline:
                text = client.get("/metrics").text
                if metric(text, "render_last_audit_timestamp_seconds") > 0:
                    break
                time.sleep(0.5)
            assert metric(text, "render_config_mismatch", peer=peer, component="max_model_len") == 1.0
            assert client.get("/health").status_code == 503


def test_image_processing_settings_are_a_component(qwen3_model_dir: Path, tmp_path: Path) -> None:
    from render_service.audit.fingerprint import fingerprint
    from render_service.model.example import build_example_model
    from render_service.model.loader import load_model

    vl_dir = build_example_model(tmp_path / "vl", "qwen3-vl")
    settings = Settings(model=str(vl_dir)).validate()
    model = load_model(settings)
    base = fingerprint(settings, model)
    limited = Settings(model=str(vl_dir), limit_mm_per_prompt={"image": 2}).validate()
    assert "multimodal" in base["components"]
    assert fingerprint(limited, model)["components"]["multimodal"] != base["components"]["multimodal"]
    text = Settings(model=str(qwen3_model_dir)).validate()
    assert "multimodal" not in fingerprint(text, load_model(text))["components"]  # text models unchanged
