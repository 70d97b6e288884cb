"""The Step3 and Olmo 3 fixture folders and their random outputs (`compare_parsers` `Family`
fields). No registry package ships either tokenizer, so each folder is the Qwen vocabulary with the
family's markers added (`vocab.py`) and a chat template written here:

- `step3`: `<｜begin▁of▁sentence｜>`, `<|BOT|>`, `<|EOT|>` and the tool markers
  `<｜tool_calls_begin｜>`, `<｜tool_calls_end｜>`, `<｜tool_call_begin｜>`, `<｜tool_call_end｜>`,
  `<｜tool_sep｜>` (special: vLLM's `adjust_request` keeps them with `skip_special_tokens=False`),
  `<think>` / `</think>` (added, not special); the `<steptml:...>` markup is ordinary text.
- `olmo3`: ChatML's `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, `<|pad|>` (special) only:
  Olmo 3 writes `<think>`, `</think>` and `<function_calls>` with ordinary vocabulary tokens.

    python -m tests.parsers.families.olmo3step DIR {step3,olmo3}
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from tests.parsers.cases import REQ
from tests.parsers.families.outputs import WORDS
from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    build_qwen_family,
)

STEP3_ADDED = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<|BOT|>", True),
    ("<|EOT|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<｜tool_calls_begin｜>", True),
    ("<｜tool_calls_end｜>", True),
    ("<｜tool_call_begin｜>", True),
    ("<｜tool_call_end｜>", True),
    ("<｜tool_sep｜>", True),
]
STEP3_IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(STEP3_ADDED)}
OLMO3_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|pad|>", True)]
OLMO3_IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(OLMO3_ADDED)}


def build_step3(target: str | Path) -> Path:
    return build_qwen_family(Path(target), STEP3_ADDED, "step3.jinja", "<|EOT|>", bos_token="<｜begin▁of▁sentence｜>")


def build_olmo3(target: str | Path) -> Path:
    return build_qwen_family(Path(target), OLMO3_ADDED, "olmo3.jinja", "<|im_end|>", pad_token="<|pad|>")


# -- Step3 tool calls ---------------------------------------------------------------------------------

STEP3_EOS = (STEP3_IDS["<|EOT|>"], frozenset({STEP3_IDS["<|EOT|>"]}))
_S = {name: "@" + name for name in ("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>", "<｜tool_call_begin｜>")}
_S.update({name: "@" + name for name in ("<｜tool_call_end｜>", "<｜tool_sep｜>")})
# get_weather types every parameter (vLLM's `_cast_arguments`: string, integer, number, boolean),
# search's q as null; unknown_tool's stay strings
STEP3_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "n": {"type": "integer"},
                    "q": {"type": "number"},
                    "deep": {"type": "boolean"},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"properties": {"q": {"type": "null"}}}}},
]
STEP3_REQUESTS = {name: {**body, "tools": STEP3_TOOLS} if "tools" in body else body for name, body in REQ.items()}
STEP3_VALUES = [
    "Paris",
    " 3 ",
    "3",
    "x",
    "\nLyon\n",
    "é 😀 <b>",
    "true",
    "False",
    "null",
    "1e999",
    "-0.5",
    "",
    "٣",
    "3.5",
    "nan",
]
STEP3_TEXT = ["<｜tool_calls_begin｜>", "<｜tool_calls_end｜>", "<steptml:invoke", "</steptml:parameter>"]


def _step3_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search", "unknown_tool"])
    kind = rng.choice(["function"] * 8 + [" function ", "other"])
    parts: list[Any] = [_S["<｜tool_call_begin｜>"], kind, _S["<｜tool_sep｜>"]]
    if rng.random() < 0.95:
        parts.append(f'<steptml:invoke name="{name}">')
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice(["city", "n", "q", "deep"])
        opener = f'<steptml:parameter name="{key}">'
        parts.append(("chars", opener) if rng.random() < 0.15 else opener)
        parts.append(rng.choice(STEP3_VALUES))
        if rng.random() < 0.9:
            parts.append("</steptml:parameter>")
    parts.append("</steptml:invoke>")
    if rng.random() < 0.9:
        parts.append(_S["<｜tool_call_end｜>"])
    return parts


def step3_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.7:
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        segs.append("@</think>")
    segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 4)))
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.6:
            segs.append(_S["<｜tool_calls_begin｜>"])
            for _ in range(rng.randrange(1, 4)):
                segs.extend(_step3_call(rng))
                if rng.random() < 0.15:
                    segs.append(rng.choice(["\n", " ", "x"]))
            if rng.random() < 0.85:
                segs.append(_S["<｜tool_calls_end｜>"])
        elif roll < 0.7:
            segs.append(rng.choice(STEP3_TEXT))
        else:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<|EOT|>")
    return segs


STEP3_PROMPTS = {
    "open": ["@<|BOT|>", "user\nWhat is the weather?", "@<|EOT|>", "@<|BOT|>", "assistant\n", "@<think>", "\n"],
    "closed": ["@<|BOT|>", "assistant\n", "@<think>", "x", "@</think>", "\n"],
}
STEP3_FAMILY: dict[str, Any] = {
    "model": "step3",
    "configs": (("step3", "step3"), (None, "step3")),
    "segments": step3_output,
    "prompts": STEP3_PROMPTS,
    "requests": STEP3_REQUESTS,
    "eos": STEP3_EOS,
    "builder": build_step3,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    parser.add_argument("family", choices=("step3", "olmo3"))
    options = parser.parse_args()
    print((build_step3 if options.family == "step3" else build_olmo3)(options.dir))


# -- Olmo 3 -------------------------------------------------------------------------------------------

OLMO3_EOS = (OLMO3_IDS["<|im_end|>"], frozenset({OLMO3_IDS["<|im_end|>"], OLMO3_IDS["<|endoftext|>"]}))
OLMO3_VALUES = ["'Paris'", '"Lyon"', "3", "-0.5", "null", "true", "False", "None", "[1, 2]", "{'a': 1}", "f'x'"]
OLMO3_VALUES += ["x + 1", "'a, b'", "'(x)'", "'\\n'", '"é 😀"', "1e999", "'unclosed"]
OLMO3_TEXT = ["<think>", "</think>", "<function_calls>", "</function_calls>", "<", "</", "</think", "<fun"]


def _olmo3_call(rng: random.Random) -> str:
    name = rng.choice(["get_weather", "search", "a.b", "_x", "bad name", "9z"])
    args = [f"{rng.choice(['city', 'n', 'q', 'deep'])}={rng.choice(OLMO3_VALUES)}" for _ in range(rng.randrange(0, 3))]
    if rng.random() < 0.05:
        args.append("positional")
    call = f"{name}({', '.join(args)})"
    return call[: rng.randrange(1, len(call) + 1)] if rng.random() < 0.08 else call


def olmo3_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.7:
        if rng.random() < 0.3:
            segs.append("<think>")
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.8:
            segs.append(("chars", "</think>") if rng.random() < 0.2 else "</think>")
    if rng.random() < 0.3:
        segs.append(rng.choice(["\n", "\n\n", " "]))
    roll = rng.random()
    if roll < 0.6:
        segs.append(("chars", FUNCTION_CALLS) if rng.random() < 0.15 else FUNCTION_CALLS)
        for i in range(rng.randrange(1, 4)):
            segs.append(rng.choice(["\n", "\n", "", "\n\n", " "]) if i else rng.choice(["", "\n"]))
            segs.append(_olmo3_call(rng))
        if rng.random() < 0.85:
            segs.append(rng.choice(["", "\n"]) + "</function_calls>")
        if rng.random() < 0.15:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 3)))
    elif roll < 0.7:
        segs.append(_olmo3_call(rng))  # a bare call line
    for _ in range(rng.randrange(0, 3)):
        if rng.random() < 0.3:
            segs.append(rng.choice(OLMO3_TEXT))
        else:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    if rng.random() < 0.6:
        segs.append("@<|im_end|>")
    return segs


FUNCTION_CALLS = "<function_calls>"
OLMO3_PROMPTS = {
    "open": ["@<|im_start|>", "user\nWhat is the weather?", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n<think>"],
    "bare": ["@<|im_start|>", "user\nhi", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n"],
    # an earlier turn's </think> (vLLM's is_reasoning_end finds it anywhere in the prompt)
    "history": ["@<|im_start|>", "assistant\n<think>x</think>ok", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n"],
}
OLMO3_FAMILY: dict[str, Any] = {
    "model": "olmo3",
    "configs": (("olmo3", "olmo3"), (None, "olmo3"), ("olmo3", None)),
    "segments": olmo3_output,
    "prompts": OLMO3_PROMPTS,
    "requests": REQ,
    "eos": OLMO3_EOS,
    "builder": build_olmo3,
}
