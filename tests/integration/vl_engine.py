"""A real vLLM engine for the tiny Qwen3-VL model: random weights, the torchvision overlay, the engine process.

`build_weighted_vl_model()` writes the `qwen3-vl` example folder (render_service.model.example: Qwen3
tokenizer, Qwen3-VL processor settings, a 2-layer 64-wide text model and a 2-block 64-wide vision
tower with one deepstack merger) and adds random bf16 weights written by transformers in the engine
venv. Weights are drawn with std WEIGHT_STD instead of the config's 0.02: at 0.02 the tiny model's
greedy tokens do not depend on the image at all (the same token repeats for any pixels), so a
token comparison could not fail; at 0.2 they change when the pixels change.

vLLM cannot start a plain `--tokens-only` engine for this model (nor any model whose multimodal processor
needs a tokenizer, in vLLM 0.32 and 0.33): `--tokens-only` forces `skip_tokenizer_init=True`, and both the
API server's renderer and the engine core's encoder budget (vllm/multimodal/encoder_budget.py) build the
multimodal processor at start-up even though /inference/v1/generate with `features` never calls it;
`BaseMultiModalProcessor.__init__` then raises "Qwen3VLMultiModalProcessor requires a tokenizer and cannot
be initialized when `skip_tokenizer_init=True`" (vllm/multimodal/processing/processor.py:1047,
`requires_tokenizer`; vllm #54670, #54886 added the check, #54904 to load the tokenizer anyway was closed
unmerged). Turning off only that check (`requires_tokenizer = False`) is not enough: the engine core's
`MultiModalBudget` asks the processor for the maximum image tokens, which loads transformers'
Qwen3VLProcessor, whose `__init__` calls `tokenizer.convert_tokens_to_ids` (AttributeError on None).

So the engine runs in two modes, `start_vl_engine(..., tokens_only=...)`:
- `tokens_only=False`: the engine with its tokenizer and `--enable-scale-out` (the same generate route).
- `tokens_only=True`: a real `--tokens-only` engine (skip_tokenizer_init=True, detokenizing off) with a
  disclosed runtime patch, PATCH_DIR/sitecustomize.py on the ENGINE's PYTHONPATH only (no file of the venv
  is edited). It rebinds one module global, `vllm.multimodal.registry.cached_tokenizer_from_config`, used
  there only by `MultiModalRegistry._create_processing_ctx` (registry.py:133, the tokenizer of the
  multimodal processor's InputProcessingContext), so that the processor gets the model folder's tokenizer
  as without `--tokens-only`. The renderer's tokenizer (renderers/registry.py binds its own), the model's
  and the generate route's stay None: the chat template warm-up fails, /tokenize answers 400, logprobs
  carry token ids only. Why it cannot change the comparison: with `features` the generate route builds the
  engine input straight from the decoded kwargs_data (scale_out/token_in_token_out/serving.py,
  `mm_kwargs_from_features` + `mm_input`), never through the processor, and the model and its weights are
  untouched. The processor only sizes things at start-up (the encoder cache budget and the prompt-length
  check flag, in the API server's InputProcessor and the engine core; the profiling dummy inputs; the
  renderer's warm-up), which it now computes exactly as in the unpatched scale-out engine, and serves
  the renderer's own text routes. Both renderers' requests go to the same engine, so any effect would
  hit both alike; and the greedy tokens are the same in both modes.

torchvision: vLLM's qwen3_vl.py imports transformers' Qwen2-VL image processor module, which imports
torchvision at module level, and the engine venv (like the 0.33 oracle venv) has none. Both venvs run
torch 2.13.0+cpu, and PyPI's torchvision 0.28.0 (built for torch 2.13) works as a PYTHONPATH overlay
once its `__init__` stops importing the op registrations that need its CUDA `_C` extension (the
transforms vLLM uses are pure torch). `torchvision_overlay()` finds or builds that overlay
(VLLM_TORCHVISION_OVERLAY, else one built earlier by `pip install --no-deps --target` into the
temp dir and patched, else builds that).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.integration.engine_fixture import (
    VllmProcess,
    cached_weighted_model,
    require_engine,
    start_engine,
    start_render_oracle,
)

RECIPE_VERSION = 1
WEIGHT_STD = 0.2
SERVED_NAME = "tinyvl"
MAX_MODEL_LEN = 16384
TORCHVISION = "torchvision==0.28.0"
PATCH_DIR = Path(__file__).parent / "tokens_only_patch"  # sitecustomize.py: see the module docstring
PATCH_BANNER = "render-service tokens_only_patch:"  # what the patch prints to the engine log when applied

# Runs inside the engine venv: random weights (every sub-config's std raised), saved next to the tokenizer.
_WEIGHTS_SCRIPT = """
import sys
import torch
from transformers import AutoConfig, Qwen3VLForConditionalGeneration
torch.manual_seed(0)
config = AutoConfig.from_pretrained(sys.argv[1])
for part in (config, config.text_config, config.vision_config):
    part.initializer_range = float(sys.argv[2])
model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
"""

_REGISTRATIONS = "    _autograd_registrations,\n    _meta_registrations,\n"
_EXTENSION = "from . import extension  # usort:skip  # noqa: F401\n"
_GUARDED = (
    "# render-service overlay: the PyPI wheel's _C is a CUDA build that cannot load next to CPU torch;\n"
    "# only these op registrations need it (the transforms are pure torch).\n"
    "if extension._has_ops():\n"
    "    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401\n"
)


def build_weighted_vl_model(cache_root: str | Path | None = None) -> Path:
    """The qwen3-vl example folder plus random weights, built once and cached (safe across processes)."""
    from render_service.model.example import QWEN3_VL_CONFIG, QWEN3_VL_PREPROCESSOR

    python = require_engine()
    recipe = [RECIPE_VERSION, WEIGHT_STD, QWEN3_VL_CONFIG, QWEN3_VL_PREPROCESSOR, python]
    # save_pretrained rewrites config.json with the raised std: the builder puts the example's back.
    return cached_weighted_model("tinyqwen3vl", "qwen3-vl", recipe, _WEIGHTS_SCRIPT, (str(WEIGHT_STD),), cache_root)


def _overlay_works(path: Path, python: str) -> bool:
    probe = "import torchvision.transforms.v2.functional, sys; sys.exit(0)"
    result = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(path)},
        cwd=tempfile.gettempdir(),
    )
    return result.returncode == 0


def patch_torchvision_init(init: Path) -> None:
    """Import the `_meta_registrations`/`_autograd_registrations` modules only `if extension._has_ops()`."""
    text = init.read_text(encoding="utf-8")
    if _GUARDED in text:
        return
    if text.count(_REGISTRATIONS) != 1 or text.count(_EXTENSION) != 1:
        raise RuntimeError(f"{init}: not the torchvision 0.28 __init__ this patch knows")
    text = text.replace(_REGISTRATIONS, "").replace(_EXTENSION, _EXTENSION + _GUARDED)
    init.write_text(text, encoding="utf-8")


def torchvision_overlay(cache_root: str | Path | None = None) -> Path:
    """A directory to put on the vLLM processes' PYTHONPATH so that `import torchvision` works on CPU torch."""
    python = require_engine()
    configured = os.environ.get("VLLM_TORCHVISION_OVERLAY")
    root = Path(cache_root or tempfile.gettempdir()) / "render-service-torchvision-overlay"
    candidates = [Path(configured)] if configured else [root]
    for path in candidates:
        if (path / "torchvision" / "__init__.py").exists() and _overlay_works(path, python):
            return path
    if configured:
        raise RuntimeError(f"VLLM_TORCHVISION_OVERLAY={configured} does not import torchvision")
    root.parent.mkdir(parents=True, exist_ok=True)
    with Path(f"{root}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".complete").exists():
            return root
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(root), TORCHVISION],
            check=True,
            capture_output=True,
            timeout=900,
        )
        patch_torchvision_init(root / "torchvision" / "__init__.py")
        if not _overlay_works(root, python):
            raise RuntimeError(f"the patched {TORCHVISION} in {root} does not import")
        (root / ".complete").write_text("ok\n")
    return root


def start_vl_engine(model_dir: str | Path, overlay: Path, *flags: str, tokens_only: bool = False) -> VllmProcess:
    """The engine with the dev endpoints that reset its caches: with its tokenizer, or `--tokens-only` with
    the processor-tokenizer patch (see the module docstring)."""
    path = [str(overlay), str(PATCH_DIR)] if tokens_only else [str(overlay)]
    return start_engine(
        model_dir,
        "--max-num-seqs",
        "4",
        *flags,
        max_model_len=MAX_MODEL_LEN,
        served_name=SERVED_NAME,
        tokens_only=tokens_only,
        timeout=900,
        env={"PYTHONPATH": os.pathsep.join(path), "VLLM_SERVER_DEV_MODE": "1"},
    )


def start_vl_render_oracle(model_dir: str | Path, overlay: Path) -> VllmProcess:
    """vLLM 0.33's `vllm launch render` on the same folder (and path string: it is part of the mm_hash)."""
    return start_render_oracle(
        model_dir,
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        env={"PYTHONPATH": str(overlay)},
    )
