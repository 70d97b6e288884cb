"""Derender parity for the `mistral` parsers: cases, recorder and replay helpers.

    python -m tests.parity.mistral_derender [--port PORT]     # record (VLLM_ORACLE_PYTHON)

Configs: the v13 fixture (`[THINK]`, `[TOOL_CALLS]name[ARGS]{...}`), the v11 fixture
(plain-text `<think>`, `[CALL_ID]`) and the v7 fixture (`[TOOL_CALLS][{...}]`, no reasoning) with `--reasoning-parser mistral --tool-call-parser mistral
--enable-auto-tool-choice`. Each case is one engine output (text segments and special tokens,
encoded with the fixture's mistral-common tokenizer), derendered in batch and streamed in chunks
of 1, 3 and 7 tokens (the returned `stream_state` echoed into the next call, as an llm-d client
does). Prompt ids are our render of the case's chat request (identical to vLLM's render, see
test_mistral_parity; vLLM's own render with these parsers fails for v11+, see mistral_corpus).
Goldens: tests/parity/golden_mistral_derender/<case>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from render_service import VLLM_VERSION

from .corpus import ServerConfig, free_port, send, start_oracle
from .derender_corpus import gen_choice, gen_chunk, gen_response, usage, with_state

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_mistral_derender"
CHAT_DERENDER = "/v1/chat/completions/derender"
CHUNKINGS = (1, 3, 7)

CONFIGS: dict[str, ServerConfig] = {
    c.name: c
    for c in (
        ServerConfig(
            name,
            family=family,
            served_model_name=f"tinymistral{family[1:]}",
            reasoning_parser="mistral",
            tool_call_parser="mistral",
            enable_auto_tool_choice=True,
        )
        for name, family in (("dv13", "v13"), ("dv11", "v11"), ("dv7", "v7"))
    )
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}

Segment = tuple[str, str]  # ("text", "...") or ("special", "[TOOL_CALLS]")


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    output: tuple[Segment, ...]
    tools: bool = True
    tool_choice: str = "auto"


def T(text: str) -> Segment:
    return ("text", text)


def S(token: str) -> Segment:
    return ("special", token)


CASES_LIST = [
    Case("dv13_content", "dv13", (T("Hello! How can I help you today?"),), tools=False),
    Case("dv13_think_content", "dv13", (S("[THINK]"), T("The user greets me."), S("[/THINK]"), T("Hello there!"))),
    Case(
        "dv13_think_tool",
        "dv13",
        (
            S("[THINK]"),
            T("I should call the weather tool."),
            S("[/THINK]"),
            S("[TOOL_CALLS]"),
            T("get_weather"),
            S("[ARGS]"),
            T('{"city": "Paris", "days": 3}'),
        ),
    ),
    Case(
        "dv13_two_tools",
        "dv13",
        (
            T("Checking."),
            S("[TOOL_CALLS]"),
            T("get_weather"),
            S("[ARGS]"),
            T('{"city": "Paris"}'),
            S("[TOOL_CALLS]"),
            T("get_weather"),
            S("[ARGS]"),
            T('{"city": "Tokyo", "days": 2}'),
        ),
    ),
    Case("dv13_brace_name", "dv13", (S("[TOOL_CALLS]"), T('get_weather{"city": "Oslo"} trailing'))),
    Case(
        "dv13_tool_in_think",
        "dv13",
        (S("[THINK]"), T("hmm"), S("[TOOL_CALLS]"), T("get_weather"), S("[ARGS]"), T("{}")),
    ),
    Case(
        "dv13_tool_choice_none",
        "dv13",
        (T("No tools. "), S("[TOOL_CALLS]"), T("get_weather"), S("[ARGS]"), T('{"city": "Rome"}')),
        tool_choice="none",
    ),
    Case("dv13_content_braces", "dv13", (T('Use {"a": [1]} or {b} here.'),)),
    Case("dv13_name_only_end", "dv13", (T("Let me see."), S("[TOOL_CALLS]"), T("get_weather"))),
    Case(
        "dv13_nested_args",
        "dv13",
        (
            S("[TOOL_CALLS]"),
            T("get_weather"),
            S("[ARGS]"),
            T('{"city": "Paris", "opts": {"a": [1, {"b": null}], "t": true}, "note": "x}y"}'),
        ),
    ),
    Case("dv13_think_unclosed", "dv13", (S("[THINK]"), T("Still thinking about {this}."))),
    Case("dv11_content", "dv11", (T("Hello! How can I help you today?"),), tools=False),
    Case(
        "dv11_think_text_tool",
        "dv11",
        (
            T("<think>Weather needed.</think>"),
            S("[TOOL_CALLS]"),
            T("get_weather"),
            S("[CALL_ID]"),
            T("abc123XYZ"),
            S("[ARGS]"),
            T('{"city": "Paris"}'),
        ),
    ),
    Case("dv7_content", "dv7", (T("Hello! How can I help you today?"),), tools=False),
    Case(
        "dv7_bare_object",
        "dv7",
        (S("[TOOL_CALLS]"), T('{"name": "get_weather", "arguments": {"city": "Paris"}} Anything else?')),
    ),
    Case(
        "dv7_string_args",
        "dv7",
        (S("[TOOL_CALLS]"), T('[{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]')),
    ),
    Case(
        "dv7_nested_args",
        "dv7",
        (
            S("[TOOL_CALLS]"),
            T(
                '[{"name": "get_weather", "arguments": {"city": "Paris", "opts": {"a": [1, {"b": null}], "t": true}, "days": 12}}]'
            ),
        ),
    ),
    Case("dv7_invalid_json", "dv7", (T("Hmm "), S("[TOOL_CALLS]"), T('[{"name": get_weather}] and more'))),
    Case(
        "dv7_required_bare",
        "dv7",
        (T('[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),),
        tool_choice="required",
    ),
    Case(
        "dv7_trailing_content",
        "dv7",
        (S("[TOOL_CALLS]"), T('[{"name": "get_weather", "arguments": {"city": "Rome"}}] Done.')),
    ),
    Case(
        "dv7_tool_choice_none",
        "dv7",
        (S("[TOOL_CALLS]"), T('[{"name": "get_weather", "arguments": {"city": "Rome"}}]')),
        tool_choice="none",
    ),
    Case("dv7_name_only", "dv7", (S("[TOOL_CALLS]"), T('[{"name": "get_weather"}]'))),
    Case(
        "dv7_tool",
        "dv7",
        (S("[TOOL_CALLS]"), T('[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]')),
    ),
    Case(
        "dv7_content_two_tools",
        "dv7",
        (
            T("Sure. "),
            S("[TOOL_CALLS]"),
            T(
                '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]'
            ),
        ),
    ),
]
CASES = {case.name: case for case in CASES_LIST}


def chat_request(case: Case) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": CONFIGS[case.config].served_model_name,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    }
    if case.tools:
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = case.tool_choice
    return body


def output_ids(tokenizer: Any, case: Case) -> list[int]:
    """The engine output: segments encoded with the fixture's tokenizer, then EOS."""
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    for kind, value in case.output:
        ids.extend([vocab[value]] if kind == "special" else tokenizer.encode(value, add_special_tokens=False))
    return [*ids, tokenizer.eos_token_id]


def calls_for(case: Case, prompt: list[int], ids: list[int]) -> list[dict[str, Any]]:
    """The derender calls: one batch call, then one stream per chunking (state echoed)."""
    model = CONFIGS[case.config].served_model_name
    request = chat_request(case)
    rid = f"generate-tokens-chatcmpl-{case.name}"
    choice = gen_choice(0, ids, "stop", None, None, len(ids))
    batch = {
        "model": model,
        "generate_response": gen_response(rid, model, prompt, [choice]),
        "prompt_tokens": len(prompt),
        "prompt_token_ids": prompt,
        "chat_request": request,
    }
    calls: list[dict[str, Any]] = [{"stream": None, "json": batch}]
    for size in CHUNKINGS:
        parts = [ids[i : i + size] for i in range(0, len(ids), size)]
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            chunk = gen_chunk(
                rid, [gen_choice(0, part, "stop" if last else None, None, None, len(ids) if last else None)]
            )
            body: dict[str, Any] = {"stream": True, "model": model, "generate_chunk": chunk}
            body["prompt_tokens"] = len(prompt)
            body["prompt_token_ids"] = prompt
            body["chat_request"] = request
            calls.append({"stream": size, "json": body})
        calls.append(
            {
                "stream": size,
                "json": {
                    "stream": True,
                    "model": model,
                    "generate_chunk": gen_chunk(rid, [], usage(len(prompt), len(ids))),
                },
            }
        )
    return calls


Sender = Callable[[dict[str, Any]], tuple[int, Any]]


def drive(calls: list[dict[str, Any]], sender: Sender) -> list[dict[str, Any]]:
    """Send every call; within a stream the previous response's `stream_state` goes into the next."""
    out = []
    state: Any = None
    current: Any = None
    for call in calls:
        body = copy.deepcopy(call["json"])
        if call["stream"] is not None:
            if call["stream"] != current:
                current, state = call["stream"], None
            elif state is not None:
                body = with_state(body, state)
        request = {"method": "POST", "path": CHAT_DERENDER, "headers": {}, "json": body}
        status, response = sender(request)
        if call["stream"] is not None and isinstance(response, dict):
            state = response.get("stream_state")
        out.append({"stream": call["stream"], "request": request, "status": status, "response": response})
    return out


def mistral_tokenizer(model_dir: str | Path) -> Any:
    from render_service.model.mistral import MistralTokenizer

    return MistralTokenizer(model_dir)


def prompt_for(model_dir: str | Path, case: Case) -> list[int]:
    """Our render of the case's chat request (the prompt the engine would have seen)."""
    from render_service.render.renderers.mistral import MistralRenderer

    renderer = MistralRenderer(mistral_tokenizer(model_dir))
    request = chat_request(case)
    return renderer.encode(request["messages"], request.get("tools"), False, None)


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def main(argv: list[str] | None = None) -> int:
    from tests.mistral_fixture import build_mistral_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    import httpx

    with tempfile.TemporaryDirectory(prefix="mistral-derender-") as tmp:
        for config_name, config in CONFIGS.items():
            model_dir = build_mistral_model(Path(tmp) / config.family, config.family)
            tokenizer = mistral_tokenizer(model_dir)
            oracle = start_oracle(config, model_dir, port)
            try:
                with httpx.Client(base_url=oracle.base_url, timeout=120) as client:
                    for case in (c for c in CASES_LIST if c.config == config_name):
                        prompt = prompt_for(model_dir, case)
                        calls = drive(calls_for(case, prompt, output_ids(tokenizer, case)), lambda r: send(client, r))
                        record = {
                            "case": case.name,
                            "config": config_name,
                            "vllm_flags": config.vllm_flags(),
                            "vllm_version": VLLM_VERSION,
                            "calls": calls,
                        }
                        golden_path(case.name).write_text(
                            json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8"
                        )
                        print(f"[{config_name}] {case.name}: {[c['status'] for c in calls]}", flush=True)
            finally:
                oracle.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
