"""Record the multimodal render goldens (tests/parity/golden_mm/) from vLLM 0.33.0's render tier.

    python -m tests.parity.record_mm --oracle-url http://127.0.0.1:PORT [--only NAME ...]

    python -m tests.parity.record_mm --oracle-url http://127.0.0.1:PORT --kwargs server|trust

`--kwargs server` records mm_corpus.kwargs_cases() into golden_mm_kwargs/, from an oracle started
with mm_corpus.KWARGS_FLAGS added (--trust-request-mm-kwargs and a server-wide
--mm-processor-kwargs); `--kwargs trust` records trust_cases() into golden_mm_trust/ from one with
TRUST_FLAGS added.

The oracle must serve the Qwen3-VL example folder by the relative path mm_corpus.MM_MODEL_DIR
(vLLM hashes images with the model path as given), from a working folder that holds it; the tests
serve it the same way (mm_corpus.mm_model_folder). For example:

    cd "$(mktemp -d)" && PYTHONPATH=$REPO python -m render_service.model.example tinyvl-mm qwen3-vl
    PYTHONPATH=$VLLM_TORCHVISION_OVERLAY VLLM_TARGET_DEVICE=cpu $VLLM_ORACLE_PYTHON -m vllm.entrypoints.cli.main \\
        launch render tinyvl-mm --port PORT --served-model-name tinyvl --max-model-len 16384

vLLM 0.33's Qwen2-VL/Qwen3-VL modules import torchvision, which the CPU oracle venv lacks. The
goldens were recorded with the PyPI torchvision 0.28.0 wheel (the one matching torch 2.13)
installed with `pip install --no-deps --target $VLLM_TORCHVISION_OVERLAY torchvision==0.28.0`; its CUDA `_C`
extension cannot load next to CPU torch, so `torchvision/__init__.py` there imports
`_meta_registrations`/`_autograd_registrations` only `if extension._has_ops()` (they only
register detection ops; the resize vLLM uses is pure torch). Not imported by the tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from .mm_corpus import KWARGS_FLAGS, MM_MODEL_DIR, TRUST_FLAGS, cases, endpoint, kwargs_cases, shrink, trust_cases

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_mm"
# --kwargs: (golden folder, oracle flags, cases)
CONFIGS = {
    "server": ("golden_mm_kwargs", KWARGS_FLAGS, kwargs_cases),
    "trust": ("golden_mm_trust", TRUST_FLAGS, trust_cases),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oracle-url", required=True)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--kwargs", choices=sorted(CONFIGS), help="a kwargs oracle configuration's cases")
    args = parser.parse_args()
    golden_dir, flags, make_cases = GOLDEN_DIR, None, cases
    if args.kwargs:
        folder, flags, make_cases = CONFIGS[args.kwargs]
        golden_dir = GOLDEN_DIR.parent / folder
    golden_dir.mkdir(exist_ok=True)
    with httpx.Client(base_url=args.oracle_url, timeout=1200) as client:
        version = client.get("/version").json().get("version")
        for name, case in make_cases().items():
            if args.only and name not in args.only:
                continue
            path, body = endpoint(case)
            response = client.post(path, json=body)
            record = {
                "name": name,
                "oracle": f"vllm {version} launch render",
                "model_dir": MM_MODEL_DIR,
                **({"oracle_flags": flags} if flags else {}),
                "path": path,
                "request": body,
                "status": response.status_code,
                "response": shrink(response.json()),
            }
            (golden_dir / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            print(f"{name}: {response.status_code}", flush=True)


if __name__ == "__main__":
    main()
