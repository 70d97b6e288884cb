"""Record the render parity goldens from vLLM 0.33.0's render tier (`vllm launch render`).

    python -m tests.parity.record [--only NAME ...] [--config NAME ...] [--model-dir DIR]
                                  [--deepseek-model-dir DIR] [--port PORT]

For each server config in corpus.CONFIGS that has selected cases: build the model folder into a
temp dir (or use --model-dir / --deepseek-model-dir), start the oracle with the config's flags
(with the python of VLLM_ORACLE_PYTHON, a vLLM 0.33 env), send each case with
httpx, write tests/parity/golden/<case>.json, and stop the oracle by its PID.

Not imported by the tests: everything they share lives in corpus.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

from .corpus import (
    CASES,
    CONFIGS,
    GOLDEN_DIR,
    Case,
    free_port,
    golden_path,
    golden_record,
    send,
    start_oracle,
)


def build_model(family: str, root: Path) -> Path:
    from render_service.model.example import build_example_model

    return build_example_model(root / family, family)


def record_config(config_name: str, cases: list[Case], model_dir: Path, port: int) -> None:
    config = CONFIGS[config_name]
    print(f"[{config_name}] starting oracle on :{port} with {' '.join(config.vllm_flags())}", flush=True)
    oracle = start_oracle(config, model_dir, port)
    try:
        with httpx.Client(base_url=oracle.base_url, timeout=120) as client:
            for case in cases:
                status, response = send(client, case.request())
                record = golden_record(case, status, response, str(model_dir))
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
    parser.add_argument("--config", nargs="+", default=[], help="server configs to record")
    parser.add_argument("--model-dir", type=Path, help="an existing qwen3 example model folder")
    parser.add_argument("--deepseek-model-dir", type=Path, help="an existing deepseek example model folder")
    parser.add_argument("--port", type=int, default=0, help="oracle port (default: a free one)")
    parser.add_argument("--prune", action="store_true", help="delete goldens of cases no longer in the corpus")
    args = parser.parse_args(argv)

    unknown = [n for n in args.only if n not in CASES] + [c for c in args.config if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown case/config names: {unknown}")
    selected = [
        c
        for c in CASES.values()
        if (not args.only or c.name in args.only) and (not args.config or c.config in args.config)
    ]
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    if args.prune:
        for path in GOLDEN_DIR.glob("*.json"):
            if path.stem not in CASES:
                path.unlink()

    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="parity-models-") as tmp:
        dirs: dict[str, Path] = {}
        if args.model_dir:
            dirs["qwen3"] = args.model_dir.resolve()
        if args.deepseek_model_dir:
            dirs["deepseek"] = args.deepseek_model_dir.resolve()
        for config_name in CONFIGS:
            cases = [c for c in selected if c.config == config_name]
            if not cases:
                continue
            family = CONFIGS[config_name].family
            if family not in dirs:
                dirs[family] = build_model(family, Path(tmp))
            record_config(config_name, cases, dirs[family], port)
    print(f"recorded {len(selected)} case(s) into {GOLDEN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
