"""Shared by the API golden recorders (record_unions.py, record_derender_schema.py): send a
corpus's cases to vLLM 0.33's render tier and write its answers as the corpus's golden.

Without --oracle-url it builds the qwen3 example model, starts vLLM's render tier with
corpus.CONFIGS["parsers"] flags (the python of VLLM_ORACLE_PYTHON), records, and stops it by its
PID. Not imported by the tests.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from tests.parity.corpus import CONFIGS, VLLM_VERSION, free_port, send, start_oracle

Cases = Callable[[], Iterable[dict[str, Any]]]
Request = Callable[[dict[str, Any]], Any]


def record(base_url: str, golden: Path, cases: Cases, request: Request) -> None:
    records = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for case in cases():
            try:
                status, response = send(client, request(case))
            except httpx.HTTPError as exc:  # vLLM fails inside its app: the connection drops
                status, response = 0, f"{type(exc).__name__}: {exc}"
            records.append({**case, "status": status, "response": response})
    golden.parent.mkdir(exist_ok=True)
    payload = {"vllm_version": VLLM_VERSION, "config": "parsers", "cases": records}
    golden.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    statuses = sorted({r["status"] for r in records})
    print(f"{golden.name}: {len(records)} cases, statuses {statuses}", flush=True)


def main(golden: Path, cases: Cases, request: Request) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oracle-url")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.oracle_url:
        record(args.oracle_url, golden, cases, request)
        return
    from render_service.model.example import build_example_model

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_example_model(Path(scratch) / "qwen3", "qwen3")
        oracle = start_oracle(CONFIGS["parsers"], model_dir, args.port or free_port())
        try:
            record(oracle.base_url, golden, cases, request)
        finally:
            oracle.stop()
