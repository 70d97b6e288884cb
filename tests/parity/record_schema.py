"""Record the schema parity goldens (tests/parity/golden_schema/<route>.json) from vLLM 0.33.

    python -m tests.parity.record_schema --oracle-url http://127.0.0.1:PORT [--route NAME ...]

The oracle serves the qwen3 example model with corpus.CONFIGS["parsers"] flags (record.py shows
how to start one). Not imported by the tests.
"""

from __future__ import annotations

import argparse
import json

import httpx

from tests.parity.corpus import VLLM_VERSION, send
from tests.parity.schema_corpus import GOLDEN_DIR, ROUTES, cases, request


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oracle-url", required=True)
    parser.add_argument("--route", nargs="*", default=list(ROUTES))
    args = parser.parse_args()
    GOLDEN_DIR.mkdir(exist_ok=True)
    with httpx.Client(base_url=args.oracle_url, timeout=120) as client:
        for route in args.route:
            records = []
            for body in cases(route):
                try:
                    status, response = send(client, request(route, body))
                except httpx.HTTPError as exc:  # vLLM fails inside its app: the connection drops
                    status, response = 0, f"{type(exc).__name__}: {exc}"
                records.append({"body": body, "status": status, "response": response})
            path = GOLDEN_DIR / f"{route}.json"
            payload = {"vllm_version": VLLM_VERSION, "route": route, "cases": records}
            path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            statuses = sorted({r["status"] for r in records})
            print(f"{route}: {len(records)} cases, statuses {statuses}", flush=True)


if __name__ == "__main__":
    main()
