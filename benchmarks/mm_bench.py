"""CPU per chat render with 1 and 4 images of 1280x720 (JPEG): render-service vs `vllm launch render`.

    python benchmarks/mm_bench.py --oracle-url http://127.0.0.1:PORT --oracle-pid PID [--n 5]

Ours runs in-process (TestClient; the model folder must be mm_corpus.MM_MODEL_DIR); the oracle's
CPU is read from /proc/PID (process and reaped children). "first" uses a new image per request,
"repeated" re-sends one image (vLLM's render always reprocesses: it calls the processor with
the cache off). Reports CPU seconds per request and the ratio; run side by side on one machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parity"))
from mm_corpus import MM_MAX_MODEL_LEN, MM_MODEL_DIR, MM_MODEL_NAME, data_url, make_image


def _body(urls: list[str]) -> dict:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": MM_MODEL_NAME, "messages": [{"role": "user", "content": [*content,
                                                                              {"type": "text", "text": "?"}]}]}


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oracle-url", required=True)
    parser.add_argument("--oracle-pid", type=int, required=True)
    parser.add_argument("--n", type=int, default=5)
    args = parser.parse_args()
    from starlette.testclient import TestClient

    from render_service.app import create_app
    from render_service.settings import Settings

    seed = iter(range(1000, 100000))
    settings = Settings(model=MM_MODEL_DIR, served_model_name=[MM_MODEL_NAME], max_model_len=MM_MAX_MODEL_LEN)
    with TestClient(create_app(settings.validate())) as ours, httpx.Client(base_url=args.oracle_url,
                                                                          timeout=600) as oracle:
        for images in (1, 4):
            for mode in ("first", "repeated"):
                fixed = [data_url(make_image(1280, 720, next(seed)), "JPEG", quality=85) for _ in range(images)]
                bodies = [_body(fixed if mode == "repeated" else
                                [data_url(make_image(1280, 720, next(seed)), "JPEG", quality=85)
                                 for _ in range(images)]) for _ in range(args.n)]
                if mode == "repeated":  # warm both sides once
                    ours.post("/v1/chat/completions/render", json=bodies[0])
                    oracle.post("/v1/chat/completions/render", json=bodies[0])
                start = time.process_time()
                for body in bodies:
                    assert ours.post("/v1/chat/completions/render", json=body).status_code == 200
                mine = (time.process_time() - start) / args.n
                start = _proc_cpu(args.oracle_pid)
                for body in bodies:
                    assert oracle.post("/v1/chat/completions/render", json=body).status_code == 200
                theirs = (_proc_cpu(args.oracle_pid) - start) / args.n
                print(f"{images} image(s) {mode:8s}: ours {mine * 1000:8.1f} ms CPU/req, vLLM {theirs * 1000:8.1f} "
                      f"ms CPU/req, vLLM/ours {theirs / mine:6.1f}x", flush=True)


if __name__ == "__main__":
    main()
