"""The Gemma 4 fixture folder. No registry package ships Gemma 4's tokenizer, so this is the Qwen
vocabulary with Gemma 4's control tokens added as special tokens (as Gemma flags them): `<bos>`, `<eos>`,
`<pad>`, `<|turn>`, `<turn|>`, `<|channel>`, `<channel|>`, `<|tool_call>`, `<tool_call|>`,
`<|tool_response>`, `<tool_response|>`, `<|tool>`, `<tool|>`, `<|"|>`, `<|think|>`. The chat template
is written here (`enable_thinking` puts `<|think|>` in the system turn).

    python -m tests.parsers.families.gemma4 DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    added_tokens_decoder,
    qwen_tokenizer_with,
    template,
    tiny_config,
    write_json,
)

SERVED_NAME = "tinygemma4"
ADDED = [
    ("<pad>", True),
    ("<eos>", True),
    ("<bos>", True),
    ("<|turn>", True),
    ("<turn|>", True),
    ("<|channel>", True),
    ("<channel|>", True),
    ("<|tool_call>", True),
    ("<tool_call|>", True),
    ("<|tool_response>", True),
    ("<tool_response|>", True),
    ("<|tool>", True),
    ("<tool|>", True),
    ('<|"|>', True),
    ("<|think|>", True),
]
IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(ADDED)}


def build(target: str | Path) -> Path:
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(ADDED)
    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "bos_token": "<bos>",
            "chat_template": template("gemma4.jinja"),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<turn|>",
            "model_max_length": 131072,
            "pad_token": "<pad>",
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    eos = [IDS["<turn|>"], IDS["<eos>"]]
    write_json(path / "config.json", tiny_config(QWEN_VOCAB + len(ADDED), eos=IDS["<turn|>"], bos=IDS["<bos>"]))
    write_json(path / "generation_config.json", {"eos_token_id": eos, "temperature": 1.0, "top_k": 64, "top_p": 0.95})
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    options = parser.parse_args()
    print(build(options.dir))
