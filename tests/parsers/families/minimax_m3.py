"""The MiniMax M3 fixture folder and its fuzzed outputs: the Qwen vocabulary with M3's markers added as
non-special tokens (`<mm:think>`, `</mm:think>` and the `]<]minimax[>[` namespace marker: vLLM's parsers
match them by text, and leave `skip_special_tokens` alone), and the turn tokens `]~b]`, `[e~[` as special
ones. The chat template is written here (`templates/minimax_m3.jinja`; `thinking_mode="enabled"` opens
`<mm:think>` in the generation prompt).

    python -m tests.parsers.families.minimax_m3 DIR
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from tests.parsers.cases import REQ, TOOLS
from tests.parsers.families.outputs import WORDS
from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    added_tokens_decoder,
    qwen_tokenizer_with,
    template,
    tiny_config,
    write_json,
)

NS = "]<]minimax[>["
ADDED = [("]~b]", True), ("[e~[", True), ("<mm:think>", False), ("</mm:think>", False), (NS, False), ("<|pad|>", True)]
IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(ADDED)}
EOS = IDS["[e~["]
MODEL_EOS = frozenset({EOS})


def build(target: str | Path) -> Path:
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(ADDED)
    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "bos_token": "]~b]",
            "chat_template": template("minimax_m3.jinja"),
            "clean_up_tokenization_spaces": False,
            "eos_token": "[e~[",
            "model_max_length": 131072,
            "pad_token": "<|pad|>",
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    write_json(path / "config.json", tiny_config(QWEN_VOCAB + len(ADDED), eos=EOS, bos=IDS["]~b]"]))
    write_json(path / "generation_config.json", {"eos_token_id": EOS, "temperature": 1.0})
    return path


# -- fuzzed outputs (the segment language of tests.parsers.cases.encode) --------------------------------

M = NS  # plain text: the tokenizer matches the added token (encode reads "@<...>" only)
TEXT_MARKERS = ["<mm:think>", "</mm:think>", "</mm:th", NS, NS + "<tool_call>", NS + "</invoke>", "]<]mini"]


def _value(rng: random.Random, depth: int = 0) -> list[Any]:
    roll = rng.random()
    if roll < 0.5 or depth > 1:
        return [rng.choice(["Paris", "3", "2.5", "true", "null", "東京 😀", "", " a < b ", "[1, 2]", '{"x": 1}'])]
    if roll < 0.75:
        out: list[Any] = []
        for _ in range(rng.randrange(0, 3)):
            out.extend([M, "<item>", *_value(rng, depth + 1), M, "</item>"])
        return out
    out = []
    for _ in range(rng.randrange(1, 3)):
        key = rng.choice(["a", "b", "$text"])
        out.extend([M, f"<{key}>", *_value(rng, depth + 1), M, f"</{key}>"])
    if rng.random() < 0.2:
        out.append("mixed")
    return out


def _invoke(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search"])
    quote = rng.choice(['"', '"', "'", ""])
    out: list[Any] = [M, f"<invoke name={quote}{name}{quote}>", rng.choice(["\n", ""])]
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice(["city", "n", "q", "city", "items"])
        out.extend([M, f"<{key}>", *_value(rng)])
        if rng.random() < 0.92:
            out.extend([M, f"</{key}>"])
        out.append(rng.choice(["\n", ""]))
    if rng.random() < 0.9:
        out.extend([M, "</invoke>"])
    return out


def _words(rng: random.Random, most: int) -> list[Any]:
    return [rng.choice(WORDS) for _ in range(rng.randrange(0, most))]


def output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.08:
        segs.append("@</mm:think>")
    if rng.random() < 0.15:
        segs.extend(_words(rng, 3))
    if rng.random() < 0.6:
        segs.append("@<mm:think>" if rng.random() < 0.8 else ("chars", "<mm:think>"))
    if rng.random() < 0.85:
        segs.extend(_words(rng, 6))
        if rng.random() < 0.85:
            segs.append("@</mm:think>" if rng.random() < 0.8 else ("chars", "</mm:think>"))
    segs.extend(_words(rng, 5))
    if rng.random() < 0.6:
        segs.extend([M, "<tool_call>", rng.choice(["\n", ""])])
        for _ in range(rng.randrange(1, 4)):
            segs.extend(_invoke(rng))
            segs.append(rng.choice(["\n", "", " x"]))
        if rng.random() < 0.85:
            segs.extend([M, "</tool_call>"])
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.25:
            segs.append(rng.choice(TEXT_MARKERS))
        elif roll < 0.35:
            segs.append(("chars", rng.choice(TEXT_MARKERS)))
        else:
            segs.append(rng.choice(WORDS))
    if rng.random() < 0.6:
        segs.append("[e~[")  # (plain text: the tokenizer matches the added token)
    return segs


_TURN = ["]~b]", "user\nhi", "[e~[", "\n", "]~b]", "ai\n"]  # plain text: the tokenizer matches the added tokens
PROMPTS: dict[str, list[Any]] = {
    "bare": _TURN,
    "open": [*_TURN, "@<mm:think>"],
    "closed": [*_TURN, "@<mm:think>", "x", "@</mm:think>"],
}
LIST_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"type": "integer"}}, "q": {"type": "string"}},
        },
    },
}
M3_TOOLS = [TOOLS[0], LIST_TOOL]
REQUESTS: dict[str, dict[str, Any]] = {
    **{name: ({**body, "tools": M3_TOOLS} if "tools" in body else body) for name, body in REQ.items()},
    "thinking": {"tools": M3_TOOLS, "chat_template_kwargs": {"thinking_mode": "enabled"}},
    "thinking_notools": {"chat_template_kwargs": {"thinking_mode": "enabled"}},
}

FAMILY: dict[str, Any] = {
    "model": "minimax_m3",
    "configs": (("minimax_m3", "minimax_m3"), ("minimax_m3", None), (None, "minimax_m3")),
    "segments": output,
    "prompts": PROMPTS,
    "requests": REQUESTS,
    "eos": (EOS, MODEL_EOS),
    "builder": build,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    options = parser.parse_args()
    print(build(options.dir))
