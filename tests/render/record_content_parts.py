"""Record tests/render/golden/content_parts.json from vLLM 0.33.0's render tier.

Start two oracles on the example model (`render-service example-model DIR`) and point this at them:

    vllm launch render DIR --port P1 --served-model-name m --max-model-len 2048 \
        --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes
    (the same with --port P2 --chat-template-content-format openai)
    python -m tests.render.record_content_parts --string-url http://127.0.0.1:P1 --openai-url http://127.0.0.1:P2

The "openai" configuration keeps only the cases whose answer differs from the "string" one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

from tests.render.content_parts_matrix import TOKENIZE, cases

GOLDEN = Path(__file__).resolve().parent / "golden" / "content_parts.json"
VLLM_VERSION = "0.33.0"


def answer(response: httpx.Response, path: str) -> dict[str, Any]:
    """What the test compares: the error, or the ids a success rendered."""
    body = response.json()
    if response.status_code != 200:
        return {"error": body["error"]}
    if path == TOKENIZE:
        return {"tokens": body["tokens"]}
    return {"token_ids": body["token_ids"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--string-url", required=True)
    parser.add_argument("--openai-url", required=True)
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    with httpx.Client(timeout=60) as client:
        for name, path, body in cases():
            by_config = {}
            for config, url in (("string", args.string_url), ("openai", args.openai_url)):
                response = client.post(url + path, json=body)
                by_config[config] = {"status": response.status_code, **answer(response, path)}
            records.append({"case": name, "config": "string", "path": path, "body": body, **by_config["string"]})
            if by_config["openai"] != by_config["string"]:
                records.append({"case": name, "config": "openai", "path": path, "body": body, **by_config["openai"]})
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"vllm_version": VLLM_VERSION, "cases": records}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(records)} answers -> {GOLDEN}")


if __name__ == "__main__":
    main()
