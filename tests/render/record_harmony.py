"""Record the gpt-oss (Harmony) goldens from vLLM 0.33.0's render tier.

    TIKTOKEN_ENCODINGS_BASE=DIR VLLM_ORACLE_PYTHON=... python -m tests.render.record_harmony [--only NAME ...]

Builds the tiny gpt-oss folder (`gpt_oss_model.py`, vocabulary from $TIKTOKEN_ENCODINGS_BASE),
starts `vllm launch render` once per config of `harmony_corpus.CONFIGS` with
VLLM_SYSTEM_START_DATE pinned, and writes tests/render/golden_harmony/<case>.json:

- render cases: {case, config, vllm_flags, vllm_version, model_dir, request, status, response};
- derender cases: the chat request is rendered by the oracle for its prompt ids, then the output
  (Harmony text, tokenized by the folder's tokenizer) is sent as one batch call or as one call
  per engine chunk, each later call echoing the `stream_state` the oracle returned:
  {..., kind, render: {request, prompt_token_ids}, output_token_ids, calls: [{request,
  state_source, status, response}]}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from render_service import VLLM_VERSION
from tests.parity.corpus import free_port, send, start_oracle
from tests.parity.derender_corpus import _seed, chunk_sizes, gen_choice, gen_chunk, gen_response, with_state

from .gpt_oss_model import build_gpt_oss_model
from .harmony_corpus import (
    CHAT,
    CHAT_DERENDER,
    CONFIGS,
    DERENDER_CASES,
    MODEL,
    RENDER_CASES,
    START_DATE,
    DerenderCase,
    golden_path,
)


def output_ids(model_dir: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def derender_calls(case: DerenderCase, prompt: list[int], ids: list[int]) -> list[dict[str, Any]]:
    """The derender requests of a case (stream calls without their echoed state)."""
    rid = f"generate-tokens-chatcmpl-{case.name}"
    common = {"prompt_tokens": len(prompt), "prompt_token_ids": prompt, "chat_request": case.chat_request}
    if case.kind == "batch":
        body = {
            "model": MODEL,
            "generate_response": gen_response(
                rid, MODEL, prompt, [gen_choice(0, ids, case.finish_reason, None, None, len(ids))]
            ),
            **common,
        }
        return [{"request": _post(body), "state_source": "none"}]
    sizes = chunk_sizes(len(ids), "one" if case.kind == "stream1" else "random", _seed(case.name, 0, case.kind))
    calls, start = [], 0
    for k, size in enumerate(sizes):
        last = k == len(sizes) - 1
        choice = gen_choice(0, ids[start : start + size], case.finish_reason if last else None, None, None, None)
        start += size
        body = {"stream": True, "model": MODEL, "generate_chunk": gen_chunk(rid, [choice]), **common}
        calls.append({"request": _post(body), "state_source": "none" if k == 0 else "previous"})
    return calls


def _post(body: dict[str, Any]) -> dict[str, Any]:
    return {"method": "POST", "path": CHAT_DERENDER, "headers": {}, "json": copy.deepcopy(body)}


def record_config(name: str, model_dir: Path, port: int, only: set[str]) -> None:
    config = CONFIGS[name]
    renders = [c for c in RENDER_CASES if c.config == name and (not only or c.name in only)]
    derenders = [c for c in DERENDER_CASES if c.config == name and (not only or c.name in only)]
    if not renders and not derenders:
        return
    oracle = start_oracle(config, model_dir, port)  # type: ignore[arg-type]  # duck-typed ServerConfig
    head = {
        "config": name,
        "vllm_flags": config.vllm_flags(),
        "vllm_version": VLLM_VERSION,
        "model_dir": str(model_dir),
    }
    try:
        with httpx.Client(base_url=oracle.base_url, timeout=120) as client:
            for case in renders:
                status, response = send(client, case.request())
                record = {"case": case.name, **head, "request": case.request(), "status": status, "response": response}
                _write(case.name, record)
                print(f"[{name}] {case.name}: {status}", flush=True)
            for dcase in derenders:
                render_request = {"method": "POST", "path": CHAT, "headers": {}, "json": dcase.chat_request}
                status, rendered = send(client, render_request)
                assert status == 200, (dcase.name, rendered)
                prompt = rendered["token_ids"]
                ids = output_ids(model_dir, dcase.output)
                calls, state = [], None
                for spec in derender_calls(dcase, prompt, ids):
                    request = spec["request"]
                    if spec["state_source"] == "previous" and state is not None:
                        request = {**request, "json": with_state(request["json"], state)}
                    status, response = send(client, request)
                    if dcase.kind != "batch" and status == 200:
                        state = response.get("stream_state")
                    calls.append({**spec, "status": status, "response": response})
                record = {
                    "case": dcase.name,
                    **head,
                    "kind": dcase.kind,
                    "render": {"request": render_request, "prompt_token_ids": prompt},
                    "output_token_ids": ids,
                    "calls": calls,
                }
                _write(dcase.name, record)
                print(f"[{name}] {dcase.name}: {[c['status'] for c in calls][:3]}... ({len(calls)} calls)", flush=True)
    finally:
        oracle.stop()


def _write(name: str, record: dict[str, Any]) -> None:
    path = golden_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=[], help="case names to record")
    parser.add_argument("--config", nargs="+", default=list(CONFIGS), help="configs to record")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ["VLLM_SYSTEM_START_DATE"] = START_DATE  # inherited by the oracle
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_gpt_oss_model(Path(scratch) / "tinygptoss")
        for name in args.config:
            record_config(name, model_dir, args.port or free_port(), set(args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
