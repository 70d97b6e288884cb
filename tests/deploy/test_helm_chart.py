"""The Helm chart, validated without a cluster.

`helm lint` and `helm template` run through helm-python-sdk (Helm's Go SDK over ctypes: no helm
binary); every rendered object is checked against the Kubernetes JSON schemas with
kubernetes-validate (strict: unknown fields fail); then the rendered objects are asserted on, for
several values combinations. The container's environment is also fed to the service's own
argument parser, so what the chart sets is what `render-service serve` accepts.

Skips cleanly when helm-python-sdk, kubernetes-validate or PyYAML is not installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

try:  # the native library can fail to load (another platform) with more than ImportError
    import helm_python as helm
except Exception as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"helm-python-sdk unavailable: {exc}", allow_module_level=True)
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
kv_utils = pytest.importorskip("kubernetes_validate.utils")
yaml = pytest.importorskip("yaml", reason="PyYAML not installed")

from render_service.settings import (  # noqa: E402
    add_model_arguments,
    add_server_arguments,
    apply_environment,
    settings_from_args,
)

CHART = Path(__file__).resolve().parents[2] / "helm" / "render-service"
RELEASE = "demo"
NAMESPACE = "llm"
FULLNAME = "demo-render-service"
# The newest schemas kubernetes-validate ships, and the oldest version the chart supports.
KUBE_LATEST = kv_utils.latest_version()
KUBE_OLDEST = "1.25.0"

MODEL = {"model": {"name": "Qwen/Qwen3-8B"}}
TEMPLATE = (
    "{%- for message in messages %}\n"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}\n"
)

CASES: dict[str, dict[str, Any]] = {
    "defaults": MODEL,
    "redis-in-cluster": {
        **MODEL,
        "redis": {"inCluster": {"enabled": True, "auth": {"existingSecret": "redis-auth"}}},
        "snapshotKey": {"existingSecret": "render-snapshot-key"},
    },
    "redis-external": {
        **MODEL,
        "redis": {"external": {"existingSecret": "render-redis", "existingSecretKey": "url"}},
        "snapshotKey": {"existingSecret": "render-snapshot-key", "key": "hmac"},
    },
    "autoscaling-off": {
        **MODEL,
        "autoscaling": {"enabled": False},
        "replicaCount": 3,
        "podDisruptionBudget": {"minAvailable": 2},
        "podAntiAffinity": {"type": "hard"},
    },
    "servicemonitor": {
        **MODEL,
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "interval": "15s"},
    },
    "chat-template": {
        **MODEL,
        "chatTemplate": {"override": TEMPLATE},
        "defaultChatTemplateKwargs": {"enable_thinking": False},
    },
    "api-key-and-audit": {
        **MODEL,
        "apiKey": {"existingSecret": "render-api-key", "key": "token"},
        "audit": {
            "enabled": True,
            "engines": ["http://qwen3-engine-a:8000", "http://qwen3-engine-b:8000"],
            "extraArgs": ["--strict"],
        },
        "podAntiAffinity": {"type": "soft"},
    },
    "https-mtls": {
        **MODEL,
        "tls": {
            "enabled": True,
            "existingSecret": "render-tls",
            "caKey": "ca.crt",
            "caSecret": "client-ca",
            "certReqs": 2,
            "ciphers": "ECDHE+AESGCM",
        },
    },
    "https-audit-servicemonitor": {
        **MODEL,
        "tls": {"enabled": True, "existingSecret": "render-tls", "caKey": "ca.crt"},
        "audit": {"enabled": True, "engines": ["http://qwen3-engine:8000"]},
        "serviceMonitor": {"enabled": True, "tlsConfig": {"ca": {"secret": {"name": "render-tls", "key": "ca.crt"}}}},
    },
    "redis-sentinel-tls": {
        **MODEL,
        "redis": {
            "external": {
                "existingSecret": "render-redis",
                "sentinel": {
                    "hosts": ["redis-node-0.redis-headless:26379", "redis-node-1.redis-headless:26379"],
                    "masterName": "mymaster",
                    "password": {"existingSecret": "redis-sentinel-auth"},
                },
                "tls": {"existingSecret": "redis-client-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
            }
        },
        "snapshotKey": {"existingSecret": "render-snapshot-key"},
        "config": {"mmCacheRedis": True},
    },
    "redis-cluster": {
        **MODEL,
        "redis": {"external": {"url": "redis://redis-cluster.cache.svc:6379", "cluster": True}},
        "snapshotKey": {"existingSecret": "render-snapshot-key"},
    },
    "local-model-every-flag": {
        "model": {
            "name": "/models/qwen3",
            "offline": True,
            "volume": {"persistentVolumeClaim": {"claimName": "qwen3-files", "readOnly": True}},
        },
        "config": {
            "servedModelName": ["qwen3", "Qwen/Qwen3-8B"],
            "tokenizer": "/models/qwen3",
            "revision": "main",
            "tokenizerRevision": "main",
            "trustRemoteCode": True,
            "chatTemplateContentFormat": "openai",
            "cohereFormat": "cmd3",
            "trustRequestChatTemplate": True,
            "reasoningParser": "qwen3",
            "toolCallParser": "hermes",
            "enableAutoToolChoice": True,
            "excludeToolsWhenToolChoiceNone": True,
            "maxModelLen": "32k",
            "generationConfig": "vllm",
            "overrideGenerationConfig": {"temperature": 0.6, "max_new_tokens": 512},
            "maxLogprobs": 5,
            "tokenizerBackend": "hf",
            "maxRequestBodyBytes": 16777216,
            "streamStateMode": "compact",
            "snapshotTtlSeconds": 120,
            "logLevel": "warning",
            "workers": 2,
            "maxInflight": 64,
            "auditEngine": ["http://qwen3-engine-a:8000", "http://qwen3-engine-b:8000"],
            "auditRender": ["http://vllm-render:8000"],
            "auditInterval": 30.5,
            "auditGatesReadiness": True,
        },
        "chatTemplate": {"path": "/models/qwen3/chat_template.jinja"},
        "defaultChatTemplateKwargs": {"enable_thinking": False},
        "redis": {"external": {"url": "redis://snapshots.cache.svc:6379/2"}},
        "snapshotKey": {"existingSecret": "render-snapshot-key"},
        "extraArgs": ["--log-level", "info"],
        "extraEnv": [{"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}],
        "shutdown": {"preStopSleepSeconds": 15, "terminationGracePeriodSeconds": 60, "nativeSleepAction": True},
        "image": {"repository": "registry.example/render-service", "digest": "sha256:" + "ab" * 32},
    },
}


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def chart():
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


def render(chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


@pytest.fixture(scope="module")
def rendered(chart) -> dict[str, list[dict[str, Any]]]:
    return {name: render(chart, values) for name, values in CASES.items()}


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def render_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "render-service")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or the valueFrom dict."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def resolved_env(container: dict[str, Any], secrets: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the process would see: secret/ConfigMap refs filled in, $(VAR) expanded in
    order as the kubelet does."""
    secrets = secrets or {}
    result: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: result.get(m.group(1), m.group(0)), entry["value"])
        else:
            ref = entry["valueFrom"]
            key = ref.get("secretKeyRef") or ref.get("configMapKeyRef")
            value = secrets[f"{key['name']}/{key['key']}"]
        result[entry["name"]] = value
    return result


def serve_parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="render-service serve")
    add_model_arguments(parser)
    add_server_arguments(parser)
    apply_environment(parser, environ)
    return parser


def settings_for(container: dict[str, Any], secrets: dict[str, str] | None = None):
    """What `render-service serve` makes of the container's env and args (the image's entrypoint)."""
    environ = resolved_env(container, secrets)
    args = serve_parser(environ).parse_args(container.get("args", []))
    return settings_from_args(args)


def camel(dest: str) -> str:
    head, *rest = dest.split("_")
    return head + "".join(word.capitalize() for word in rest)


# ---------------------------------------------------------------------------------------------
# lint and schemas


@pytest.mark.parametrize("case", sorted(CASES))
def test_helm_lint_strict(case):
    report = helm.lint(CHART, copy.deepcopy(CASES[case]), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_objects_match_kubernetes_schemas(rendered, case):
    checked = []
    versions = [KUBE_LATEST] if case == "local-model-every-flag" else [KUBE_LATEST, KUBE_OLDEST]
    for obj in rendered[case]:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            # A CRD: kubernetes-validate has no schema for it; the ServiceMonitor test checks it.
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: {path}: {exc.message}")
        checked.append(obj["kind"])
    assert "Deployment" in checked and "Service" in checked


def test_every_object_is_labelled_and_named_for_the_release(rendered):
    for case, objects in rendered.items():
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == RELEASE, (case, obj["kind"])
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert obj["metadata"]["name"].startswith(FULLNAME), (case, obj["metadata"]["name"])


# ---------------------------------------------------------------------------------------------
# defaults


def test_defaults_render_the_core_objects(rendered):
    assert kinds(rendered["defaults"]) == [
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]


def test_defaults_container_env_probes_and_security(rendered):
    objects = rendered["defaults"]
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = render_container(objects)

    assert env_of(container) == {"RENDER_MODEL": "Qwen/Qwen3-8B", "RENDER_HOST": "0.0.0.0", "RENDER_PORT": "8000"}
    assert "args" not in container and container["image"] == "render-service:0.1.0"
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    # The startup probe allows a model download (10 min); readiness reacts within seconds.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert container["readinessProbe"]["periodSeconds"] <= 5

    # Drain: preStop sleep, then uvicorn's 30 s graceful shutdown, inside the grace period.
    assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "10"]}}
    assert pod["terminationGracePeriodSeconds"] >= 10 + 30

    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "hf-cache": "/var/cache/huggingface"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(volumes) == {"tmp", "hf-cache"} and "emptyDir" in volumes["hf-cache"]
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"] == "1"

    # The HPA owns the replica count; rollouts add pods before removing any.
    assert "replicas" not in deployment["spec"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "annotations" not in deployment["spec"]["template"]["metadata"]

    settings = settings_for(container)
    assert settings.model == "Qwen/Qwen3-8B" and settings.port == 8000 and settings.host == "0.0.0.0"
    assert settings.redis_url is None and settings.api_key is None


def test_defaults_service_hpa_pdb_and_spread_select_the_render_pods(rendered):
    objects = rendered["defaults"]
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()

    service = one(objects, "Service")
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    ]

    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    assert hpa["spec"]["metrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}
    ]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300

    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}

    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    assert all(c["labelSelector"] == {"matchLabels": selector} for c in spread)
    assert "affinity" not in deployment["spec"]["template"]["spec"]


# Serve flags the chart sets from other values than `config.<flag>`.
FLAGS_SET_ELSEWHERE = {
    "model": ("model", "name"),
    "host": None,
    "port": ("containerPort",),
    "api_key": ("apiKey", "existingSecret"),
    "snapshot_key": ("snapshotKey", "existingSecret"),
    "redis_url": ("redis", "external", "url"),
    "chat_template": ("chatTemplate", "override"),
    "default_chat_template_kwargs": ("defaultChatTemplateKwargs",),
    "redis_cluster": ("redis", "external", "cluster"),
    "redis_sentinel": ("redis", "external", "sentinel", "hosts"),
    "redis_sentinel_master": ("redis", "external", "sentinel", "masterName"),
    "redis_sentinel_password": ("redis", "external", "sentinel", "password", "existingSecret"),
    "redis_ssl_ca_certs": ("redis", "external", "tls", "caKey"),
    "redis_ssl_certfile": ("redis", "external", "tls", "certKey"),
    "redis_ssl_keyfile": ("redis", "external", "tls", "keyKey"),
    "ssl_certfile": ("tls", "certKey"),
    "ssl_keyfile": ("tls", "keyKey"),
    "ssl_ca_certs": ("tls", "caKey"),
    "ssl_cert_reqs": ("tls", "certReqs"),
    "ssl_ciphers": ("tls", "ciphers"),
    "enable_ssl_refresh": ("tls", "refresh"),
}


def serve_flags() -> list[argparse.Action]:
    return [a for a in serve_parser({})._actions if a.option_strings and a.dest != "help"]


def sample_value(action: argparse.Action) -> Any:
    """A non-default value of the flag's type, as it would be written in values.yaml."""
    if action.nargs == 0:
        return True
    if isinstance(action, argparse._AppendAction):
        return ["sample-a", "sample-b"]
    if action.choices:
        return [c for c in action.choices if c != action.default][-1]
    if isinstance(action.default, dict):
        return {"sample": 1}
    if action.nargs in ("+", "*"):
        return ["sample-a", "sample-b"]
    if action.type is not None:
        try:
            action.type("7")
            return 7
        except Exception:
            pass
    return "sample"


def test_every_serve_flag_can_be_set_from_values(chart):
    """Every flag `render-service serve` has (today's and any added later) reaches the service when
    set as config.<camelCaseName> (or through the value listed in FLAGS_SET_ELSEWHERE)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in FLAGS_SET_ELSEWHERE.values():
        node: Any = values
        for key in path or ():
            node = node[key]  # the documented value exists
    flags = [a for a in serve_flags() if a.dest not in FLAGS_SET_ELSEWHERE]
    config = {camel(a.dest): sample_value(a) for a in flags}
    objects = render(chart, {**MODEL, "config": config})
    container = render_container(objects)
    args = serve_parser(resolved_env(container)).parse_args(container.get("args", []))
    wrong = {
        a.dest: (getattr(args, a.dest), config[camel(a.dest)])
        for a in flags
        if getattr(args, a.dest) != config[camel(a.dest)]
    }
    assert not wrong, f"flags that do not reach the service as set: {wrong}"


def test_values_document_the_serve_flags():
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    for key in values["config"]:
        assert re.search(rf"\n  # -- [^\n]*\n(?:  # [^\n]*\n)*  {key}:", text), (
            f"config.{key} is not documented in values.yaml"
        )
    undocumented = [
        f"--{a.dest.replace('_', '-')} (config.{camel(a.dest)})"
        for a in serve_flags()
        if a.dest not in FLAGS_SET_ELSEWHERE and camel(a.dest) not in values["config"]
    ]
    assert not undocumented, f"serve flags not documented in values.yaml: {undocumented}"


# ---------------------------------------------------------------------------------------------
# the other combinations


def test_every_flag_reaches_the_service_as_configured(rendered):
    objects = rendered["local-model-every-flag"]
    container = render_container(objects)
    env = env_of(container)
    assert env["RENDER_MAX_MODEL_LEN"] == "32k"
    assert env["RENDER_MAX_REQUEST_BODY_BYTES"] == "16777216"  # not 1.6777216e+07
    assert env["RENDER_SERVED_MODEL_NAME"] == "qwen3 Qwen/Qwen3-8B"
    assert json.loads(env["RENDER_OVERRIDE_GENERATION_CONFIG"]) == {"temperature": 0.6, "max_new_tokens": 512}
    assert env["RENDER_AUDIT_INTERVAL"] == "30.5" and env["RENDER_WORKERS"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert env["RENDER_CHAT_TEMPLATE"] == "/models/qwen3/chat_template.jinja"
    assert env["RENDER_REDIS_URL"] == "redis://snapshots.cache.svc:6379/2"
    # Repeatable flags go on the command line, one flag per item, before extraArgs.
    assert "RENDER_AUDIT_ENGINE" not in env and "RENDER_AUDIT_RENDER" not in env
    assert container["args"] == [
        "--audit-engine",
        "http://qwen3-engine-a:8000",
        "--audit-engine",
        "http://qwen3-engine-b:8000",
        "--audit-render",
        "http://vllm-render:8000",
        "--log-level",
        "info",
    ]
    # /health is 503 on an audit mismatch when it gates readiness: liveness must not use it.
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/version"
    assert container["image"] == "registry.example/render-service@sha256:" + "ab" * 32
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}

    configmap = one(objects, "ConfigMap")
    secrets = {
        f"{FULLNAME}/default_chat_template_kwargs.json": configmap["data"]["default_chat_template_kwargs.json"],
        "render-snapshot-key/snapshot-key": "k" * 64,
    }
    settings = settings_for(container, secrets)
    assert settings.model == "/models/qwen3" and settings.tokenizer == "/models/qwen3"
    assert settings.served_model_name == ["qwen3", "Qwen/Qwen3-8B"]
    assert (settings.revision, settings.tokenizer_revision) == ("main", "main")
    assert settings.trust_remote_code and settings.trust_request_chat_template
    assert settings.enable_auto_tool_choice and settings.exclude_tools_when_tool_choice_none
    assert (settings.reasoning_parser, settings.tool_call_parser) == ("qwen3", "hermes")
    assert settings.chat_template_content_format == "openai" and settings.cohere_format == "cmd3"
    assert settings.max_model_len == 32000
    assert settings.generation_config == "vllm"
    assert settings.override_generation_config == {"temperature": 0.6, "max_new_tokens": 512}
    assert settings.default_chat_template_kwargs == {"enable_thinking": False}
    assert settings.max_logprobs == 5 and settings.tokenizer_backend == "hf"
    assert settings.max_request_body_bytes == 16 << 20 and settings.snapshot_ttl_seconds == 120
    assert settings.stream_state_mode == "compact"
    assert settings.log_level == "info"  # the command-line flag wins over RENDER_LOG_LEVEL
    assert (settings.workers, settings.max_inflight) == (2, 64)
    assert settings.audit_engine == ["http://qwen3-engine-a:8000", "http://qwen3-engine-b:8000"]
    assert settings.audit_render == ["http://vllm-render:8000"]
    assert settings.audit_interval == 30.5 and settings.audit_gates_readiness is True
    assert settings.snapshot_key == "k" * 64 and settings.redis_url == "redis://snapshots.cache.svc:6379/2"

    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    model_volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model_volume["persistentVolumeClaim"]["claimName"] == "qwen3-files"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert pod["terminationGracePeriodSeconds"] == 60


def test_redis_in_cluster(rendered):
    objects = rendered["redis-in-cluster"]
    redis_name = f"{FULLNAME}-redis"
    redis = one(objects, "Deployment", redis_name)
    redis_service = one(objects, "Service", redis_name)
    redis_pod = redis["spec"]["template"]
    container = redis_pod["spec"]["containers"][0]
    assert container["image"] == "redis:7.4-alpine"
    assert "--maxmemory-policy" in container["command"] and "allkeys-lru" in container["command"]
    assert container["command"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis_service["spec"]["ports"][0]["port"] == 6379
    assert redis_service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()

    # The render Service must not select the Redis pod, nor the Redis Service the render pods.
    render_service = one(objects, "Service", FULLNAME)
    render_pod = one(objects, "Deployment", FULLNAME)["spec"]["template"]
    assert not render_service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()
    assert not redis_service["spec"]["selector"].items() <= render_pod["metadata"]["labels"].items()

    render = render_container(objects)
    names = [e["name"] for e in render["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("RENDER_REDIS_URL")
    env = env_of(render)
    assert env["RENDER_REDIS_URL"] == f"redis://:$(REDIS_PASSWORD)@{redis_name}:6379/0"
    assert env["RENDER_SNAPSHOT_KEY"] == {"secretKeyRef": {"name": "render-snapshot-key", "key": "snapshot-key"}}
    settings = settings_for(render, {"redis-auth/redis-password": "pw", "render-snapshot-key/snapshot-key": "s3cret"})
    assert settings.redis_url == f"redis://:pw@{redis_name}:6379/0" and settings.snapshot_key == "s3cret"


def test_redis_external_from_a_secret(rendered):
    objects = rendered["redis-external"]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-redis")]
    env = env_of(render_container(objects))
    assert env["RENDER_REDIS_URL"] == {"secretKeyRef": {"name": "render-redis", "key": "url"}}
    assert env["RENDER_SNAPSHOT_KEY"] == {"secretKeyRef": {"name": "render-snapshot-key", "key": "hmac"}}


def test_autoscaling_off(rendered):
    objects = rendered["autoscaling-off"]
    assert "HorizontalPodAutoscaler" not in kinds(objects)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_soft_anti_affinity(rendered):
    pod = one(rendered["api-key-and-audit"], "Deployment", FULLNAME)["spec"]["template"]["spec"]
    preferred = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["weight"] == 100 and preferred[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_servicemonitor(rendered):
    objects = rendered["servicemonitor"]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "scheme": "http", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert any(p["name"] == "http" for p in service["spec"]["ports"])


def test_chat_template_override_and_default_kwargs(chart, rendered):
    objects = rendered["chat-template"]
    configmap = one(objects, "ConfigMap")
    assert configmap["data"]["chat_template.jinja"] == TEMPLATE  # byte for byte, trailing newline included
    assert json.loads(configmap["data"]["default_chat_template_kwargs.json"]) == {"enable_thinking": False}

    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = render_container(objects)
    env = env_of(container)
    assert env["RENDER_CHAT_TEMPLATE"] == "/etc/render-service/chat-template/chat_template.jinja"
    assert env["RENDER_DEFAULT_CHAT_TEMPLATE_KWARGS"] == {
        "configMapKeyRef": {"name": FULLNAME, "key": "default_chat_template_kwargs.json"}
    }
    volume = next(v for v in pod["volumes"] if v["name"] == "chat-template")
    assert volume["configMap"] == {
        "name": FULLNAME,
        "items": [{"key": "chat_template.jinja", "path": "chat_template.jinja"}],
    }
    mount = next(m for m in container["volumeMounts"] if m["name"] == "chat-template")
    assert mount == {"name": "chat-template", "mountPath": "/etc/render-service/chat-template", "readOnly": True}

    settings = settings_for(
        container,
        {f"{FULLNAME}/default_chat_template_kwargs.json": configmap["data"]["default_chat_template_kwargs.json"]},
    )
    assert settings.chat_template == "/etc/render-service/chat-template/chat_template.jinja"
    assert settings.default_chat_template_kwargs == {"enable_thinking": False}

    # A template change rolls the pods (the ConfigMap's checksum is a pod annotation).
    checksum = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    changed = copy.deepcopy(CASES["chat-template"])
    changed["chatTemplate"]["override"] = TEMPLATE + "\n"
    other = one(render(chart, changed), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum) and other["checksum/config"] != checksum


def test_chat_template_from_an_existing_configmap(chart):
    objects = render(
        chart,
        {**MODEL, "chatTemplate": {"existingConfigMap": "qwen3-templates", "existingConfigMapKey": "tool_use.jinja"}},
    )
    assert "ConfigMap" not in kinds(objects)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "chat-template")
    assert volume["configMap"] == {
        "name": "qwen3-templates",
        "items": [{"key": "tool_use.jinja", "path": "chat_template.jinja"}],
    }
    assert env_of(render_container(objects))["RENDER_CHAT_TEMPLATE"].endswith("/chat_template.jinja")


def test_api_key_secret_and_audit_cronjob(rendered):
    objects = rendered["api-key-and-audit"]
    container = render_container(objects)
    assert env_of(container)["RENDER_API_KEY"] == {"secretKeyRef": {"name": "render-api-key", "key": "token"}}
    assert settings_for(container, {"render-api-key/token": "sk-test"}).api_key == "sk-test"

    cronjob = one(objects, "CronJob")
    job_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    audit = job_pod["containers"][0]
    assert audit["command"] == ["/usr/bin/tini", "--", "render-service", "audit"]
    assert audit["args"] == [
        "--render",
        f"http://{FULLNAME}:8000",
        "--engine",
        "http://qwen3-engine-a:8000",
        "--engine",
        "http://qwen3-engine-b:8000",
        "--strict",
    ]
    assert env_of(audit)["VLLM_API_KEY"] == {"secretKeyRef": {"name": "render-api-key", "key": "token"}}
    assert job_pod["restartPolicy"] == "Never" and cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    assert audit["securityContext"]["readOnlyRootFilesystem"] is True
    # The audit pod must not be selected by the render Service.
    service = one(objects, "Service")
    audit_labels = cronjob["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= audit_labels.items()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "model.name is required"),
        ({**MODEL, "redis": {"inCluster": {"enabled": True}}}, "snapshotKey.existingSecret"),
        (
            {
                **MODEL,
                "redis": {"inCluster": {"enabled": True}, "external": {"url": "redis://x:6379"}},
                "snapshotKey": {"existingSecret": "k"},
            },
            "not both",
        ),
        ({**MODEL, "chatTemplate": {"override": "x", "path": "/t.jinja"}}, "at most one of chatTemplate"),
        ({**MODEL, "config": {"enableAutoToolChoice": True}}, "needs config.toolCallParser"),
        (
            {**MODEL, "shutdown": {"preStopSleepSeconds": 10, "terminationGracePeriodSeconds": 30}},
            "terminationGracePeriodSeconds must be at least",
        ),
        ({**MODEL, "audit": {"enabled": True}}, "at least one engine"),
        ({**MODEL, "podAntiAffinity": {"type": "sometimes"}}, "podAntiAffinity.type"),
        ({**MODEL, "tls": {"enabled": True}}, "tls.enabled needs tls.existingSecret"),
        ({**MODEL, "tls": {"enabled": True, "existingSecret": "t", "certReqs": 3}}, "tls.certReqs must be 0"),
        ({**MODEL, "tls": {"enabled": True, "existingSecret": "t", "certReqs": 2}}, "needs tls.caKey"),
        (
            {
                **MODEL,
                "tls": {"enabled": True, "existingSecret": "t", "caKey": "ca.crt", "certReqs": 2},
                "audit": {"enabled": True, "engines": ["http://e:8000"]},
            },
            "cannot reach a service with tls.certReqs 2",
        ),
        (
            {
                **MODEL,
                "redis": {"external": {"sentinel": {"hosts": ["s:26379"]}}},
                "snapshotKey": {"existingSecret": "k"},
            },
            "needs redis.external.sentinel.masterName",
        ),
        (
            {
                **MODEL,
                "redis": {"external": {"url": "redis://r:6379", "sentinel": {"masterName": "m"}}},
                "snapshotKey": {"existingSecret": "k"},
            },
            "needs redis.external.sentinel.hosts",
        ),
        (
            {
                **MODEL,
                "redis": {"external": {"cluster": True, "sentinel": {"hosts": ["s:1"], "masterName": "m"}}},
                "snapshotKey": {"existingSecret": "k"},
            },
            "not both",
        ),
        (
            {
                **MODEL,
                "redis": {"inCluster": {"enabled": True}, "external": {"cluster": True}},
                "snapshotKey": {"existingSecret": "k"},
            },
            "apply to an external Redis",
        ),
        (
            {**MODEL, "redis": {"external": {"sentinel": {"hosts": ["s:1"], "masterName": "m"}}}},
            "snapshotKey.existingSecret",
        ),
    ],
)
def test_invalid_values_fail_the_render_with_a_message(chart, values, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_readme_values_examples_render_and_validate(chart):
    """The values files the chart's README shows install as written."""
    readme = (CHART / "README.md").read_text()
    blocks = {
        m.group(1): yaml.safe_load(m.group(2))
        for m in re.finditer(r"```yaml\n# (\S+\.yaml)[^\n]*\n(.*?)```", readme, re.S)
    }
    assert set(blocks) >= {"qwen3-render.yaml", "audit.yaml"}
    values = {**blocks["qwen3-render.yaml"], **blocks["audit.yaml"]}
    objects = render(chart, values)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_LATEST, strict=True)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "CronJob"} <= set(kinds(objects))
    env = env_of(render_container(objects))
    assert env["RENDER_MODEL"] == "/models/qwen3" and env["HF_HUB_OFFLINE"] == "1"


# ---------------------------------------------------------------------------------------------
# HTTPS on the service, and Redis as operators run it


def parsed_args(container: dict[str, Any], secrets: dict[str, str] | None = None) -> argparse.Namespace:
    """The serve flags as parsed from the container (the certificate files exist only in a pod, so
    the settings are not validated here: tests/test_settings.py does that with real files)."""
    return serve_parser(resolved_env(container, secrets)).parse_args(container.get("args", []))


def test_https_with_mutual_tls_mounts_the_secrets_and_probes_over_tcp(rendered):
    objects = rendered["https-mtls"]
    container = render_container(objects)
    args = parsed_args(container)
    assert (args.ssl_certfile, args.ssl_keyfile) == (
        "/etc/render-service/tls/tls.crt",
        "/etc/render-service/tls/tls.key",
    )
    assert args.ssl_ca_certs == "/etc/render-service/tls-ca/ca.crt"
    assert (args.ssl_cert_reqs, args.ssl_ciphers) == (2, "ECDHE+AESGCM")
    assert args.enable_ssl_refresh  # a renewed Secret is loaded without a restart
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"] == {
        "secretName": "render-tls",
        "defaultMode": 0o440,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert volumes["tls-ca"]["secret"]["secretName"] == "client-ca"
    assert volumes["tls-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/render-service/tls", "readOnly": True}
    assert mounts["tls-ca"]["mountPath"] == "/etc/render-service/tls-ca"
    # The kubelet has no client certificate: TCP checks (a worker listens once the model is loaded).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "http"} and "httpGet" not in container[probe], probe
    assert one(objects, "Service")["spec"]["ports"][0]["appProtocol"] == "https"


def test_https_probes_audit_and_servicemonitor(rendered):
    objects = rendered["https-audit-servicemonitor"]
    container = render_container(objects)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}, probe
    args = parsed_args(container)
    assert args.ssl_ca_certs == "/etc/render-service/tls-ca/ca.crt" and args.ssl_cert_reqs == 0
    audit = one(objects, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    job = audit["containers"][0]
    assert job["args"][:2] == ["--render", f"https://{FULLNAME}:8000"]
    assert env_of(job)["SSL_CERT_FILE"] == "/etc/render-service/tls-ca/ca.crt"  # httpx trusts it
    assert {"name": "tls-ca", "mountPath": "/etc/render-service/tls-ca", "readOnly": True} in job["volumeMounts"]
    assert next(v for v in audit["volumes"] if v["name"] == "tls-ca")["secret"]["secretName"] == "render-tls"
    endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "render-tls", "key": "ca.crt"}}}


def test_redis_sentinel_with_tls(rendered):
    objects = rendered["redis-sentinel-tls"]
    container = render_container(objects)
    env = env_of(container)
    assert env["RENDER_REDIS_SENTINEL_PASSWORD"] == {
        "secretKeyRef": {"name": "redis-sentinel-auth", "key": "sentinel-password"}
    }
    assert container["args"] == [
        "--redis-sentinel",
        "redis-node-0.redis-headless:26379",
        "--redis-sentinel",
        "redis-node-1.redis-headless:26379",
    ]
    secrets = {
        "render-redis/redis-url": "rediss://:pw@/0",
        "redis-sentinel-auth/sentinel-password": "sp",
        "render-snapshot-key/snapshot-key": "k",
    }
    args = parsed_args(container, secrets)
    assert args.redis_sentinel == ["redis-node-0.redis-headless:26379", "redis-node-1.redis-headless:26379"]
    assert (args.redis_sentinel_master, args.redis_sentinel_password) == ("mymaster", "sp")
    assert args.redis_url == "rediss://:pw@/0" and args.mm_cache_redis
    assert args.redis_ssl_ca_certs == "/etc/render-service/redis-tls/ca.crt"
    assert args.redis_ssl_certfile == "/etc/render-service/redis-tls/tls.crt"
    assert args.redis_ssl_keyfile == "/etc/render-service/redis-tls/tls.key"
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "redis-tls")
    assert volume["secret"]["items"] == [
        {"key": "ca.crt", "path": "ca.crt"},
        {"key": "tls.crt", "path": "tls.crt"},
        {"key": "tls.key", "path": "tls.key"},
    ]


def test_redis_cluster(rendered):
    container = render_container(rendered["redis-cluster"])
    settings = settings_for(container, {"render-snapshot-key/snapshot-key": "s3cret"})
    assert settings.redis_cluster and settings.redis_url == "redis://redis-cluster.cache.svc:6379"
