"""Record the LoRA goldens from vLLM 0.33.0's render tier (`vllm launch render --lora-modules ...`).

    VLLM_ORACLE_PYTHON=/path/to/vllm033/bin/python python -m tests.parity.record_lora [--only NAME ...]

For each config in lora_corpus.CONFIGS (without and with VLLM_ALLOW_RUNTIME_LORA_UPDATING): build
the example model and an adapter folder in a temp dir, start the oracle with the config's flags and
environment, send each case in corpus order, write tests/parity/golden_lora/<case>.json, and stop
the oracle by its PID. Not imported by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

from render_service import VLLM_VERSION

from .corpus import ServerConfig, free_port, send, start_oracle
from .lora_corpus import CASES, CONFIGS, GOLDEN_LORA_DIR, MAX_MODEL_LEN, SERVED, LoRAConfig, golden_path, write_adapter


class _OracleConfig(ServerConfig):
    """corpus.start_oracle's config, with the LoRA flags appended."""

    extra_flags: tuple[str, ...] = ()

    def vllm_flags(self) -> list[str]:
        return list(self.extra_flags)


def record_config(config: LoRAConfig, model_dir: Path, adapter_dir: Path, only: set[str]) -> None:
    cases = [c for c in CASES if c.config == config.name and (not only or c.name in only)]
    if not cases:
        return
    flags = config.vllm_flags(str(adapter_dir))
    oracle_config = _OracleConfig(config.name, served_model_name=SERVED, max_model_len=MAX_MODEL_LEN)
    object.__setattr__(oracle_config, "extra_flags", tuple(flags))
    saved = {name: os.environ.get(name) for name in config.env()}
    os.environ.update(config.env())  # start_oracle passes the environment on
    port = free_port()
    print(f"[{config.name}] oracle on :{port}, {config.env()}, flags {' '.join(flags)}", flush=True)
    try:
        oracle = start_oracle(oracle_config, model_dir, port)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        for case in cases:
            request = case.request(str(adapter_dir))
            # A fresh connection per case: uvicorn drops the connection after vLLM's unhandled 500s.
            with httpx.Client(base_url=oracle.base_url, timeout=120) as client:
                status, response = send(client, request)
            record = {
                "case": case.name,
                "config": case.config,
                "expect": case.expect,
                "vllm_flags": flags,
                "env": config.env(),
                "vllm_version": VLLM_VERSION,
                "model_dir": str(model_dir),
                "adapter_dir": str(adapter_dir),
                "request": request,
                "status": status,
                "response": response,
            }
            golden_path(case.name).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", "utf-8")
            print(f"[{config.name}] {case.name}: {status}", flush=True)
    finally:
        oracle.stop()
        print(f"[{config.name}] oracle (pid {oracle.pid}) stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=[], help="case names to record")
    args = parser.parse_args(argv)
    GOLDEN_LORA_DIR.mkdir(parents=True, exist_ok=True)
    from render_service.model.example import build_example_model

    with tempfile.TemporaryDirectory(prefix="lora-parity-") as scratch:
        model_dir = build_example_model(Path(scratch) / "qwen3", "qwen3")
        adapter_dir = write_adapter(Path(scratch) / "sql-adapter")
        for config in CONFIGS.values():
            record_config(config, Path(model_dir), adapter_dir, set(args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
