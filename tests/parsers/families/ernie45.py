"""The ERNIE 4.5 fixture folder and its fuzzed outputs. ERNIE's own tokenizer is a SentencePiece model no
registry package ships, so this is the Qwen vocabulary with ERNIE 4.5's markers added: `<think>`,
`</think>`, `<response>`, `</response>`, `<tool_call>`, `</tool_call>` as added, non-special tokens
(they decode with special tokens skipped, which vLLM's `ernie45` parsers need: they set no
`skip_special_tokens`), and the turn tokens as special ones. The Qwen vocabulary has no `<0x0A>`
(ERNIE's newline byte token), so vLLM's newline-by-id rules never fire here. The chat template is
written here (`templates/ernie45.jinja`).

    python -m tests.parsers.families.ernie45 DIR
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

ADDED = [
    ("<|begin_of_sentence|>", True),
    ("<|end_of_sentence|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<response>", False),
    ("</response>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|PAD|>", True),
]
IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(ADDED)}
EOS = IDS["<|end_of_sentence|>"]
MODEL_EOS = frozenset({EOS, IDS["<|im_end|>"]})


def build(target: str | Path) -> Path:
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(ADDED)
    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "bos_token": "<|begin_of_sentence|>",
            "chat_template": template("ernie45.jinja"),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|end_of_sentence|>",
            "model_max_length": 131072,
            "pad_token": "<|PAD|>",
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    write_json(path / "config.json", tiny_config(QWEN_VOCAB + len(ADDED), eos=EOS, bos=IDS["<|begin_of_sentence|>"]))
    write_json(path / "generation_config.json", {"eos_token_id": [EOS, IDS["<|im_end|>"]], "temperature": 0.6})
    return path


# -- fuzzed outputs (the segment language of tests.parsers.cases.encode) --------------------------------

TEXT_MARKERS = ["</think>", "<think>", "<response>", "</response>", "<tool_call>", "</tool_call>", "</resp", "<tool"]
ARGS = [{"city": "Paris", "n": 3}, {"q": 'ünï 😀 "q" {b}', "deep": {"a": [1, 2.5, None, True]}}, {}, {"city": "東京"}]


def _call(rng: random.Random) -> list[Any]:
    obj: dict[str, Any] = {"name": rng.choice(["get_weather", "search"]), "arguments": rng.choice(ARGS)}
    roll = rng.random()
    if roll < 0.05:
        del obj["arguments"]
    elif roll < 0.08:
        obj["name"] = 7
    body = json.dumps(obj, ensure_ascii=False, indent=rng.choice([None, None, 2]))
    shape = rng.random()
    if shape < 0.06:
        body = body[: rng.randrange(1, len(body) + 1)]  # truncated
    elif shape < 0.1:
        body = body.replace("}", "", 1)  # malformed
    elif shape < 0.12:
        body = "not json"
    out: list[Any] = ["@<tool_call>", rng.choice(["\n", "\n", "", " "]), body, rng.choice(["\n", "\n", ""])]
    if rng.random() < 0.9:
        out.append("@</tool_call>")
    return out


def _words(rng: random.Random, most: int) -> list[Any]:
    return [rng.choice(WORDS) for _ in range(rng.randrange(0, most))]


def _noise(rng: random.Random) -> list[Any]:
    out: list[Any] = []
    for _ in range(rng.randrange(0, 2)):
        roll = rng.random()
        if roll < 0.4:
            out.append(rng.choice(TEXT_MARKERS))
        elif roll < 0.6:
            out.append(("chars", rng.choice(TEXT_MARKERS)))
        else:
            out.append("@" + rng.choice(TEXT_MARKERS[:6]))
    return out


def output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.1:
        segs.append("@<think>")
    if rng.random() < 0.85:
        segs.extend(_words(rng, 6))
        if rng.random() < 0.1:
            segs.extend(_noise(rng))
        segs.append(rng.choice(["\n", "", "\n\n"]))
        if rng.random() < 0.88:
            segs.append("@</think>" if rng.random() < 0.9 else ("chars", "</think>"))
            segs.append(rng.choice(["\n\n", "\n", "", "\n\n\n"]))
    if rng.random() < 0.5:
        # an answer
        wrapped = rng.random() < 0.7
        if wrapped:
            segs.append("@<response>" if rng.random() < 0.9 else ("chars", "<response>"))
            segs.append(rng.choice(["\n", ""]))
        segs.extend(_words(rng, 6))
        if rng.random() < 0.15:
            segs.extend(_noise(rng))
        if wrapped and rng.random() < 0.85:
            segs.extend([rng.choice(["\n", ""]), "@</response>"])
        segs.append(rng.choice(["\n", "", "\n\n"]))
    else:
        segs.extend(_words(rng, 3))
        for _ in range(rng.randrange(1, 4)):
            segs.extend(_call(rng))
            segs.append(rng.choice(["\n", "\n", "", " x"]))
    if rng.random() < 0.1:
        segs.extend(_noise(rng))
    if rng.random() < 0.6:
        segs.append(rng.choice(["@<|end_of_sentence|>", "@<|im_end|>"]))
    return segs


_TURN = ["@<|begin_of_sentence|>", "@<|im_start|>", "user\nWhat is the weather?", "@<|im_end|>", "\n", "@<|im_start|>"]
PROMPTS: dict[str, list[Any]] = {
    "open": [*_TURN, "assistant\n", "@<think>", "\n"],
    "bare": [*_TURN, "assistant\n"],
    "closed": [*_TURN, "assistant\n", "@<think>", "\n\n", "@</think>", "\n\n"],
}
REQUESTS: dict[str, dict[str, Any]] = {
    **REQ,
    "tools_nothink": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
}

FAMILY: dict[str, Any] = {
    "model": "ernie45",
    "configs": (("ernie45", "ernie45"), ("ernie45", None), (None, "ernie45")),
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
