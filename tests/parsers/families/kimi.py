"""The Kimi K2 fixture folder. Kimi's own tokenizer is tiktoken code loaded with trust_remote_code and no
registry package ships it, so this is the Qwen vocabulary with Kimi K2's control tokens added as special
tokens (as Kimi flags them): `<|im_end|>`, `<|im_user|>`, `<|im_assistant|>`, `<|im_system|>`,
`<|im_middle|>`, `<|tool_calls_section_begin|>`, `<|tool_calls_section_end|>`, `<|tool_call_begin|>`,
`<|tool_call_argument_begin|>`, `<|tool_call_end|>`, `<think>`, `</think>`. config.json says
`model_type: kimi_k2` (vLLM then gives tool calls Kimi's `functions.NAME:N` ids), with a tiny
DeepSeek-V3-shaped body. The chat template is written here.

    python -m tests.parsers.families.kimi DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    added_tokens_decoder,
    qwen_tokenizer_with,
    template,
    write_json,
)

SERVED_NAME = "tinykimi"
ADDED = [
    ("[BOS]", True),
    ("[EOS]", True),
    ("<|im_end|>", True),
    ("<|im_user|>", True),
    ("<|im_assistant|>", True),
    ("<|im_system|>", True),
    ("<|im_middle|>", True),
    ("<|tool_calls_section_begin|>", True),
    ("<|tool_calls_section_end|>", True),
    ("<|tool_call_begin|>", True),
    ("<|tool_call_argument_begin|>", True),
    ("<|tool_call_end|>", True),
    ("<think>", True),
    ("</think>", True),
    ("[PAD]", True),
]
IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(ADDED)}


def build(target: str | Path) -> Path:
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(ADDED)
    import json

    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "bos_token": "[BOS]",
            "chat_template": template("kimi_k2.jinja"),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "model_max_length": 131072,
            "pad_token": "[PAD]",
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    vocab_size = QWEN_VOCAB + len(ADDED)
    write_json(
        path / "config.json",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "bos_token_id": IDS["[BOS]"],
            "eos_token_id": IDS["<|im_end|>"],
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
            "vocab_size": vocab_size,
            "torch_dtype": "bfloat16",
        },
    )
    write_json(path / "generation_config.json", {"eos_token_id": IDS["<|im_end|>"], "temperature": 0.6})
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    options = parser.parse_args()
    print(build(options.dir))
