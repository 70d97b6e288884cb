"""Record the Mistral renderer parity goldens from vLLM 0.33.0's render tier (`vllm launch render`).

    python -m tests.parity.record_mistral [--only NAME ...] [--config NAME ...] [--port PORT]

For each config in mistral_corpus.CONFIGS with selected cases: build its Mistral-format folder
(`tests.mistral_fixture`) in a temp dir, start the oracle with the config's flags (the python of
VLLM_ORACLE_PYTHON, a vLLM 0.33 env with mistral-common), send each case, write
tests/parity/golden_mistral/<case>.json, and stop the oracle by its PID.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import httpx

from render_service import VLLM_VERSION
from tests.mistral_fixture import build_mistral_model

from .corpus import free_port, send, start_oracle
from .mistral_corpus import CASES, CONFIGS, GOLDEN_MISTRAL_DIR, Case, golden_path


def record_config(config_name: str, cases: list[Case], model_dir: Path, port: int) -> None:
    config = CONFIGS[config_name]
    print(f"[{config_name}] starting oracle on :{port} with {' '.join(config.vllm_flags())}", flush=True)
    oracle = start_oracle(config, model_dir, port)
    try:
        with httpx.Client(base_url=oracle.base_url, timeout=120) as client:
            for case in cases:
                status, response = send(client, case.request())
                record = {
                    "case": case.name,
                    "config": case.config,
                    "tokenizer_version": config.family,
                    "vllm_flags": config.vllm_flags(),
                    "vllm_version": VLLM_VERSION,
                    "model_dir": str(model_dir),
                    "request": case.request(),
                    "status": status,
                    "response": response,
                }
                golden_path(case.name).write_text(
                    json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
                )
                print(f"[{config_name}] {case.name}: {status}", flush=True)
    finally:
        oracle.stop()
        print(f"[{config_name}] oracle (pid {oracle.pid}) stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=[], help="case names to record")
    parser.add_argument("--config", nargs="+", default=[], help="configs to record")
    parser.add_argument("--port", type=int, default=0, help="oracle port (default: a free one)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.only if n not in CASES] + [c for c in args.config if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown case/config names: {unknown}")
    selected = [
        c
        for c in CASES.values()
        if (not args.only or c.name in args.only) and (not args.config or c.config in args.config)
    ]
    GOLDEN_MISTRAL_DIR.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="mistral-models-") as tmp:
        for config_name, config in CONFIGS.items():
            cases = [c for c in selected if c.config == config_name]
            if cases:
                model_dir = build_mistral_model(Path(tmp) / config.family, config.family)
                record_config(config_name, cases, model_dir, port)
    print(f"recorded {len(selected)} case(s) into {GOLDEN_MISTRAL_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
