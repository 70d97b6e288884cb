"""Record the derender parity goldens from vLLM 0.33.0's render tier (`vllm launch render`).

    python -m tests.parity.record_derender [--only NAME ...] [--config NAME ...] [--model-dir DIR]
                                           [--deepseek-model-dir DIR] [--port PORT] [--prune]

For each server config (parsers, plain, deepseek) that has selected cases: build the example model
folders into a temp dir (or use --model-dir / --deepseek-model-dir), build the corpus with their
tokenizers, start the oracle with the config's flags (tests/parity/corpus.py `start_oracle`), and for
each case render its chat/completion request through the oracle to get the prompt token ids, then send
every derender call (streams driven like an llm-d client: the first call without stream_state, then
the returned stream_state echoed each call) and write tests/parity/golden_derender/<case>.json. The
oracle is stopped by its PID.

Not imported by the tests: everything they share lives in derender_corpus.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx

from tests.parity.corpus import CONFIGS, send, start_oracle
from tests.parity.derender_corpus import (
    DERENDER_CONFIGS,
    GOLDEN_DIR,
    DerenderCase,
    build_corpus_from_dirs,
    drive,
    dump_golden,
    golden_path,
    golden_record,
    prompt_ids_from_render,
)


def build_model(family: str, root: Path) -> Path:
    from render_service.model.example import build_example_model

    return build_example_model(root / family, family)


def record_case(client: httpx.Client, case: DerenderCase) -> tuple[int, list[int]]:
    render = case.render_request()
    prompts: list[list[int]] = []
    if render is not None:
        prompts = prompt_ids_from_render(case.endpoint, *send(client, render))
    calls = drive(case, prompts, lambda request: send(client, request))
    text = dump_golden(golden_record(case, prompts, calls))
    golden_path(case.name).write_text(text, encoding="utf-8")
    return len(text.encode()), [c["status"] for c in calls]


def record_config(config_name: str, cases: list[DerenderCase], model_dir: Path, port: int) -> int:
    config = CONFIGS[config_name]
    print(f"[{config_name}] starting oracle on :{port} with {' '.join(config.vllm_flags())}", flush=True)
    oracle = start_oracle(config, model_dir, port)
    total = 0
    try:
        with httpx.Client(base_url=oracle.base_url, timeout=300) as client:
            for case in cases:
                size, statuses = record_case(client, case)
                total += size
                shown = sorted(set(statuses))
                print(
                    f"[{config_name}] {case.name}: {len(statuses)} call(s), status {shown}, {size >> 10} KiB",
                    flush=True,
                )
    finally:
        oracle.stop()
        print(f"[{config_name}] oracle (pid {oracle.pid}) stopped", flush=True)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=[], help="case names to record")
    parser.add_argument("--config", nargs="+", default=[], help="server configs to record")
    parser.add_argument("--model-dir", type=Path, help="an existing qwen3 example model folder")
    parser.add_argument("--deepseek-model-dir", type=Path, help="an existing deepseek example model folder")
    parser.add_argument("--port", type=int, default=18441)
    parser.add_argument("--prune", action="store_true", help="delete goldens of cases no longer in the corpus")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="derender-models-") as tmp:
        dirs: dict[str, Path] = {
            "qwen3": args.model_dir.resolve() if args.model_dir else build_model("qwen3", Path(tmp)),
            "deepseek": (
                args.deepseek_model_dir.resolve() if args.deepseek_model_dir else build_model("deepseek", Path(tmp))
            ),
        }
        cases = build_corpus_from_dirs(dirs)
        unknown = [n for n in args.only if n not in cases] + [c for c in args.config if c not in DERENDER_CONFIGS]
        if unknown:
            parser.error(f"unknown case/config names: {unknown}")
        selected = [
            c
            for c in cases.values()
            if (not args.only or c.name in args.only) and (not args.config or c.config in args.config)
        ]
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        if args.prune:
            for path in GOLDEN_DIR.glob("*.json"):
                if path.stem not in cases:
                    path.unlink()
        total = 0
        for config_name in DERENDER_CONFIGS:
            group = [c for c in selected if c.config == config_name]
            if group:
                total += record_config(config_name, group, dirs[CONFIGS[config_name].family], args.port)
    size = sum(p.stat().st_size for p in GOLDEN_DIR.glob("*.json"))
    print(f"recorded {len(selected)} case(s) ({total >> 10} KiB) into {GOLDEN_DIR}; all goldens {size >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
