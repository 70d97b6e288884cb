"""Record the parser-family goldens (tests/parity/golden_parsers/) from vLLM 0.33.0's render tier.

    python -m tests.parity.record_families [--config NAME ...] [--only CASE ...] [--models DIR] [--port PORT]

For each server config of family_corpus.py: build the family's fixture folder (tests/parsers/families/)
into a temp dir (or reuse DIR/<family>), start `vllm launch render` on it with the config's parser flags
(corpus.py `start_oracle`), send every render case and every derender case (rendered first for its
prompt ids, then driven like an llm-d client), and write golden_parsers/<family>/<case>.json. The
oracle is stopped by its PID.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx

from tests.parity.corpus import VLLM_VERSION, send, start_oracle
from tests.parity.derender_corpus import drive, dump_golden, golden_record, prompt_ids_from_render
from tests.parity.family_corpus import (
    FAMILY_CONFIGS,
    MODEL_FAMILIES,
    FamilyCorpus,
    build_corpus_from_dirs,
    golden_path,
)


def model_dirs(root: Path) -> dict[str, Path]:
    out = {}
    for name, family in MODEL_FAMILIES.items():
        path = root / name
        out[name] = path if (path / "tokenizer.json").exists() else family.builder(path)
    return out


def record_config(config: str, corpus: FamilyCorpus, only: set[str], model_dir: Path, port: int) -> int:
    renders = [r for r in corpus.renders if r.config == config and (not only or r.name in only)]
    cases = [c for c in corpus.cases if c.config == config and (not only or c.name in only)]
    if not renders and not cases:
        return 0
    server = FAMILY_CONFIGS[config]
    print(f"[{config}] starting oracle on :{port} with {' '.join(server.vllm_flags())}", flush=True)
    oracle = start_oracle(server, model_dir, port)
    written = 0
    try:
        with httpx.Client(base_url=oracle.base_url, timeout=300) as client:
            for r in renders:
                status, body = send(client, r.request())
                record = {
                    "case": r.name,
                    "config": config,
                    "vllm_flags": server.vllm_flags(),
                    "vllm_version": VLLM_VERSION,
                    "kind": "render",
                    "calls": [{"request": r.request(), "status": status, "response": body}],
                }
                path = golden_path(config, r.name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(dump_golden(record), encoding="utf-8")
                written += 1
                print(f"[{config}] {r.name}: render {status}", flush=True)
            for case in cases:
                render = case.render_request()
                prompts = prompt_ids_from_render(case.endpoint, *send(client, render)) if render else []
                calls = drive(case, prompts, lambda request: send(client, request))
                path = golden_path(config, case.name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(dump_golden(golden_record(case, prompts, calls)), encoding="utf-8")
                written += 1
                print(
                    f"[{config}] {case.name}: {len(calls)} call(s) {sorted({c['status'] for c in calls})}", flush=True
                )
    finally:
        oracle.stop()
        print(f"[{config}] oracle (pid {oracle.pid}) stopped", flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", default=[], choices=sorted(FAMILY_CONFIGS))
    ap.add_argument("--only", nargs="+", default=[])
    ap.add_argument("--models", type=Path, help="reuse fixture folders DIR/<family>")
    ap.add_argument("--port", type=int, default=18467)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="family-models-") as tmp:
        dirs = model_dirs(args.models or Path(tmp))
        corpus = build_corpus_from_dirs(dirs)
        total = 0
        for config in args.config or list(FAMILY_CONFIGS):
            family = FAMILY_CONFIGS[config].family
            total += record_config(config, corpus, set(args.only), dirs[family], args.port)
    print(f"recorded {total} golden(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
