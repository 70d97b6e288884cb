"""A tiny gpt-oss model folder (no weights) with the real o200k_harmony vocabulary.

vLLM 0.33 renders a model whose `config.json` says `model_type: gpt_oss` through Harmony. The
folder holds what vLLM's render tier reads at start: a GptOss `config.json` scaled down, a
`generation_config.json` like gpt-oss-20b's, and an HF `tokenizer.json` converted from
`o200k_base.tiktoken` (see scripts/fetch_o200k.py) plus Harmony's special tokens 199998..201088,
in Harmony's own order and names.

    python -m tests.render.gpt_oss_model DIR   # needs $TIKTOKEN_ENCODINGS_BASE
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from render_service.model.harmony_text import O200K_PATTERN

CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "initial_context_length": 4096,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "vocab_size": 201088,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GENERATION_CONFIG = {
    "bos_token_id": 199998,
    "do_sample": True,
    "eos_token_id": [200002, 199999, 200012],
    "pad_token_id": 199999,
}


def _special_tokens() -> list[str]:
    """Harmony's special tokens in id order (199998 upwards), from the encoding itself."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    by_id = sorted((encoding.encode(token, allowed_special="all")[0], token) for token in encoding.special_tokens_set)
    assert [token_id for token_id, _ in by_id] == list(range(199998, 199998 + len(by_id)))
    return [token for _, token in by_id]


def _tokenizer_json(ranks_file: Path) -> tuple[str, list[dict[str, Any]]]:
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from render_service.model.example import _load_tiktoken_ranks

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _load_tiktoken_ranks(Path(tiktoken_url))

    tokenizer = _Converter(vocab_file=str(ranks_file), pattern=O200K_PATTERN, add_prefix_space=False).converted()
    tokenizer.add_tokens([AddedToken(name, normalized=False, special=True) for name in _special_tokens()])
    text = tokenizer.to_str()
    return text, json.loads(text)["added_tokens"]


def build_gpt_oss_model(target: str | Path, encodings_dir: str | Path | None = None) -> Path:
    """Write the folder at `target`; the vocabulary comes from `encodings_dir` (or the env var)."""
    encodings = Path(encodings_dir or os.environ["TIKTOKEN_ENCODINGS_BASE"])
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(encodings)  # Harmony reads it
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    text, added = _tokenizer_json(encodings / "o200k_base.tiktoken")
    (path / "tokenizer.json").write_text(text, encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "model_input_names": ["input_ids", "attention_mask"],
        "added_tokens_decoder": {
            str(tok["id"]): {k: tok[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for tok in added
        },
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    (path / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    options = parser.parse_args()
    print(build_gpt_oss_model(options.dir))
