"""llm-d's coordinator P/D flow, run for real: render here, prefill on one vLLM engine, decode on another,
derender here while the decode streams.

    render   POST {render}/v1/chat/completions/render            OpenAI body -> GenerateRequest
    prefill  POST {prefill}/inference/v1/generate                the GenerateRequest with max_tokens 1
                                                                 and kv_transfer_params {do_remote_decode: true}
    decode   POST {decode}/inference/v1/generate (stream)        the GenerateRequest with the prefill's
                                                                 kv_transfer_params
    derender POST {render}/v1/chat/completions/derender          one call per engine chunk, echoing stream_state

`python -m examples.pd_flow` (from the repository root) starts everything (this render service, two vLLM CPU `--tokens-only`
engines with the tiny weighted test model), runs one request and stops them. With `--render`,
`--prefill` and `--decode` it uses servers that are already running.

KV transfer: NIXL is not installed in the CPU engine build here, so NixlConnector cannot run. The
engines use vLLM's reference shared-storage connector (`ExampleConnector`, llm-d's `shared_storage`
connector shape: the prefill body carries only `do_remote_decode`): the prefill engine writes the
prompt's KV blocks to a directory, the decode engine finds them by prompt hash and loads them
(block-aligned; the tail is recomputed). The flow proves the load from the decode engine's own
counter, `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`, and checks that the
decode's first token and logprob equal the prefill's. `--connector none` starts engines without a
connector: the decode engine then recomputes the whole prompt, and the output says so.

The tiny model has random weights, so the generated text is noise; the wire flow is the point.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx

SERVED_NAME = "tinyqwen3"
RENDER_FLAGS = (
    "--served-model-name",
    SERVED_NAME,
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--max-model-len",
    "4096",
    "--workers",
    "1",
)
# The smallest engine that works here (see tests/integration/engine_fixture.py): 2 GiB KV, eager, 4 seqs.
ENGINE_FLAGS = ("--max-num-seqs", "4")
MAX_TOKENS = 24  # not 16: msgspec omits SamplingParams' default, and the engine then fills the context
KV_SOURCE = re.compile(
    r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} (\S+)$', re.MULTILINE
)


def log(step: str, message: str) -> None:
    print(f"[{step:>8}] {message}", flush=True)


def chat_request(nonce: str) -> dict[str, Any]:
    """A prompt of a few hundred tokens (the connector moves whole 128-token blocks); the nonce makes
    its KV new on every run, so the prefill really computes it."""
    log_lines = "\n".join(
        f"- {hour:02d}:00 beam {hour % 3}, wind {10 + hour} knots, gulls {hour * 7 % 11}" for hour in range(24)
    )
    return {
        "model": SERVED_NAME,
        "messages": [
            {"role": "system", "content": f"Run {nonce}. You are the keeper's assistant; answer in one line."},
            {
                "role": "user",
                "content": f"Here is tonight's lighthouse log:\n{log_lines}\nWhen was the wind "
                "strongest, and which beam was lit then?",
            },
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
    }


def external_kv_tokens(engine: str) -> float:
    """The decode engine's own count of prompt tokens that came from the KV connector."""
    text = httpx.get(f"{engine}/metrics", timeout=10).text
    match = KV_SOURCE.search(text)
    return float(match.group(1)) if match else 0.0


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> Any:
    response = client.post(url, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url} -> {response.status_code}: {response.text[:500]}")
    return response.json()


def sse_chunks(client: httpx.Client, url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"POST {url} -> {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: ") :])


def first_logprob(choice: dict[str, Any]) -> tuple[int, float]:
    entry = choice["logprobs"]["content"][0]
    return entry["token_id"], entry["logprob"]


def run_flow(render: str, prefill: str, decode: str, connector: str = "shared-storage") -> dict[str, Any]:
    """One request through render -> prefill -> decode (streamed) -> derender; returns what it saw."""
    request = chat_request(uuid.uuid4().hex[:8])
    with httpx.Client(http1=True, timeout=300) as client:
        # 1. Render here.
        response = client.post(f"{render}/v1/chat/completions/render", json=request)
        if response.status_code != 200:
            raise RuntimeError(f"render -> {response.status_code}: {response.text[:500]}")
        rendered = response.json()
        prompt_ids = rendered["token_ids"]
        log(
            "render",
            f"{render}: {len(prompt_ids)} prompt tokens, request_id {rendered['request_id']}, "
            f"fingerprint {response.headers.get('x-render-fingerprint', '-')}",
        )

        # 2. Prefill: the coordinator's copy asks for one token and a remote decode.
        prefill_body = json.loads(json.dumps(rendered))
        prefill_body["sampling_params"]["max_tokens"] = 1
        prefill_body["kv_transfer_params"] = {"do_remote_decode": True}
        prefill_body["stream"] = False
        prefilled = post(client, f"{prefill}/inference/v1/generate", prefill_body)
        kv_params = prefilled.get("kv_transfer_params")
        prefill_token, prefill_logprob = first_logprob(prefilled["choices"][0])
        log(
            "prefill",
            f"{prefill}: {prefilled['usage']['prompt_tokens']} prompt tokens computed, first token "
            f"{prefill_token} (logprob {prefill_logprob:.6f}); returned kv_transfer_params: "
            f"{json.dumps(kv_params)}",
        )

        # 3. Decode on the other engine with the prefill's kv_transfer_params, streaming.
        before = external_kv_tokens(decode)
        decode_body = json.loads(json.dumps(rendered))
        decode_body["kv_transfer_params"] = kv_params
        decode_body["stream"] = True

        # 4. Derender each engine chunk here, echoing stream_state as llm-d does.
        state = None
        content, reasoning = [], []
        finish = None
        chunks = 0
        decode_first: tuple[int, float] | None = None
        for chunk in sse_chunks(client, f"{decode}/inference/v1/generate", decode_body):
            choice = chunk["choices"][0]
            if decode_first is None and choice.get("logprobs"):
                decode_first = first_logprob(choice)
            derendered = post(
                client,
                f"{render}/v1/chat/completions/derender",
                {
                    "model": SERVED_NAME,
                    "stream": True,
                    "generate_chunk": chunk,
                    "stream_state": state,
                    "chat_request": request,
                    "prompt_token_ids": prompt_ids,
                },
            )
            state = derendered["stream_state"]
            chunks += 1
            for out in derendered["chunk"]["choices"]:
                delta = out["delta"]
                content.append(delta.get("content") or "")
                reasoning.append(delta.get("reasoning") or "")
                if out.get("finish_reason"):
                    finish = out["finish_reason"]
                if chunks <= 3 or out.get("finish_reason"):
                    log("derender", f"chunk {chunks}: ids {choice['token_ids']} -> delta {json.dumps(delta)[:90]}")
        log("derender", f"stream_state echoed on every call; last keys: {', '.join(sorted(state or {}))}")
        loaded = external_kv_tokens(decode) - before
        if connector == "none":
            log(
                "decode",
                f"{decode}: no KV connector, so the decode engine recomputed all {len(prompt_ids)} "
                f"prompt tokens ({loaded:.0f} loaded)",
            )
        else:
            log(
                "decode",
                f"{decode}: loaded {loaded:.0f} of {len(prompt_ids)} prompt tokens through the KV "
                f"connector (block-aligned), recomputed {len(prompt_ids) - loaded:.0f}",
            )
        if decode_first is not None:
            same = decode_first[0] == prefill_token and abs(decode_first[1] - prefill_logprob) < 1e-3
            log(
                "decode",
                f"first token {decode_first[0]} (logprob {decode_first[1]:.6f}): "
                f"{'matches' if same else 'DIFFERS FROM'} the prefill engine's",
            )
        log(
            "result",
            f"{chunks} chunks derendered, finish_reason {finish}; content {''.join(content)!r}"
            f"{'; reasoning ' + repr(''.join(reasoning)) if any(reasoning) else ''}",
        )
        return {
            "prompt_tokens": len(prompt_ids),
            "prefill_token": prefill_token,
            "prefill_logprob": prefill_logprob,
            "decode_first": decode_first,
            "kv_transfer_params": kv_params,
            "loaded": loaded,
            "chunks": chunks,
            "finish_reason": finish,
            "content": "".join(content),
            "reasoning": "".join(reasoning),
            "stream_state": state,
        }


@contextmanager
def stack(connector: str = "shared-storage") -> Iterator[tuple[str, str, str]]:
    """This render service and two vLLM CPU `--tokens-only` engines (one after the other: 2 cores)."""
    from tests.helpers import service
    from tests.integration.engine_fixture import build_weighted_model, start_engine

    model = build_weighted_model()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pd-kv-") as kv_dir:
        flags: tuple[str, ...] = ENGINE_FLAGS
        if connector == "shared-storage":
            config = {
                "kv_connector": "ExampleConnector",
                "kv_role": "kv_both",
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"shared_storage_path": kv_dir},
            }
            flags = (*flags, "--kv-transfer-config", json.dumps(config))
        render = stack.enter_context(service(model, *RENDER_FLAGS))
        log("start", f"render service {render}")
        for role in ("prefill", "decode"):
            started = time.monotonic()
            engine = start_engine(model, *flags)
            stack.callback(engine.stop)
            log(
                "start",
                f"{role} engine {engine.url} (vLLM CPU --tokens-only, connector {connector}) "
                f"in {time.monotonic() - started:.0f} s; log {engine.log}",
            )
            if role == "prefill":
                prefill = engine.url
            else:
                decode = engine.url
        yield render, prefill, decode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", help="a running render service (else one is started)")
    parser.add_argument("--prefill", help="a running vLLM --tokens-only engine for prefill")
    parser.add_argument("--decode", help="a running vLLM --tokens-only engine for decode")
    parser.add_argument(
        "--connector",
        choices=("shared-storage", "none"),
        default="shared-storage",
        help="KV connector of the engines this script starts (default: shared-storage)",
    )
    args = parser.parse_args(argv)
    if args.render and args.prefill and args.decode:
        run_flow(args.render, args.prefill, args.decode, args.connector)
        return 0
    if args.render or args.prefill or args.decode:
        parser.error("give all of --render, --prefill and --decode, or none")
    with stack(args.connector) as (render, prefill, decode):
        run_flow(render, prefill, decode, args.connector)
    return 0


if __name__ == "__main__":
    sys.exit(main())
