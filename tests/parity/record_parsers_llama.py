"""Record the parser-family derender goldens (parsers_llama_corpus.py) from vLLM 0.33's render tier.

    python -m tests.parity.record_parsers_llama [--config NAME ...] [--only CASE ...] [--port PORT]

Builds the fixture folders (tests/parsers/families/llama.py) into a temp dir, starts the oracle per
config with its parser flags, renders each case's request to get the prompt ids, drives every
derender call and writes golden_parsers/<config>/<case>.json. The oracle is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import httpx

from tests.parity.corpus import VLLM_VERSION, send, start_oracle
from tests.parity.derender_corpus import drive, dump_golden, golden_record, prompt_ids_from_render
from tests.parity.parsers_llama_corpus import (
    PARSER_CONFIGS,
    PARSER_FAMILIES,
    build_parser_corpus_from_dirs,
    parser_golden_path,
    render_cases,
    render_golden_path,
)
from tests.parsers.families.llama import build_family


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--port", type=int, default=18731)
    ap.add_argument("--render", action="store_true", help="record only the render goldens")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {f: build_family(Path(tmp) / f, f) for f in PARSER_FAMILIES}
        cases = build_parser_corpus_from_dirs(dirs)
        for name, config in PARSER_CONFIGS.items():
            if args.config and name not in args.config:
                continue
            selected = [c for c in cases.values() if c.config == name and (not args.only or c.name in args.only)]
            renders = [r for r in render_cases() if r[1] == name and (not args.only or r[0] in args.only)]
            if args.render:
                selected = []
            if not selected and not (args.render and renders):
                continue
            print(f"[{name}] oracle with {' '.join(config.vllm_flags())}", flush=True)
            oracle = start_oracle(config, dirs[config.family], args.port)
            try:
                with httpx.Client(base_url=oracle.base_url, timeout=300) as client:
                    for case_name, _config, body in renders if args.render else []:
                        request = {"method": "POST", "path": "/v1/chat/completions/render", "headers": {}, "json": body}
                        status, response = send(client, request)
                        record = {
                            "case": case_name,
                            "config": name,
                            "vllm_flags": config.vllm_flags(),
                            "vllm_version": VLLM_VERSION,
                            "model_dir": str(dirs[config.family]),
                            "request": request,
                            "status": status,
                            "response": response,
                        }
                        path = render_golden_path(name, case_name)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
                        print(f"[{name}] {case_name}: {status}", flush=True)
                    for case in selected:
                        render = case.render_request()
                        prompts = prompt_ids_from_render(case.endpoint, *send(client, render)) if render else []
                        calls = drive(case, prompts, lambda r: send(client, r))
                        path = parser_golden_path(name, case.name)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(dump_golden(golden_record(case, prompts, calls)), encoding="utf-8")
                        print(
                            f"[{name}] {case.name}: {len(calls)} call(s) {sorted({c['status'] for c in calls})}",
                            flush=True,
                        )
            finally:
                oracle.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
