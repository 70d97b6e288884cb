"""The LoRA parity corpus: what vLLM 0.33's render tier answers for adapter names and the runtime
LoRA endpoints, and what we answer instead where we deliberately differ.

vLLM's render tier (`vllm launch render`) accepts `--lora-modules` but serves no adapter: its model
registry (`OpenAIModelRegistry`) has no LoRA support, so an adapter name in `model` is a 404 (and,
with VLLM_ALLOW_RUNTIME_LORA_UPDATING, a 500 "has no LoRA support"), `/v1/models` lists the base
model only, and the runtime endpoints it mounts under that variable answer 500 (an AttributeError)
once a body passes their schema. Each case says what we must answer:

- `same`: vLLM's answer (schema errors, absent routes, base-model requests);
- `as_base:<case>`: vLLM's answer to the same request naming the base model, with `model` the
  adapter's name (render and derender accept adapter names, as vLLM's engines do);
- `ours:<status>`: a deliberate difference, checked by the test itself (the runtime endpoints work).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .corpus import PARITY_DIR

GOLDEN_LORA_DIR = PARITY_DIR / "golden_lora"
ADAPTER_DIR_PLACEHOLDER = "<ADAPTER_DIR>"
SERVED = "tinyqwen3"
MAX_MODEL_LEN = 4096


def write_adapter(directory: Path, base_model: str = SERVED) -> Path:
    """An adapter folder as PEFT writes it (the config only: nothing on a render tier reads weights)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base_model,
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


@dataclass(frozen=True)
class LoRAConfig:
    name: str
    runtime_updating: bool  # VLLM_ALLOW_RUNTIME_LORA_UPDATING=1

    def vllm_flags(self, adapter_dir: str) -> list[str]:
        chat = {"name": "chat", "path": adapter_dir, "base_model_name": SERVED}
        return [
            "--served-model-name",
            SERVED,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--lora-modules",
            f"sql={adapter_dir}",
            json.dumps(chat),
        ]

    def env(self) -> dict[str, str]:
        return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1" if self.runtime_updating else "0"}


CONFIGS = {c.name: c for c in (LoRAConfig("lora_static", False), LoRAConfig("lora_runtime", True))}


@dataclass(frozen=True)
class LoRACase:
    name: str
    config: str
    path: str
    body: Any = None
    expect: str = "same"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    raw: str | None = None

    def request(self, adapter_dir: str) -> dict[str, Any]:
        req: dict[str, Any] = {"method": self.method, "path": self.path, "headers": dict(self.headers)}
        if self.raw is not None:
            req["raw"] = self.raw
        elif self.body is not None:
            req["json"] = _fill(self.body, adapter_dir)
        return req


def _fill(value: Any, adapter_dir: str) -> Any:
    return json.loads(json.dumps(value).replace(ADAPTER_DIR_PLACEHOLDER, adapter_dir))


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Write SQL for the top 3 users."}]}


def _completion(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "SELECT", "max_tokens": 8}


def _messages(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "Say hi"}]}


def _responses(model: str) -> dict[str, Any]:
    return {"model": model, "input": "Say hi", "request_id": "resp_lora"}


def _chat_derender(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "generate_response": _generate_response(model, "generate-tokens-chatcmpl-lora", [9707, 0, 151645]),
        "prompt_tokens": 3,
        "chat_request": _chat(model),
    }


def _completion_derender(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "generate_responses": [_generate_response(model, "generate-tokens-cmpl-lora-0", [4303, 353, 4295])],
        "prompt_tokens": [1],
        "completion_request": _completion(model),
    }


def _generate_response(model: str, request_id: str, token_ids: list[int]) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "model": model,
        "created": 1795949053,
        "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": None, "token_ids": token_ids}],
    }


def _pair(name: str, path: str, build: Any, headers: dict[str, str] | None = None) -> list[LoRACase]:
    """The request for the base model (parity) and for an adapter (as vLLM's base answer)."""
    fixed = {"X-Request-Id": name} if headers is None else headers
    return [
        LoRACase(f"{name}_base", "lora_static", path, build(SERVED), headers=fixed),
        LoRACase(f"{name}_adapter", "lora_static", path, build("sql"), expect=f"as_base:{name}_base", headers=fixed),
        LoRACase(
            f"{name}_adapter_with_parent",
            "lora_static",
            path,
            build("chat"),
            expect=f"as_base:{name}_base",
            headers=fixed,
        ),
    ]


LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"

CASES: list[LoRACase] = [
    LoRACase("models", "lora_static", "/v1/models", method="GET", expect="ours:models"),
    *_pair("chat", "/v1/chat/completions/render", _chat),
    *_pair("completion", "/v1/completions/render", _completion),
    *_pair("messages", "/v1/messages/render", _messages),
    *_pair("responses", "/v1/responses/render", _responses, headers={}),
    *_pair("chat_derender", "/v1/chat/completions/derender", _chat_derender, headers={}),
    *_pair("completion_derender", "/v1/completions/derender", _completion_derender, headers={}),
    *_pair("tokenize", "/tokenize", lambda model: {"model": model, "prompt": "SELECT 1"}, headers={}),
    LoRACase("chat_unknown_model", "lora_static", "/v1/chat/completions/render", _chat("nope")),
    # Without VLLM_ALLOW_RUNTIME_LORA_UPDATING neither serves the runtime endpoints.
    LoRACase("load_not_mounted", "lora_static", LOAD, {"lora_name": "x", "lora_path": ADAPTER_DIR_PLACEHOLDER}),
    LoRACase("unload_not_mounted", "lora_static", UNLOAD, {"lora_name": "sql"}),
    # With it: the schema is vLLM's (pydantic, lax) ...
    LoRACase("load_missing_path", "lora_runtime", LOAD, {"lora_name": "x"}),
    LoRACase("load_missing_both", "lora_runtime", LOAD, {}),
    LoRACase("load_not_object", "lora_runtime", LOAD, ["x"]),
    LoRACase("load_wrong_types", "lora_runtime", LOAD, {"lora_name": 3, "lora_path": ["p"], "load_inplace": "maybe"}),
    LoRACase("load_bad_bool_type", "lora_runtime", LOAD, {"lora_name": "x", "lora_path": "p", "load_inplace": [1]}),
    LoRACase("load_not_json", "lora_runtime", LOAD, raw="{nope", headers={"Content-Type": "application/json"}),
    LoRACase("load_wrong_content_type", "lora_runtime", LOAD, raw="{}", headers={"Content-Type": "text/plain"}),
    LoRACase("unload_missing_name", "lora_runtime", UNLOAD, {}),
    LoRACase("unload_bad_int", "lora_runtime", UNLOAD, {"lora_name": "sql", "lora_int_id": "abc"}),
    LoRACase("unload_fractional_int", "lora_runtime", UNLOAD, {"lora_name": "sql", "lora_int_id": 1.5}),
    # ... and past it vLLM's render tier fails (500), where ours does what vLLM's API server does.
    LoRACase(
        "load_ok",
        "lora_runtime",
        LOAD,
        {"lora_name": "new", "lora_path": ADAPTER_DIR_PLACEHOLDER, "load_inplace": "yes"},
        expect="ours:200",
    ),
    LoRACase("load_duplicate", "lora_runtime", LOAD, {"lora_name": "sql", "lora_path": "p"}, expect="ours:400"),
    LoRACase("load_base_name", "lora_runtime", LOAD, {"lora_name": SERVED, "lora_path": "p"}, expect="ours:400"),
    LoRACase("load_empty_name", "lora_runtime", LOAD, {"lora_name": "", "lora_path": "p"}, expect="ours:400"),
    LoRACase(
        "load_no_adapter", "lora_runtime", LOAD, {"lora_name": "y", "lora_path": "/nonexistent/a"}, expect="ours:404"
    ),
    LoRACase("chat_adapter_runtime", "lora_runtime", "/v1/chat/completions/render", _chat("sql"), expect="ours:200"),
    LoRACase("unload_ok", "lora_runtime", UNLOAD, {"lora_name": "sql", "lora_int_id": "7"}, expect="ours:200"),
    LoRACase("unload_unknown", "lora_runtime", UNLOAD, {"lora_name": "nope"}, expect="ours:404"),
    LoRACase("unload_empty_name", "lora_runtime", UNLOAD, {"lora_name": ""}, expect="ours:400"),
    LoRACase("chat_unknown_runtime", "lora_runtime", "/v1/chat/completions/render", _chat("nope"), expect="ours:404"),
]

CASES_BY_NAME = {case.name: case for case in CASES}


def golden_path(name: str) -> Path:
    return GOLDEN_LORA_DIR / f"{name}.json"
