"""The Hunyuan fixture folders and their random outputs, prompts and requests (`compare_parsers`
`Family` fields). No registry package ships a Hunyuan tokenizer, so each folder is the Qwen vocabulary
with the family's markers added (`vocab.py`) and a chat template written here:

- `hunyuan_a13b`: `<|startoftext|>`, `<|extra_0|>`, `<|eos|>` (special) and `<think>`, `</think>`,
  `<answer>`, `</answer>`, `<tool_calls>`, `</tool_calls>` (added, not special, so they survive
  `skip_special_tokens`). vLLM's stream keys on Hunyuan's own ids for `<think>\\n` etc. (other
  tokens here), and asserts one token per chunk: its goldens stream one token per chunk.
- `hy`: Hunyuan V3/V4's structural tokens with the checkpoint suffix `:hyfx` (`<think:hyfx>`,
  `<tool_calls:hyfx>`, `<tool_call:hyfx>`, `<tool_sep:hyfx>`, `<arg_key:hyfx>`, `<arg_value:hyfx>`
  and their closers), the suffix also as `token_suffix` in the tokenizer config (hy_v3 reads it
  there, hy_v4 from the vocabulary).

    python -m tests.parsers.families.hunyuan DIR {hunyuan_a13b,hy}
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from tests.parsers.cases import TOOLS
from tests.parsers.families.outputs import ARGS, WORDS
from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    build_qwen_family,
)

A13B_ADDED = [
    ("<|startoftext|>", True),
    ("<|extra_0|>", True),
    ("<|eos|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<answer>", False),
    ("</answer>", False),
    ("<tool_calls>", False),
    ("</tool_calls>", False),
]
A13B_IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(A13B_ADDED)}

SUFFIX = ":hyfx"
_HY_MARKERS = ["think", "tool_calls", "tool_call", "arg_key", "arg_value"]
HY_ADDED = [(f"<|hy_{name}|>", True) for name in ("begin", "end", "system", "user", "assistant", "tool")]
HY_ADDED += [(f"<{m}{SUFFIX}>", False) for m in _HY_MARKERS] + [(f"</{m}{SUFFIX}>", False) for m in _HY_MARKERS]
HY_ADDED.append((f"<tool_sep{SUFFIX}>", False))
HY_IDS = {content: QWEN_VOCAB + i for i, (content, _) in enumerate(HY_ADDED)}


def build_a13b(target: str | Path) -> Path:
    return build_qwen_family(Path(target), A13B_ADDED, "hunyuan_a13b.jinja", "<|eos|>", bos_token="<|startoftext|>")


def build_hy(target: str | Path) -> Path:
    return build_qwen_family(Path(target), HY_ADDED, "hy_v3.jinja", "<|hy_end|>", token_suffix=SUFFIX)


# -- Hunyuan A13B outputs ---------------------------------------------------------------------------

A13B_TEXT_MARKERS = [
    "<think>\n",
    "\n</think>\n<answer>\n",
    "\n</answer>",
    "<tool_calls>",
    "</tool_calls>",
    "\n</",
    "助手：",
]


def _marker(rng: random.Random, text: str) -> list[Any]:
    """`text` as the fixture's added tokens where it has them, else spelled out."""
    roll = rng.random()
    if roll < 0.15:
        return [("chars", text)]
    if roll < 0.3:
        return [text]
    out: list[Any] = []
    for part in text.replace("<", "\x00<").replace(">", ">\x00").split("\x00"):
        if part in A13B_IDS:
            out.append("@" + part)
        elif part:
            out.append(part)
    return out


def _a13b_calls(rng: random.Random) -> list[Any]:
    calls = []
    for _ in range(rng.randrange(0, 3)):
        call: Any = {"name": rng.choice(["get_weather", "search"]), "arguments": rng.choice(ARGS)}
        roll = rng.random()
        if roll < 0.08:
            call = {"name": call["name"]}  # no arguments: skipped
        elif roll < 0.14:
            call["arguments"] = json.dumps(call["arguments"])  # arguments as a string
        elif roll < 0.18:
            call["name"] = 3  # vLLM's FunctionCall refuses it
        calls.append(call)
    body = json.dumps(calls if rng.random() < 0.93 else {"name": "search"}, ensure_ascii=False)
    shape = rng.random()
    if shape < 0.1:
        body = body[: rng.randrange(1, len(body) + 1)]  # truncated
    elif shape < 0.15:
        body = body.replace("}", "", 1)  # malformed
    out = [*_marker(rng, "<tool_calls>"), rng.choice(["", "\n", " "]) + body]
    if rng.random() < 0.88:
        out += _marker(rng, "</tool_calls>")
    return out


def a13b_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.7:
        segs += _marker(rng, "<think>\n")
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.85:
            segs += _marker(rng, "\n</think>\n<answer>\n")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.4:
            segs += _a13b_calls(rng)
        elif roll < 0.55:
            segs.append(rng.choice(A13B_TEXT_MARKERS))
        elif roll < 0.6:
            segs += ["@<think>", rng.choice(WORDS)] + (["@</think>"] if rng.random() < 0.7 else [])
        else:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs += _marker(rng, "\n</answer>")
        if rng.random() < 0.3:
            segs.append(rng.choice(WORDS))
    if rng.random() < 0.6:
        segs.append("@<|eos|>")
    return segs


A13B_PROMPTS = {
    "open": ["@<|startoftext|>", "hi", "@<|extra_0|>"],
    "nothink": ["@<|startoftext|>", "hi", "@<|extra_0|>", "@<think>", "\n\n", "@</think>", "\n"],
}
A13B_REQ = {
    "auto": {"tools": TOOLS},
    "none": {"tools": TOOLS, "tool_choice": "none"},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "noparallel": {"tools": TOOLS, "parallel_tool_calls": False},
    "noreason": {"tools": TOOLS, "include_reasoning": False},
    "notools": {},
}

# -- Hunyuan V3 / V4 outputs -------------------------------------------------------------------------

HY_TOOLS = [
    *TOOLS,
    {
        "type": "function",
        "function": {
            "name": "typed",
            "parameters": {
                "type": "object",
                "properties": {
                    "flag": {"type": "boolean"},
                    "n": {"type": "int32"},
                    "x": {"type": ["number", "null"]},
                    "tags": {"type": "array"},
                    "either": {"anyOf": [{"type": "string"}, {"type": "object"}]},
                },
            },
        },
    },
]
_HY_VALUES = [
    "Paris",
    " 3 ",
    "3",
    "2.5",
    "1e3",
    "true",
    "False",
    "[1, 2]",
    '{"a": 1}',
    "(1, 2)",
    "",
    "é 😀 <b>",
    "null",
]


def _hy(name: str) -> str:
    return f"@<{name}{SUFFIX}>"


def _hy_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search", "typed", " typed\n", "unknown"])
    out: list[Any] = [_hy("tool_call"), name, _hy("tool_sep")]
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice(["city", "n", "flag", "x", "tags", "either", " q "])
        out += [_hy("arg_key"), key, "@</arg_key" + SUFFIX + ">", rng.choice(["", "\n"]), _hy("arg_value")]
        out.append(rng.choice(_HY_VALUES))
        if rng.random() < 0.9:
            out.append("@</arg_value" + SUFFIX + ">")
    if rng.random() < 0.85:
        out.append("@</tool_call" + SUFFIX + ">")
    return out


def hy_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.4:
        segs.append(_hy("think"))
    if rng.random() < 0.7:
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.8:
            segs.append("@</think" + SUFFIX + ">")
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.45:
            segs.append(_hy("tool_calls") if rng.random() < 0.9 else f"<tool_calls{SUFFIX}>")
            for _ in range(rng.randrange(0, 3)):
                segs += _hy_call(rng)
            if rng.random() < 0.85:
                segs.append("@</tool_calls" + SUFFIX + ">")
        elif roll < 0.6:
            segs.append(rng.choice([f"<think{SUFFIX}>", f"</think{SUFFIX}>", f"<tool_call{SUFFIX}>", "<think", "</"]))
        else:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<|hy_end|>")
    return segs


HY_PROMPTS = {
    "open": ["@<|hy_begin|>", "@<|hy_user|>", "hi", "@<|hy_end|>", "@<|hy_assistant|>", _hy("think")],
    "closed": ["@<|hy_assistant|>", _hy("think"), "@</think" + SUFFIX + ">"],
    "bare": ["@<|hy_user|>", "hi", "@<|hy_end|>", "@<|hy_assistant|>"],
}
HY_REQ = {
    "auto": {"tools": HY_TOOLS, "chat_template_kwargs": {"reasoning_effort": "high"}},
    "auto_default": {"tools": HY_TOOLS},
    "no_think": {"tools": HY_TOOLS, "chat_template_kwargs": {"reasoning_effort": "no_think"}},
    "none": {"tools": HY_TOOLS, "tool_choice": "none", "chat_template_kwargs": {"reasoning_effort": "low"}},
    "required": {"tools": HY_TOOLS, "tool_choice": "required", "chat_template_kwargs": {"reasoning_effort": "high"}},
    "named": {
        "tools": HY_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "typed"}},
        "chat_template_kwargs": {"reasoning_effort": "high"},
    },
    "noparallel": {
        "tools": HY_TOOLS,
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"reasoning_effort": "high"},
    },
    "notools": {"chat_template_kwargs": {"reasoning_effort": "high"}},
}

FAMILIES: dict[str, dict[str, Any]] = {
    "hunyuan_a13b": {
        "model": "hunyuan_a13b",
        "configs": (("hunyuan_a13b", "hunyuan_a13b"), (None, "hunyuan_a13b"), ("hunyuan_a13b", None)),
        "segments": a13b_output,
        "prompts": A13B_PROMPTS,
        "requests": A13B_REQ,
        "eos": (A13B_IDS["<|eos|>"], frozenset({A13B_IDS["<|eos|>"]})),
        "builder": build_a13b,
        "one_token_chunks": True,
    },
    "hy": {
        "model": "hy",
        "configs": (("hy_v3", "hy_v3"), (None, "hy_v3"), ("hy_v3", None), ("hy_v4", "hy_v3"), ("hy_v4", None)),
        "segments": hy_output,
        "prompts": HY_PROMPTS,
        "requests": HY_REQ,
        "eos": (HY_IDS["<|hy_end|>"], frozenset({HY_IDS["<|hy_end|>"]})),
        "builder": build_hy,
    },
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    parser.add_argument("model", choices=("hunyuan_a13b", "hy"))
    options = parser.parse_args()
    print((build_a13b if options.model == "hunyuan_a13b" else build_hy)(options.dir))
