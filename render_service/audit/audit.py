"""`render-service audit`: prove that render replicas and vLLM engines agree on their configuration.

vLLM has no handshake between render, derender and the engines: a mismatched chat template,
max_model_len, parser or generation default never errors, it silently changes the tokens or
the content/reasoning/tool_calls split. This module checks, over plain HTTP:

* **render replicas** (ours or vLLM's `vllm launch render`): the `/v1/render/config`
  fingerprint, component by component, where a replica exposes it; `/v1/models`,
  `/version`, `/tokenizer_info` and `/server_info` where exposed; and, for every replica
  (so vLLM's own render tier is checked too), behaviour: the same probe requests rendered,
  tokenized and derendered must give the same result as the reference.
* **engines**: `/v1/models` (served names, root, max_model_len), `/version` (is it a
  version this service's parity was verified against), `/tokenizer_info` and
  `/server_info` where exposed, `/tokenize` token-id parity where the engine has a
  tokenizer, and a real `/inference/v1/generate` probe (`max_tokens` 1, greedy) of the
  reference's own render, plus one prompt of exactly `max_model_len - 1` tokens. Engines
  serving the same model must produce the same greedy token.

The reference ("ours") is the local configuration when one is given (`run_audit(...,
local=(settings, model))`, or MODEL and serve flags on the command line), else the first
reachable render replica.

Exit codes: 0 all agree, 1 a mismatch (with `--strict`, warnings too), 2 an endpoint was
unreachable (and no mismatch was found), 3 the audit could not run (usage, model, file).

Safety: the probes only send token ids produced by the reference's tokenizer for short probe
texts. An id outside the engine's vocabulary crashes a vLLM 0.32 CPU engine (the embedding
raises IndexError and EngineCore dies: checked live), so ids are never invented.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from render_service import VLLM_VERSION, __version__
from render_service.model.loader import Model
from render_service.settings import Settings

logger = logging.getLogger("render_service.audit.audit")

# Engines whose /inference/v1/generate accepts this render's requests (0.32 ignores parse_context).
ACCEPTED_ENGINE_SERIES = {
    "0.33": None,
    "0.32": "0.32 ignores parse_context and derenders some edge "
    "cases differently; render requests are accepted (checked live)",
}

SEVERITIES = ("ok", "info", "warning", "error", "unreachable")
_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}

PROBE_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Say hello in French. Also: naïve café, 中文, 🙂."},
]
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Render probes (no `model`: every server accepts a missing one, so served names do not mask the rest).
RENDER_PROBES: dict[str, dict[str, Any]] = {
    "chat": {"messages": PROBE_MESSAGES},
    "tools": {"messages": TOOL_MESSAGES, "tools": PROBE_TOOLS},
    "tools_required": {"messages": TOOL_MESSAGES, "tools": PROBE_TOOLS, "tool_choice": "required"},
}
GENERATE_PROBE = {"messages": PROBE_MESSAGES, "max_tokens": 1, "temperature": 0}
TOKENIZE_TEXT = "Tokenizer probe: naïve café, 中文, 🙂, <think> tags </think> and 12345."
DERENDER_OUTPUT = (
    "<think>\nThe user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
)


# -- the report --------------------------------------------------------------------------------


@dataclass
class Finding:
    """One check of one component on one peer. `severity` is one of SEVERITIES."""

    peer: str
    component: str
    ours: str
    theirs: str
    severity: str
    detail: str = ""


@dataclass
class AuditReport:
    reference: str
    findings: list[Finding] = field(default_factory=list)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0

    @property
    def mismatches(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def unreachable(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "unreachable"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def exit_code(self) -> int:
        """0 all agree, 1 a mismatch, 2 an endpoint unreachable (a found mismatch wins)."""
        if self.mismatches:
            return 1
        if self.unreachable:
            return 2
        return 0

    def strict_exit_code(self) -> int:
        """Like `exit_code`, but warnings (unverified versions, paths that differ) fail too."""
        code = self.exit_code
        return 1 if code == 0 and self.warnings else code

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "reference": self.reference,
            "summary": self._summary(),
            "started": self.started,
            "duration_seconds": round(self.finished - self.started, 3),
            "peers": self.peers,
            "findings": [asdict(f) for f in self.findings],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, default=str)

    def _summary(self) -> dict[str, int]:
        counts = {name: 0 for name in SEVERITIES}
        for finding in self.findings:
            counts[finding.severity] += 1
        return counts

    def to_table(self, width: int = 34) -> str:
        """A fixed-width table for people, then the detail of every non-ok row."""
        header = ("STATUS", "PEER", "COMPONENT", "OURS", "THEIRS")
        rows = [
            (f.severity.upper(), f.peer, f.component, _clip(f.ours, width), _clip(f.theirs, width))
            for f in self.findings
        ]
        widths = [
            max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))
        ]
        lines = [f"render-service audit: reference = {self.reference}", ""]
        lines.append("  ".join(h.ljust(widths[i]) for i, h in enumerate(header)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        lines.extend("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows)
        notes = [f for f in self.findings if f.severity != "ok" and f.detail]
        if notes:
            lines += ["", "Details:"]
            lines.extend(f"  [{f.severity}] {f.peer} {f.component}: {f.detail}" for f in notes)
        counts = self._summary()
        lines += [
            "",
            f"{len(self.peers)} peers, {len(self.findings)} checks: {counts['ok']} ok, "
            f"{counts['error']} mismatched, {counts['unreachable']} unreachable, "
            f"{counts['warning']} warnings, {counts['info']} notes -> exit code {self.exit_code}",
        ]
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _brief(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


class _Collector:
    """Findings keyed by (peer, component): the worst severity wins, details are merged."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Finding] = {}

    def add(self, peer: str, component: str, ours: Any, theirs: Any, severity: str, detail: str = "") -> None:
        key = (peer, component)
        new = Finding(peer, component, _brief(ours), _brief(theirs), severity, detail)
        old = self.rows.get(key)
        if old is None:
            self.rows[key] = new
            return
        if _RANK[severity] > _RANK[old.severity]:
            if old.severity != "ok" and old.detail and old.detail not in detail:
                new.detail = f"{detail}; {old.detail}" if detail else old.detail
            self.rows[key] = new
        elif severity != "ok" and detail and detail not in old.detail:
            old.detail = f"{old.detail}; {detail}" if old.detail else detail

    def ok(self, peer: str, component: str, ours: Any, theirs: Any = None, detail: str = "") -> None:
        self.add(peer, component, ours, ours if theirs is None else theirs, "ok", detail)

    def check(
        self, peer: str, component: str, ours: Any, theirs: Any, detail: str = "", severity: str = "error"
    ) -> bool:
        if ours == theirs:
            self.ok(peer, component, ours, theirs)
            return True
        self.add(peer, component, ours, theirs, severity, detail)
        return False

    def findings(self) -> list[Finding]:
        return list(self.rows.values())


# -- HTTP ----------------------------------------------------------------------------------------


@dataclass
class _Resp:
    status: int | None
    body: Any = None
    text: str = ""
    error: str | None = None  # transport error (refused, timeout): the peer did not answer

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def message(self) -> str:
        if self.error:
            return self.error
        if isinstance(self.body, dict):
            error = self.body.get("error")
            if isinstance(error, dict) and error.get("message"):
                return f"{self.status}: {error['message']}"
            if isinstance(error, str):
                return f"{self.status}: {error}"
            if "detail" in self.body:
                return f"{self.status}: {self.body['detail']}"
        return f"{self.status}: {self.text[:300]}"


class _Peer:
    def __init__(self, url: str, client: httpx.Client, timeout: float) -> None:
        self.url = url
        self.client = client
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> _Resp:
        try:
            response = self.client.request(method, self.url + path, json=body, timeout=timeout or self.timeout)
        except httpx.TimeoutException as exc:
            return _Resp(None, error=f"no answer within {timeout or self.timeout:g}s ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            return _Resp(None, error=f"{type(exc).__name__}: {exc}")
        try:
            parsed = response.json()
        except ValueError:
            parsed = None
        return _Resp(response.status_code, parsed, response.text)

    def get(self, path: str) -> _Resp:
        return self.call("GET", path)

    def post(self, path: str, body: Any, timeout: float | None = None) -> _Resp:
        return self.call("POST", path, body, timeout)


def _normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


# -- the reference ("ours") ----------------------------------------------------------------------


class _Reference:
    """What the peers are compared with: the local configuration, or the first render replica."""

    label = "reference"
    fingerprint: dict[str, Any] | None = None
    served_names: list[str] | None = None
    root: str | None = None
    revision: str | None = None
    max_model_len: int | None = None
    max_logprobs: int | None = None
    reasoning_parser: str | None = None
    reasoning_parser_known = False
    generation: dict[str, Any] | None = None
    chat_template_sha: str | None = None
    vocab_size: int | None = None
    tokenizer_known = False

    def render(self, body: dict[str, Any]) -> _Resp:
        raise NotImplementedError

    def tokenize(self, body: dict[str, Any]) -> _Resp:
        raise NotImplementedError

    def derender(self, body: dict[str, Any]) -> _Resp:
        raise NotImplementedError


class _LocalReference(_Reference):
    def __init__(self, settings: Settings, model: Model) -> None:
        from render_service.audit.fingerprint import fingerprint
        from render_service.derender import pipeline as derender
        from render_service.render.pipeline import RenderContext
        from render_service.server.metrics import Metrics

        self.label = f"local ({settings.model})"
        self.settings = settings
        self.ctx = RenderContext(model, settings)
        local_print = {
            **fingerprint(settings, model),
            "vllm_parity_version": VLLM_VERSION,
            "service_version": __version__,
        }
        self.fingerprint = local_print
        # Built on first use: the detokenizer tables take most of a second for a 150k vocabulary.
        self._derender_ctx: Any = None
        self._make_derender_ctx = lambda: derender.make_context(self.ctx, local_print["fingerprint"], None, Metrics())
        self.served_names = list(settings.served_names)
        self.root = settings.model
        self.revision = settings.revision
        self.max_model_len = model.max_model_len
        self.max_logprobs = settings.max_logprobs
        self.reasoning_parser = settings.reasoning_parser
        self.reasoning_parser_known = True
        self.generation = {
            "generation_config": settings.generation_config,
            "override_generation_config": settings.override_generation_config,
        }
        self.chat_template_sha = hashlib.sha256((model.chat_template or "").encode()).hexdigest()
        self.vocab_size = model.vocab_size
        self.tokenizer_known = True

    def _run(self, function: Callable[[], Any]) -> _Resp:
        from render_service.exceptions import RenderServiceError

        try:
            return _Resp(200, json.loads(json.dumps(function())))
        except RenderServiceError as exc:
            return _Resp(exc.status_code, exc.body())

    def render(self, body: dict[str, Any]) -> _Resp:
        from render_service.render.pipeline import render_chat

        return self._run(lambda: render_chat(self.ctx, copy.deepcopy(body)))

    def tokenize(self, body: dict[str, Any]) -> _Resp:
        from render_service.render.tokenize import tokenize

        return self._run(lambda: tokenize(self.ctx, copy.deepcopy(body)))

    def derender(self, body: dict[str, Any]) -> _Resp:
        from render_service.derender.pipeline import derender_chat

        if self._derender_ctx is None:
            self._derender_ctx = self._make_derender_ctx()
        return self._run(lambda: derender_chat(self._derender_ctx, copy.deepcopy(body)))


_LOCAL_REFERENCES: dict[tuple[int, int], _LocalReference] = {}


def _local_reference(settings: Settings, model: Model) -> _LocalReference:
    """One reference per (settings, model) pair: repeated audits reuse its fingerprint and derender tables.
    The cached object holds both, so their ids cannot be reused while cached."""
    key = (id(settings), id(model))
    reference = _LOCAL_REFERENCES.get(key)
    if reference is None:
        if len(_LOCAL_REFERENCES) >= 4:
            _LOCAL_REFERENCES.pop(next(iter(_LOCAL_REFERENCES)))
        reference = _LOCAL_REFERENCES[key] = _LocalReference(settings, model)
    return reference


class _RemoteReference(_Reference):
    def __init__(self, peer: _Peer, facts: dict[str, Any]) -> None:
        self.label = f"render replica {peer.url}"
        self.peer = peer
        self.fingerprint = facts.get("fingerprint")
        self.served_names = facts.get("served_names")
        self.root = facts.get("root")
        self.max_model_len = facts.get("max_model_len")
        values = (self.fingerprint or {}).get("values") or {}
        if values:
            self.revision = (values.get("model") or {}).get("revision")
            self.max_logprobs = values.get("max_logprobs")
            self.reasoning_parser = (values.get("parsers") or {}).get("reasoning_parser")
            self.reasoning_parser_known = True
            generation = values.get("generation_defaults") or {}
            self.generation = {
                "generation_config": generation.get("generation_config"),
                "override_generation_config": generation.get("override_generation_config"),
            }
            self.chat_template_sha = values.get("chat_template")
        config = facts.get("server_info")
        if config:
            self.max_logprobs = config.get("max_logprobs", self.max_logprobs)
            if not self.reasoning_parser_known and "reasoning_parser" in config:
                self.reasoning_parser = config["reasoning_parser"] or None
                self.reasoning_parser_known = True
            if self.generation is None:
                self.generation = {
                    "generation_config": config.get("generation_config"),
                    "override_generation_config": config.get("override_generation_config"),
                }
        if self.chat_template_sha is None and facts.get("chat_template_sha"):
            self.chat_template_sha = facts["chat_template_sha"]
        self.tokenizer_known = True

    def render(self, body: dict[str, Any]) -> _Resp:
        return self.peer.post("/v1/chat/completions/render", body)

    def tokenize(self, body: dict[str, Any]) -> _Resp:
        return self.peer.post("/tokenize", body)

    def derender(self, body: dict[str, Any]) -> _Resp:
        return self.peer.post("/v1/chat/completions/derender", body)


# -- checks --------------------------------------------------------------------------------------


def _version_check(out: _Collector, peer: str, version: Any, *, engine: bool) -> None:
    if not isinstance(version, str):
        out.add(peer, "vllm_version", VLLM_VERSION, version, "warning", "GET /version gave no version")
        return
    base = version.split("+", 1)[0]
    if base == VLLM_VERSION:
        out.ok(peer, "vllm_version", VLLM_VERSION, version)
        return
    series = ".".join(base.split(".")[:2])
    if engine and series in ACCEPTED_ENGINE_SERIES:
        note = ACCEPTED_ENGINE_SERIES[series] or f"parity was verified against {VLLM_VERSION}"
        out.add(peer, "vllm_version", VLLM_VERSION, version, "info", f"accepted engine version: {note}")
        return
    what = "engine" if engine else "render replica"
    out.add(
        peer,
        "vllm_version",
        VLLM_VERSION,
        version,
        "warning",
        f"{what} reports vLLM {version}; this service's parity was verified against {VLLM_VERSION}"
        + (" (engines 0.32/0.33 accepted)" if engine else ""),
    )


def _models_facts(resp: _Resp) -> dict[str, Any]:
    cards = resp.body.get("data") if isinstance(resp.body, dict) else None
    if not isinstance(cards, list) or not cards:
        return {}
    # LoRA cards have a parent: the base model cards are the served names.
    base = [c for c in cards if isinstance(c, dict) and not c.get("parent")] or cards
    return {
        "served_names": [c.get("id") for c in base],
        "root": base[0].get("root"),
        "max_model_len": base[0].get("max_model_len"),
    }


def _same_model_name(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    return Path(a.rstrip("/")).name == Path(b.rstrip("/")).name


def _check_models(out: _Collector, peer: str, ref: _Reference, facts: dict[str, Any], *, engine: bool) -> None:
    if not facts:
        out.add(peer, "served_model_names", ref.served_names, None, "error", "GET /v1/models listed no model")
        return
    theirs = facts["served_names"]
    if ref.served_names is not None:
        if engine:
            missing = [name for name in ref.served_names if name not in theirs]
            if missing:
                out.add(
                    peer,
                    "served_model_names",
                    ref.served_names,
                    theirs,
                    "error",
                    f"the engine does not serve {missing}: render passes the request's `model` through, "
                    f"so the engine answers 404 for it",
                )
            else:
                out.ok(peer, "served_model_names", ref.served_names, theirs)
        else:
            out.check(
                peer, "served_model_names", ref.served_names, theirs, "render replicas accept different model names"
            )
    if ref.root is not None and facts.get("root") is not None:
        if ref.root == facts["root"]:
            out.ok(peer, "model", ref.root)
        elif _same_model_name(ref.root, facts["root"]):
            out.add(
                peer,
                "model",
                ref.root,
                facts["root"],
                "warning",
                "same model name under another path (or hub id): check it is the same revision",
            )
        else:
            out.add(peer, "model", ref.root, facts["root"], "error", "a different model root")
    if ref.max_model_len is not None:
        out.check(
            peer,
            "max_model_len",
            ref.max_model_len,
            facts.get("max_model_len"),
            "GET /v1/models max_model_len differs: render computes max_tokens and rejects prompts "
            "with its own value" + ("; the engine rejects what exceeds its own" if engine else ""),
        )


def _server_info(peer: _Peer) -> tuple[dict[str, Any] | None, str]:
    """Selected fields of GET /server_info (VLLM_SERVER_DEV_MODE=1 only)."""
    resp = peer.get("/server_info?config_format=json")
    if not resp.ok or not isinstance(resp.body, dict):
        return None, ("not exposed (needs VLLM_SERVER_DEV_MODE=1)" if resp.status in (404, 405) else resp.message())
    config = resp.body.get("vllm_config")
    if not isinstance(config, dict):
        return None, "vllm_config is not JSON"
    model_config = config.get("model_config") or {}
    structured = config.get("structured_outputs_config") or {}
    return {
        "max_model_len": model_config.get("max_model_len"),
        "max_logprobs": model_config.get("max_logprobs"),
        "served_model_name": model_config.get("served_model_name"),
        "revision": model_config.get("revision"),
        "tokenizer_revision": model_config.get("tokenizer_revision"),
        "generation_config": model_config.get("generation_config"),
        "override_generation_config": model_config.get("override_generation_config"),
        "skip_tokenizer_init": model_config.get("skip_tokenizer_init"),
        "reasoning_parser": structured.get("reasoning_parser"),
    }, ""


def _check_server_info(out: _Collector, peer: str, ref: _Reference, info: dict[str, Any], *, engine: bool) -> None:
    if ref.max_model_len is not None and info.get("max_model_len") is not None:
        out.check(peer, "max_model_len", ref.max_model_len, info["max_model_len"], "server_info model_config")
    if ref.max_logprobs is not None and info.get("max_logprobs") is not None:
        out.check(
            peer,
            "max_logprobs",
            ref.max_logprobs,
            info["max_logprobs"],
            "render/derender bound logprobs with one value, the engine with another",
        )
    if ref.revision is not None and info.get("revision") not in (None, ref.revision):
        out.add(peer, "model", ref.revision, info["revision"], "error", "model revision differs")
    if ref.generation is not None and info.get("generation_config") is not None:
        theirs = {
            "generation_config": info["generation_config"],
            "override_generation_config": info.get("override_generation_config") or {},
        }
        ours = {
            "generation_config": ref.generation.get("generation_config"),
            "override_generation_config": ref.generation.get("override_generation_config") or {},
        }
        # Render sends every sampling value: an engine's own defaults only fill what render omitted.
        out.check(
            peer,
            "generation_defaults",
            ours,
            theirs,
            "generation config flags differ"
            + (" (the engine only uses them for values render omits)" if engine else ""),
            severity="warning" if engine else "error",
        )
    if ref.reasoning_parser_known and "reasoning_parser" in info:
        theirs_parser = info["reasoning_parser"] or None
        tokens_only = bool(info.get("skip_tokenizer_init"))
        if engine:
            # The engine's reasoning parser only gates structured outputs, which --tokens-only cannot run.
            severity = "info" if tokens_only else "warning"
            out.check(
                peer,
                "parsers",
                {"reasoning_parser": ref.reasoning_parser},
                {"reasoning_parser": theirs_parser},
                "the engine's --reasoning-parser (it gates structured outputs)",
                severity=severity,
            )
        else:
            out.check(
                peer,
                "parsers",
                {"reasoning_parser": ref.reasoning_parser},
                {"reasoning_parser": theirs_parser},
                "--reasoning-parser differs",
            )


def _tokenizer_info(out: _Collector, peer: str, ref: _Reference, resp: _Resp) -> bool | None:
    """Compare GET /tokenizer_info; True/False = has a tokenizer, None = unknown."""
    if resp.ok and isinstance(resp.body, dict):
        template = resp.body.get("chat_template")
        if isinstance(template, str) and ref.chat_template_sha is not None:
            theirs = hashlib.sha256(template.encode()).hexdigest()
            out.check(
                peer,
                "chat_template",
                ref.chat_template_sha[:16],
                theirs[:16],
                "GET /tokenizer_info chat_template differs (sha256 prefixes)",
            )
        return True
    if resp.status == 400 and "skip_tokenizer_init" in resp.message():
        return False
    return None


def _fingerprint_values_diff(ours: Any, theirs: Any) -> tuple[Any, Any]:
    """Only the keys that differ, for dicts; the values otherwise."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        keys = sorted(set(ours) | set(theirs), key=str)
        return (
            {k: ours.get(k) for k in keys if ours.get(k) != theirs.get(k)},
            {k: theirs.get(k) for k in keys if ours.get(k) != theirs.get(k)},
        )
    return ours, theirs


def _short(value: Any) -> Any:
    """64-hex digests shortened to 16 for the table."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:16]
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return value


def _check_fingerprint(
    out: _Collector, peer: str, ref: _Reference, theirs: dict[str, Any], *, local_reference: bool
) -> None:
    ours = ref.fingerprint or {}
    ours_components = ours.get("components") or {}
    theirs_components = theirs.get("components") or {}
    ours_values = ours.get("values") or {}
    theirs_values = theirs.get("values") or {}
    worst = "ok"
    for name in list(dict.fromkeys([*ours_components, *theirs_components])):
        a, b = ours_components.get(name), theirs_components.get(name)
        if a == b:
            continue  # agreeing components are summed up by the overall row (behaviour rows follow)
        shown_a, shown_b = _fingerprint_values_diff(ours_values.get(name), theirs_values.get(name))
        shown_a, shown_b = _short(shown_a), _short(shown_b)
        if name == "service_version":
            out.add(peer, name, shown_a, shown_b, "info", "service versions differ (not part of the fingerprint)")
            continue
        severity = "error"
        detail = f"fingerprint component {name} differs ({a} vs {b})"
        if name == "model" and local_reference:
            mine, other = ours_values.get("model") or {}, theirs_values.get("model") or {}
            if mine.get("revision") == other.get("revision") and _same_model_name(mine.get("root"), other.get("root")):
                severity = "warning"
                detail = (
                    "same model under another path; replicas that differ like this refuse each other's "
                    "derender calls (409)"
                )
        worst = max(worst, severity, key=_RANK.__getitem__)
        out.add(peer, name, shown_a, shown_b, severity, detail)
    overall_a, overall_b = ours.get("fingerprint"), theirs.get("fingerprint")
    if overall_a == overall_b:
        out.ok(peer, "fingerprint", overall_a)
    else:
        out.add(
            peer,
            "fingerprint",
            overall_a,
            overall_b,
            "error" if worst == "ok" else worst,
            "overall fingerprint differs: derender calls carrying the other fingerprint are refused (409)",
        )
    parity = theirs.get("vllm_parity_version")
    if parity is not None:
        out.check(
            peer,
            "vllm_parity_version",
            VLLM_VERSION,
            parity,
            "the replica reproduces another vLLM version",
            severity="warning",
        )


_PARSER_SAMPLING_KEYS = ("skip_special_tokens", "structured_outputs")


def _implied_max_model_len(resp: _Resp) -> int | None:
    body = resp.body if isinstance(resp.body, dict) else {}
    max_tokens = (body.get("sampling_params") or {}).get("max_tokens")
    ids = body.get("token_ids")
    if isinstance(max_tokens, int) and isinstance(ids, list):
        return max_tokens + len(ids)
    return None


def _error_kind(resp: _Resp) -> Any:
    if isinstance(resp.body, dict) and isinstance(resp.body.get("error"), dict):
        return resp.body["error"].get("type")
    return None


def _compare_render(out: _Collector, peer: str, probe: str, ours: _Resp, theirs: _Resp) -> bool:
    """Map the differences between two renders of the same request to fingerprint components.

    Returns True when the effective chat_template_kwargs differ: they change the prompt ids,
    `reasoning_ended` and the derender split too, so those differences are attributed to them.
    """
    where = f"render probe {probe!r}"
    if not ours.ok or not theirs.ok:
        component = "parsers" if probe.startswith("tools") else "render"
        a = f"{ours.status} {_error_kind(ours) or ''}".strip()
        b = f"{theirs.status} {_error_kind(theirs) or ''}".strip()
        if ours.status == theirs.status and _error_kind(ours) == _error_kind(theirs):
            out.ok(peer, component, a, b)
        else:
            out.add(
                peer,
                component,
                a,
                b,
                "error",
                f"{where}: ours {ours.message() if not ours.ok else '200'}, "
                f"theirs {theirs.message() if not theirs.ok else '200'}",
            )
        return False
    a, b = ours.body, theirs.body
    kwargs_a = (a.get("parse_context") or {}).get("chat_template_kwargs")
    kwargs_b = (b.get("parse_context") or {}).get("chat_template_kwargs")
    kwargs_differ = kwargs_a != kwargs_b
    if kwargs_differ:
        diff_a, diff_b = _fingerprint_values_diff(kwargs_a, kwargs_b)
        out.add(
            peer,
            "default_chat_template_kwargs",
            diff_a,
            diff_b,
            "error",
            f"{where}: effective chat_template_kwargs differ (--default-chat-template-kwargs, --cohere-format)",
        )
    else:
        out.ok(peer, "default_chat_template_kwargs", kwargs_a)
    ids_a, ids_b = a.get("token_ids") or [], b.get("token_ids") or []
    if ids_a != ids_b:
        first = next(
            (i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y), min(len(ids_a), len(ids_b))
        )
        if kwargs_differ:
            out.add(
                peer,
                "default_chat_template_kwargs",
                f"{len(ids_a)} ids",
                f"{len(ids_b)} ids",
                "error",
                f"{where}: prompt token ids differ from position {first} (explained by the template kwargs, "
                f"unless the template differs too)",
            )
        else:
            out.add(
                peer,
                "chat_template",
                f"{len(ids_a)} ids",
                f"{len(ids_b)} ids",
                "error",
                f"{where}: prompt token ids differ from position {first} (chat template, content format or tokenizer)",
            )
    else:
        out.ok(peer, "chat_template", f"{len(ids_a)} ids")
    sa, sb = dict(a.get("sampling_params") or {}), dict(b.get("sampling_params") or {})
    max_a, max_b = sa.pop("max_tokens", None), sb.pop("max_tokens", None)
    # max_tokens = min(max_model_len - prompt, a max_tokens default): compare what it implies.
    if max_a != max_b and _implied_max_model_len(ours) != _implied_max_model_len(theirs):
        out.add(
            peer,
            "max_model_len",
            _implied_max_model_len(ours),
            _implied_max_model_len(theirs),
            "error",
            f"{where}: computed max_tokens {max_a} vs {max_b} for {len(ids_a)} vs {len(ids_b)} prompt ids "
            f"(max_model_len, or a max_tokens generation default)",
        )
    else:
        out.ok(peer, "max_model_len", _implied_max_model_len(ours), _implied_max_model_len(theirs))
    parser_a = {k: sa.pop(k, None) for k in _PARSER_SAMPLING_KEYS}
    parser_b = {k: sb.pop(k, None) for k in _PARSER_SAMPLING_KEYS}
    if sa != sb:
        diff_a, diff_b = _fingerprint_values_diff(sa, sb)
        out.add(
            peer,
            "generation_defaults",
            diff_a,
            diff_b,
            "error",
            f"{where}: sampling_params differ (generation_config / override_generation_config)",
        )
    else:
        out.ok(peer, "generation_defaults", "same sampling_params")
    reasoning_a: dict[str, Any] = {"reasoning": a.get("reasoning_parser_kwargs") is not None}
    reasoning_b: dict[str, Any] = {"reasoning": b.get("reasoning_parser_kwargs") is not None}
    if not kwargs_differ:  # enable_thinking and friends decide reasoning_ended too
        reasoning_a["reasoning_ended"] = a.get("reasoning_ended")
        reasoning_b["reasoning_ended"] = b.get("reasoning_ended")
    if parser_a != parser_b or reasoning_a != reasoning_b:
        diff_a, diff_b = _fingerprint_values_diff(parser_a, parser_b)
        out.add(
            peer,
            "parsers",
            _short_parser({**reasoning_a, **diff_a}),
            _short_parser({**reasoning_b, **diff_b}),
            "error",
            f"{where}: reasoning/tool parser effects differ (reasoning_parser_kwargs, reasoning_ended, "
            f"skip_special_tokens or the tool structural tag)",
        )
    else:
        out.ok(peer, "parsers", "same parser effects")
    rest_a = {k: v for k, v in a.items() if k not in _RENDER_COMPARED}
    rest_b = {k: v for k, v in b.items() if k not in _RENDER_COMPARED}
    if rest_a != rest_b:
        diff_a, diff_b = _fingerprint_values_diff(rest_a, rest_b)
        out.add(peer, "render", diff_a, diff_b, "error", f"{where}: other GenerateRequest fields differ")
    return kwargs_differ


_RENDER_COMPARED = {
    "request_id",
    "token_ids",
    "sampling_params",
    "reasoning_parser_kwargs",
    "reasoning_ended",
    "parse_context",
}


def _short_parser(value: dict[str, Any]) -> dict[str, Any]:
    structured = value.get("structured_outputs")
    if isinstance(structured, dict):
        text = json.dumps(structured, sort_keys=True)
        value = {**value, "structured_outputs": f"sha:{hashlib.sha256(text.encode()).hexdigest()[:8]}"}
    return value


def _derender_message(resp: _Resp) -> Any:
    if not resp.ok:
        return {"status": resp.status, "type": _error_kind(resp)}
    choice = ((resp.body or {}).get("choices") or [{}])[0]
    message = dict(choice.get("message") or {})
    calls = [
        {"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
        for c in message.get("tool_calls") or []
    ]
    return {
        "content": message.get("content"),
        "reasoning": message.get("reasoning"),
        "tool_calls": calls,
        "finish_reason": choice.get("finish_reason"),
    }


def _derender_probe(ref: _Reference) -> dict[str, Any] | None:
    """A batch derender request of a fixed output (reasoning + a hermes tool call), or None."""
    rendered = ref.render(RENDER_PROBES["tools"])
    tokenized = ref.tokenize({"prompt": DERENDER_OUTPUT, "add_special_tokens": False})
    if not rendered.ok or not tokenized.ok:
        rendered = ref.render(RENDER_PROBES["chat"])
        request = RENDER_PROBES["chat"]
    else:
        request = RENDER_PROBES["tools"]
    if not rendered.ok or not tokenized.ok:
        return None
    return {
        "chat_request": request,
        "prompt_token_ids": rendered.body["token_ids"],
        "generate_response": {
            "request_id": "generate-tokens-render-audit",
            "choices": [{"index": 0, "finish_reason": "stop", "token_ids": tokenized.body["tokens"]}],
        },
    }


# -- render replicas -----------------------------------------------------------------------------


def _gather_render_facts(peer: _Peer, out: _Collector) -> dict[str, Any] | None:
    models = peer.get("/v1/models")
    if models.error or models.status == 401:
        why = "401 Unauthorized: pass --api-key" if models.status == 401 else models.error
        out.add(peer.url, "reachability", "reachable", "unreachable", "unreachable", f"GET /v1/models: {why}")
        return None
    facts: dict[str, Any] = {"models": models, **_models_facts(models)}
    facts["version"] = peer.get("/version")
    config = peer.get("/v1/render/config")
    facts["fingerprint"] = config.body if config.ok and isinstance(config.body, dict) else None
    info, why = _server_info(peer)
    facts["server_info"] = info
    facts["server_info_note"] = why
    tokenizer_info = peer.get("/tokenizer_info")
    facts["tokenizer_info"] = tokenizer_info
    if tokenizer_info.ok and isinstance(tokenizer_info.body, dict):
        template = tokenizer_info.body.get("chat_template")
        if isinstance(template, str):
            facts["chat_template_sha"] = hashlib.sha256(template.encode()).hexdigest()
    return facts


def _audit_render(
    peer: _Peer, facts: dict[str, Any], ref: _Reference, out: _Collector, report: AuditReport, *, local_reference: bool
) -> None:
    url = peer.url
    version = facts["version"].body.get("version") if isinstance(facts["version"].body, dict) else None
    fingerprint = facts.get("fingerprint")
    report.peers[url] = {
        "role": "render",
        "reachable": True,
        "vllm_version": version,
        "fingerprint": (fingerprint or {}).get("fingerprint"),
        "kind": "render-service" if fingerprint else "vllm render (no /v1/render/config)",
        "server_info": facts.get("server_info_note") or "exposed",
    }
    _version_check(out, url, version, engine=False)
    if fingerprint is not None and ref.fingerprint is not None:
        _check_fingerprint(out, url, ref, fingerprint, local_reference=local_reference)
    elif fingerprint is None:
        out.add(
            url,
            "fingerprint",
            (ref.fingerprint or {}).get("fingerprint"),
            None,
            "info",
            "no GET /v1/render/config (a vLLM render server): checked by behaviour only",
        )
    _check_models(out, url, ref, facts, engine=False)
    if facts.get("server_info"):
        _check_server_info(out, url, ref, facts["server_info"], engine=False)
    _tokenizer_info(out, url, ref, facts["tokenizer_info"])
    # Behaviour: the same probes, rendered, tokenized and derendered.
    kwargs_differ = False
    for name, body in RENDER_PROBES.items():
        kwargs_differ |= _compare_render(
            out, url, name, ref.render(body), peer.post("/v1/chat/completions/render", body)
        )
    ours = ref.tokenize({"prompt": TOKENIZE_TEXT, "add_special_tokens": False})
    theirs = peer.post("/tokenize", {"prompt": TOKENIZE_TEXT, "add_special_tokens": False})
    if ours.ok and theirs.ok:
        ids_a, ids_b = ours.body.get("tokens") or [], theirs.body.get("tokens") or []
        if ids_a == ids_b:
            out.ok(url, "tokenizer_files", f"{len(ids_a)} ids (tokenize)")
        else:
            out.add(
                url,
                "tokenizer_files",
                f"{len(ids_a)} ids",
                f"{len(ids_b)} ids",
                "error",
                "POST /tokenize of a probe text gives other ids: another tokenizer",
            )
    elif ours.ok != theirs.ok:
        out.add(
            url,
            "tokenizer_files",
            ours.status,
            theirs.status,
            "warning",
            f"POST /tokenize: ours {ours.message() if not ours.ok else 200}, theirs {theirs.message()}",
        )
    probe = _derender_probe(ref)
    if probe is not None:
        mine = _derender_message(ref.derender(probe))
        other = _derender_message(peer.post("/v1/chat/completions/derender", probe))
        if mine == other:
            out.ok(url, "parsers", "same derender split")
        else:
            diff_a, diff_b = _fingerprint_values_diff(mine, other)
            # The template kwargs (enable_thinking) steer the reasoning parser: blame them when they differ.
            out.add(
                url,
                "default_chat_template_kwargs" if kwargs_differ else "parsers",
                diff_a,
                diff_b,
                "error",
                "derender of the same output splits content/reasoning/tool_calls differently "
                + (
                    "(explained by the differing template kwargs, unless the parsers differ too)"
                    if kwargs_differ
                    else "(--reasoning-parser, --tool-call-parser, --enable-auto-tool-choice)"
                ),
            )


# -- engines -------------------------------------------------------------------------------------


@dataclass
class _EngineProbe:
    model: str | None
    root: str | None
    token: int | None = None


def _generate_failure(out: _Collector, url: str, resp: _Resp, ours: Any, what: str) -> None:
    message = resp.message()
    lowered = message.lower()
    if resp.error:
        out.add(url, what, ours, "no answer", "unreachable", f"POST /inference/v1/generate: {message}")
    elif resp.status == 404 and "model" in lowered:
        out.add(url, "served_model_names", ours, "404", "error", f"generate: {message}")
    elif resp.status in (403, 404, 405):
        out.add(
            url,
            "generate_endpoint",
            "enabled",
            str(resp.status),
            "error",
            f"/inference/v1/generate is not served ({message}): start the engine with --tokens-only or "
            f"--enable-scale-out",
        )
    elif "model length" in lowered or "max_model_len" in lowered or "context length" in lowered:
        out.add(url, "max_model_len", ours, "rejected", "error", f"{what}: {message}")
    else:
        out.add(url, what, ours, "rejected", "error", f"the engine rejects this render's request: {message}")


def _audit_engine(
    peer: _Peer,
    ref: _Reference,
    out: _Collector,
    report: AuditReport,
    *,
    generate_probe: bool,
    long_probe: bool,
    probe_timeout: float,
    probe_render: _Resp | None,
) -> _EngineProbe | None:
    url = peer.url
    models = peer.get("/v1/models")
    if models.error or models.status == 401:
        why = "401 Unauthorized: pass --api-key" if models.status == 401 else models.error
        out.add(url, "reachability", "reachable", "unreachable", "unreachable", f"GET /v1/models: {why}")
        report.peers[url] = {"role": "engine", "reachable": False}
        return None
    facts = _models_facts(models)
    version_resp = peer.get("/version")
    version = version_resp.body.get("version") if isinstance(version_resp.body, dict) else None
    info = {
        "role": "engine",
        "reachable": True,
        "vllm_version": version,
        "served_names": facts.get("served_names"),
        "max_model_len": facts.get("max_model_len"),
    }
    report.peers[url] = info
    _version_check(out, url, version, engine=True)
    _check_models(out, url, ref, facts, engine=True)

    has_tokenizer = _tokenizer_info(out, url, ref, peer.get("/tokenizer_info"))
    server_info, why = _server_info(peer)
    info["server_info"] = "exposed" if server_info else why
    if server_info:
        _check_server_info(out, url, ref, server_info, engine=True)
        if has_tokenizer is None:
            has_tokenizer = not server_info.get("skip_tokenizer_init")

    # /tokenize: chat-template and tokenizer parity, where the engine has a tokenizer.
    chat = {"messages": PROBE_MESSAGES}
    theirs = peer.post("/tokenize", chat)
    if theirs.ok:
        has_tokenizer = True
        ours = ref.tokenize(chat) if ref.tokenizer_known else _Resp(None, error="no reference")
        if ours.ok:
            ids_a, ids_b = ours.body.get("tokens"), theirs.body.get("tokens")
            if ids_a == ids_b:
                out.ok(url, "chat_template", f"{len(ids_a)} ids (tokenize)")
            else:
                plain_a = ref.tokenize({"prompt": TOKENIZE_TEXT, "add_special_tokens": False})
                plain_b = peer.post("/tokenize", {"prompt": TOKENIZE_TEXT, "add_special_tokens": False})
                tokenizer_differs = plain_a.ok and plain_b.ok and plain_a.body["tokens"] != plain_b.body["tokens"]
                out.add(
                    url,
                    "tokenizer_files" if tokenizer_differs else "chat_template",
                    f"{len(ids_a)} ids",
                    f"{len(ids_b or [])} ids",
                    "error",
                    "POST /tokenize of the probe chat gives other ids "
                    + (
                        "(the plain-text tokenization differs too: another tokenizer)"
                        if tokenizer_differs
                        else "(another chat template or default template kwargs)"
                    ),
                )
    elif theirs.status == 400 and "skip_tokenizer_init" in theirs.message():
        has_tokenizer = False
    info["tokens_only"] = has_tokenizer is False
    out.add(
        url,
        "tokenizer",
        "-",
        "none (--tokens-only)" if has_tokenizer is False else ("present" if has_tokenizer else "unknown"),
        "info" if has_tokenizer is False else "ok",
        "no tokenizer: token-id parity is proven by the generate probe instead" if has_tokenizer is False else "",
    )

    served = facts.get("served_names") or []
    ours_names = ref.served_names or []
    model = next((name for name in ours_names if name in served), served[0] if served else None)
    result = _EngineProbe(model, facts.get("root"))
    if not generate_probe:
        return result
    if probe_render is None or not probe_render.ok:
        out.add(
            url,
            "generate_probe",
            "-",
            "-",
            "info",
            "skipped: no probe render (give MODEL and flags, or a reachable render replica)",
        )
        return result
    request = copy.deepcopy(probe_render.body)
    request["model"] = model
    request["request_id"] = f"render-audit-{uuid.uuid4().hex[:12]}"
    ids = request["token_ids"]
    if ref.vocab_size is not None and max(ids) >= ref.vocab_size:
        out.add(
            url,
            "generate_probe",
            f"vocab {ref.vocab_size}",
            f"id {max(ids)}",
            "error",
            "the probe render produced an id outside the model vocabulary; not sent (it would crash the engine)",
        )
        return result
    resp = peer.post("/inference/v1/generate", request, timeout=probe_timeout)
    if not resp.ok:
        _generate_failure(out, url, resp, f"{len(ids)} ids", "generate_probe")
        return result
    choices = resp.body.get("choices") or [{}]
    generated = choices[0].get("token_ids") or []
    usage = resp.body.get("usage") or {}
    problems = []
    if usage.get("prompt_tokens") not in (None, len(ids)):
        problems.append(f"the engine counted {usage.get('prompt_tokens')} prompt tokens for {len(ids)} ids")
    if len(generated) != 1:
        problems.append(f"max_tokens 1 gave {len(generated)} tokens")
    if generated and ref.vocab_size is not None and generated[0] >= ref.vocab_size:
        problems.append(f"generated id {generated[0]} is outside our vocabulary ({ref.vocab_size}): another model")
    if problems:
        out.add(
            url,
            "generate_probe",
            f"{len(ids)} ids -> 1 token",
            f"{usage.get('prompt_tokens')} ids -> {len(generated)} tokens",
            "error",
            "; ".join(problems),
        )
    else:
        out.ok(
            url,
            "generate_probe",
            f"{len(ids)} ids -> 1 token",
            f"accepted, token {generated[0]}",
            "rendered ids, length and sampling params accepted",
        )
    result.token = generated[0] if generated else None

    if long_probe and ref.max_model_len and ref.max_model_len > len(ids) + 1:
        length = ref.max_model_len - 1
        long_request = copy.deepcopy(request)
        long_request["request_id"] = f"render-audit-long-{uuid.uuid4().hex[:12]}"
        long_request["token_ids"] = (ids * (length // len(ids) + 1))[:length]
        long_request["sampling_params"]["max_tokens"] = 1
        resp = peer.post("/inference/v1/generate", long_request, timeout=probe_timeout)
        if resp.ok:
            counted = (resp.body.get("usage") or {}).get("prompt_tokens")
            out.check(
                url,
                "long_prompt_probe",
                f"{length} ids accepted",
                f"{length} ids accepted" if counted in (None, length) else f"{counted} ids counted",
                "the engine counted another prompt length",
            )
        elif resp.error:
            out.add(
                url,
                "long_prompt_probe",
                f"{length} ids",
                "no answer",
                "unreachable",
                f"POST /inference/v1/generate: {resp.message()}",
            )
        else:
            out.add(
                url,
                "long_prompt_probe",
                f"{length} ids accepted",
                "rejected",
                "error",
                f"a prompt of max_model_len - 1 = {length} tokens, which render accepts, is rejected: {resp.message()}",
            )
            lowered = resp.message().lower()
            if "model length" in lowered or "max_model_len" in lowered or "context length" in lowered:
                out.add(
                    url,
                    "max_model_len",
                    ref.max_model_len,
                    "shorter",
                    "error",
                    "the engine's max_model_len is shorter than render's",
                )
    return result


def _compare_engines(out: _Collector, probes: dict[str, _EngineProbe]) -> None:
    """Engines serving the same model must produce the same greedy token for the same probe."""
    groups: dict[Any, list[tuple[str, _EngineProbe]]] = {}
    for url, probe in probes.items():
        if probe.token is None:
            continue
        # The same model: the same root folder name (or hub id), whatever names it is served under.
        key = Path(probe.root.rstrip("/")).name if probe.root else probe.model
        groups.setdefault(key, []).append((url, probe))
    for members in groups.values():
        if len(members) < 2:
            continue
        first_url, first = members[0]
        for url, probe in members[1:]:
            out.check(
                url,
                "greedy_token",
                first.token,
                probe.token,
                f"greedy next token differs from {first_url} on the same rendered probe "
                f"(other weights, dtype or quantization)",
            )


# -- the audit -----------------------------------------------------------------------------------


# The probe's verdict depends only on the configuration, and the continuous audit runs every
# interval: building a render context each time cost ~0.7 s per minute with a large tokenizer.
# Kept by identity (a Model is not hashable), few entries: a process audits one configuration.
_HISTORY_VERDICTS: list[tuple[Model, Settings, Any]] = []


def _template_history(settings: Settings, model: Model) -> Any:
    """The history probe's verdicts for this configuration (None: no guard; str: refused), once."""
    for cached_model, cached_settings, cached_verdicts in _HISTORY_VERDICTS:
        if cached_model is model and cached_settings is settings:
            return cached_verdicts
    from functools import partial

    from render_service.exceptions import RenderServiceError
    from render_service.render import pipeline, prefix

    ctx = pipeline.make_context(model, settings)
    verdicts: Any = None
    if ctx.prefix_guard is not None:
        try:
            verdicts = prefix.history_probe(partial(pipeline.render_chat, ctx), ctx.prefix_guard)
        except RenderServiceError as exc:
            verdicts = exc.message
    _HISTORY_VERDICTS[:] = [*_HISTORY_VERDICTS[-1:], (model, settings, verdicts)]
    return verdicts


def _check_template_history(out: _Collector, settings: Settings, model: Model) -> None:
    """Whether the chat template re-renders history as it was generated (prefix caching and
    bidirectional KV reuse depend on it): a note per probe turn where it does not."""
    from render_service.render import prefix

    verdicts = _template_history(settings, model)
    if verdicts is None:
        return
    if isinstance(verdicts, str):
        out.add("local", "template_history", None, None, "info", f"the history probe was refused: {verdicts}")
        return
    breaks = [(label, check) for label, check in verdicts if check.status == prefix.BREAKS]
    for label, check in breaks:
        out.add(
            "local",
            "template_history",
            check.cause,
            None,
            "info",
            f"{label}: the prompt does not extend the previous prompt + reply ({check.header()}); "
            "prefix-cache hits and bidirectional KV reuse stop there",
        )
    if not breaks:
        out.ok("local", "template_history", "extends", detail="every probe turn extends the previous prompt")


def run_audit(
    render_urls: Sequence[str],
    engine_urls: Sequence[str],
    *,
    local: tuple[Settings, Model] | None = None,
    api_key: str | None = None,
    timeout: float = 5.0,
    generate_probe: bool = True,
    long_probe: bool = True,
    probe_timeout: float | None = None,
) -> AuditReport:
    """Check every render replica and engine against the reference (see the module docstring).

    `local`: the configuration these peers must match (the CLI's MODEL and serve flags); without
    it the first reachable render replica is the reference. `long_probe` sends one prompt of
    exactly max_model_len - 1 tokens to each engine (a full prefill: disable it for frequent runs).
    """
    render_urls = list(dict.fromkeys(_normalize_url(u) for u in render_urls))
    engine_urls = list(dict.fromkeys(_normalize_url(u) for u in engine_urls))
    probe_timeout = probe_timeout or max(30.0, 6 * timeout)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.time()
    out = _Collector()
    with httpx.Client(headers=headers, timeout=timeout, follow_redirects=False) as client:
        render_peers = [_Peer(url, client, timeout) for url in render_urls]
        engine_peers = [_Peer(url, client, timeout) for url in engine_urls]
        facts: dict[str, dict[str, Any] | None] = {p.url: _gather_render_facts(p, out) for p in render_peers}
        ref: _Reference | None
        reference_url = None
        if local is not None:
            ref = _local_reference(*local)
        else:
            reference = next(((p, f) for p in render_peers if (f := facts[p.url]) is not None), None)
            reference_url = reference[0].url if reference else None
            ref = _RemoteReference(*reference) if reference else None
        report = AuditReport(
            reference=ref.label if ref else "none (no local model, no reachable render replica)", started=started
        )
        if local is not None:
            _check_template_history(out, *local)
        for peer in render_peers:
            peer_facts = facts[peer.url]
            if peer_facts is None:
                report.peers[peer.url] = {"role": "render", "reachable": False}
                continue
            if ref is None:
                continue
            if peer.url == reference_url:
                version = peer_facts["version"].body if isinstance(peer_facts["version"].body, dict) else {}
                report.peers[peer.url] = {
                    "role": "render (reference)",
                    "reachable": True,
                    "vllm_version": version.get("version"),
                    "fingerprint": (peer_facts.get("fingerprint") or {}).get("fingerprint"),
                }
                _version_check(out, peer.url, version.get("version"), engine=False)
                out.ok(peer.url, "reference", "this replica is the reference")
                continue
            _audit_render(peer, peer_facts, ref, out, report, local_reference=local is not None)
        if engine_peers:
            if ref is None:
                probe_render = None
                ref = _Reference()  # compare engines with each other only
            else:
                probe_render = ref.render(GENERATE_PROBE)
            probes: dict[str, _EngineProbe] = {}
            for peer in engine_peers:
                probe = _audit_engine(
                    peer,
                    ref,
                    out,
                    report,
                    generate_probe=generate_probe,
                    long_probe=long_probe,
                    probe_timeout=probe_timeout,
                    probe_render=probe_render,
                )
                if probe is not None:
                    probes[peer.url] = probe
            _compare_engines(out, probes)
    report.findings = out.findings()
    report.finished = time.time()
    return report


# -- endpoints files -----------------------------------------------------------------------------


class EndpointsFileError(ValueError):
    pass


ROLE_LABELS = ("render-service/role", "render-service.io/role")
_RENDER_KEYS = ("render", "renders", "render_urls")
_ENGINE_KEYS = ("engines", "engine", "engine_urls")


def load_endpoints(path: str | Path) -> tuple[list[str], list[str]]:
    """Render and engine URLs from a JSON or YAML file.

    Accepted shapes (in one document, a list, or several YAML documents):
    * `{"render": [URL, ...], "engines": [URL, ...]}` (values may also be Kubernetes objects);
    * `{"url": URL, "role": "render" | "engine"}`;
    * Kubernetes `Endpoints` (subsets/addresses/ports) and `EndpointSlice` (endpoints/ports)
      objects, and `List`/`EndpointsList`/`EndpointSliceList` of them. The role comes from the
      label or annotation `render-service/role`, else the enclosing `render:`/`engines:` key,
      else the name: "render" in it means a render replica, anything else an engine. The port
      named `http` (or `https`) is used, else the first; not-ready addresses are skipped.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        documents = [json.loads(text)]
    except ValueError:
        try:
            import yaml  # PyYAML: already installed as a dependency of transformers
        except ImportError as exc:  # pragma: no cover - transformers requires it
            raise EndpointsFileError(f"{path} is not JSON and PyYAML is not installed") from exc
        try:
            documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
        except yaml.YAMLError as exc:
            raise EndpointsFileError(f"{path} is neither JSON nor YAML: {exc}") from exc
    render: list[str] = []
    engines: list[str] = []
    for document in documents:
        _collect(document, None, render, engines)
    return list(dict.fromkeys(render)), list(dict.fromkeys(engines))


def _collect(obj: Any, role: str | None, render: list[str], engines: list[str]) -> None:
    if isinstance(obj, list):
        for item in obj:
            _collect(item, role, render, engines)
        return
    if isinstance(obj, str):
        if role is None:
            raise EndpointsFileError(f"URL {obj!r} has no role: list it under `render:` or `engines:`")
        (render if role == "render" else engines).append(_normalize_url(obj))
        return
    if not isinstance(obj, dict):
        raise EndpointsFileError(f"unexpected entry {obj!r}")
    kind = obj.get("kind")
    if kind is None and any(k in obj for k in (*_RENDER_KEYS, *_ENGINE_KEYS)):
        for key in _RENDER_KEYS:
            if key in obj:
                _collect(obj[key], "render", render, engines)
        for key in _ENGINE_KEYS:
            if key in obj:
                _collect(obj[key], "engine", render, engines)
        return
    if "items" in obj and (kind is None or str(kind).endswith("List")):
        _collect(obj["items"] or [], role, render, engines)
        return
    if "url" in obj:
        _collect(obj["url"], _role(obj.get("role")) or role, render, engines)
        return
    if kind in ("Endpoints", "EndpointSlice") or "subsets" in obj or "endpoints" in obj:
        metadata = obj.get("metadata") or {}
        explicit = next(
            (
                _role(source.get(label))
                for source in (metadata.get("labels") or {}, metadata.get("annotations") or {})
                for label in ROLE_LABELS
                if source.get(label)
            ),
            None,
        )
        name = metadata.get("name") or (metadata.get("labels") or {}).get("kubernetes.io/service-name") or ""
        chosen = explicit or role or ("render" if "render" in name.lower() else "engine")
        urls = _endpoints_urls(obj) if "subsets" in obj or kind == "Endpoints" else _slice_urls(obj)
        (render if chosen == "render" else engines).extend(urls)
        return
    raise EndpointsFileError(f"cannot read endpoints from {json.dumps(obj)[:200]}")


def _role(value: Any) -> str | None:
    if value is None:
        return None
    lowered = str(value).lower()
    if lowered in ("render", "renderer", "render-service"):
        return "render"
    if lowered in ("engine", "engines", "generate", "vllm"):
        return "engine"
    raise EndpointsFileError(f"unknown role {value!r} (render or engine)")


def _pick_port(ports: list[dict[str, Any]]) -> tuple[str, int] | None:
    if not ports:
        return None
    named = {str(p.get("name") or ""): p for p in ports}
    for name, scheme in (("http", "http"), ("https", "https")):
        if name in named:
            return scheme, int(named[name]["port"])
    first = ports[0]
    scheme = "https" if str(first.get("name") or "").startswith("https") or first.get("port") == 443 else "http"
    return scheme, int(first["port"])


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def _endpoints_urls(obj: dict[str, Any]) -> list[str]:
    urls = []
    for subset in obj.get("subsets") or []:
        picked = _pick_port(subset.get("ports") or [])
        if picked is None:
            raise EndpointsFileError("an Endpoints subset has no ports")
        for address in subset.get("addresses") or []:  # notReadyAddresses are skipped
            urls.append(_url(picked[0], address.get("ip") or address.get("hostname"), picked[1]))
    return urls


def _slice_urls(obj: dict[str, Any]) -> list[str]:
    picked = _pick_port(obj.get("ports") or [])
    if picked is None:
        raise EndpointsFileError("an EndpointSlice has no ports")
    urls = []
    for endpoint in obj.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        for address in endpoint.get("addresses") or []:
            urls.append(_url(picked[0], address, picked[1]))
    return urls


# -- continuous audit ----------------------------------------------------------------------------


class ContinuousAudit:
    """`run_audit` on an interval in a daemon thread, exported as Prometheus gauges.

    Gauges (in `registry`): `render_config_mismatch{peer,component}` (1 while that component
    mismatches, else 0), `render_last_audit_timestamp_seconds`, and
    `render_audit_peer_reachable{peer}`. `healthy` turns False after `unhealthy_after`
    consecutive audits with a mismatch and True again after a clean one (an unreachable peer
    alone does not make it unhealthy: readiness should not follow an engine's restarts).
    The long prompt probe is off by default here: it is a full prefill on every engine.

    Wiring (the app's lifespan)::

        audit = ContinuousAudit(render_urls, engine_urls, local=(settings, model),
                                registry=state.metrics.registry, interval=60).start()
        ...  # readiness: 503 while `not audit.healthy` (when the gate flag is on)
        audit.stop()

    Alerts (Prometheus)::

        max by (peer, component) (render_config_mismatch) > 0          # for: 5m
        time() - render_last_audit_timestamp_seconds > 3 * <interval>  # the audit itself stalled
        render_audit_peer_reachable == 0                               # for: 5m

    Greedy tokens are compared across engines serving the same model: engines on different
    hardware or parallelism can legitimately disagree on a near-tie, so treat a lone
    `greedy_token` mismatch as a prompt to look, not proof.
    """

    def __init__(
        self,
        render_urls: Iterable[str] = (),
        engine_urls: Iterable[str] = (),
        *,
        registry: Any,
        local: tuple[Settings, Model] | None = None,
        interval: float = 60.0,
        api_key: str | None = None,
        timeout: float = 5.0,
        unhealthy_after: int = 1,
        long_probe: bool = False,
        generate_probe: bool = True,
        on_report: Callable[[AuditReport], None] | None = None,
    ) -> None:
        from prometheus_client import Gauge

        self.render_urls = list(render_urls)
        self.engine_urls = list(engine_urls)
        self.local = local
        self.interval = interval
        self.api_key = api_key
        self.timeout = timeout
        self.unhealthy_after = max(1, unhealthy_after)
        self.long_probe = long_probe
        self.generate_probe = generate_probe
        self.on_report = on_report
        self.last_report: AuditReport | None = None
        self.last_error: str | None = None
        self._failing_runs = 0
        self._healthy = True
        self._seen: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.mismatch = Gauge(
            "render_config_mismatch",
            "1 while a peer's config component differs from ours",
            ["peer", "component"],
            registry=registry,
        )
        self.last_audit = Gauge(
            "render_last_audit_timestamp_seconds", "Unix time of the last completed audit", registry=registry
        )
        self.reachable = Gauge(
            "render_audit_peer_reachable", "1 if the peer answered the last audit", ["peer"], registry=registry
        )

    @property
    def healthy(self) -> bool:
        return self._healthy

    def run_once(self) -> AuditReport | None:
        with self._lock:
            try:
                report = run_audit(
                    self.render_urls,
                    self.engine_urls,
                    local=self.local,
                    api_key=self.api_key,
                    timeout=self.timeout,
                    generate_probe=self.generate_probe,
                    long_probe=self.long_probe,
                )
            except Exception as exc:  # an audit bug must never take the server down
                logger.exception("config audit failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
                return None
            self._export(report)
            self.last_report = report
            self.last_error = None
        if report.mismatches:
            logger.warning(
                "config audit: %d mismatches: %s",
                len(report.mismatches),
                ", ".join(f"{f.peer} {f.component}" for f in report.mismatches),
            )
        if self.on_report is not None:
            self.on_report(report)
        return report

    def _export(self, report: AuditReport) -> None:
        current: set[tuple[str, str]] = set()
        for finding in report.findings:
            if finding.component == "reachability":
                continue
            key = (finding.peer, finding.component)
            current.add(key)
            self.mismatch.labels(*key).set(1 if finding.severity == "error" else 0)
        for key in self._seen - current:
            self.mismatch.labels(*key).set(0)
        self._seen |= current
        unreachable = {f.peer for f in report.unreachable}
        for peer in dict.fromkeys([*report.peers, *unreachable]):
            self.reachable.labels(peer).set(0 if peer in unreachable else 1)
        self.last_audit.set(report.finished)
        self._failing_runs = self._failing_runs + 1 if report.mismatches else 0
        self._healthy = self._failing_runs < self.unhealthy_after

    def start(self) -> ContinuousAudit:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="render-config-audit", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval)

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ContinuousAudit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- CLI -----------------------------------------------------------------------------------------

USAGE_ERROR = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _audit_parser() -> argparse.ArgumentParser:
    from render_service.settings import add_model_arguments

    parser = _Parser(
        prog="render-service audit",
        description=(
            "Check that render replicas and vLLM engines agree with this configuration. Exit codes: 0 all agree, "
            "1 mismatch, 2 an endpoint unreachable, 3 the audit could not run."
        ),
    )
    parser.add_argument(
        "--render",
        action="append",
        default=[],
        metavar="URL",
        help="a render replica (render-service or `vllm launch render`); repeat the flag, or separate URLs with commas",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="a vLLM engine (`vllm serve --tokens-only` or --enable-scale-out); repeatable",
    )
    parser.add_argument(
        "--endpoints",
        action="append",
        default=[],
        metavar="FILE",
        help="JSON/YAML: {render: [...], engines: [...]} or Kubernetes Endpoints/EndpointSlices",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--api-key", default=None, help="Bearer key for the peers (default: VLLM_API_KEY)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per metadata request")
    parser.add_argument("--probe-timeout", type=float, default=None, help="seconds per generate probe")
    parser.add_argument("--no-generate-probe", action="store_true", help="do not send /inference/v1/generate probes")
    parser.add_argument(
        "--no-long-probe",
        action="store_true",
        help="skip the max_model_len - 1 token prompt (a full prefill on each engine)",
    )
    parser.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    add_model_arguments(parser)
    # MODEL is optional here: without it the first render replica is the reference.
    for action in parser._actions:
        if action.dest == "model":
            action.nargs = "?"
            action.required = False
            action.default = None
            action.help = "optional: the model (and serve flags) every peer must match"
    return parser


def main_audit(argv: Sequence[str] | None = None) -> int:
    """`render-service audit ...`: prints the table (or JSON) and returns the exit code."""
    from render_service.model.loader import ModelLoadError, load_model
    from render_service.settings import SettingsError, settings_from_args

    parser = _audit_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    render_urls = [u for value in args.render for u in value.split(",") if u.strip()]
    engine_urls = [u for value in args.engine for u in value.split(",") if u.strip()]
    for path in args.endpoints:
        try:
            more_render, more_engines = load_endpoints(path)
        except (OSError, EndpointsFileError) as exc:
            print(f"render-service audit: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        render_urls += more_render
        engine_urls += more_engines
    if not render_urls and not engine_urls:
        print("render-service audit: error: give --render, --engine or --endpoints", file=sys.stderr)
        return USAGE_ERROR
    local = None
    if args.model:
        try:
            settings = settings_from_args(args)
            local = (settings, load_model(settings))
        except (SettingsError, ModelLoadError) as exc:
            print(f"render-service audit: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    report = run_audit(
        render_urls,
        engine_urls,
        local=local,
        api_key=api_key,
        timeout=args.timeout,
        generate_probe=not args.no_generate_probe,
        long_probe=not args.no_long_probe,
        probe_timeout=args.probe_timeout,
    )
    print(report.to_json() if args.json else report.to_table())
    return report.strict_exit_code() if args.strict else report.exit_code


if __name__ == "__main__":
    sys.exit(main_audit())
