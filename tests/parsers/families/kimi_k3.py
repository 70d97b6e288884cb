"""Random outputs, prompts and requests for the Kimi K3 (XTML) parser family, on the K3 fixture folder
(`render_service.model.example_renderers`: the Qwen3 vocabulary with K3's `<|open|>`, `<|close|>`,
`<|sep|>`, `<|end_of_msg|>` added as special tokens).

Outputs follow K3's channels (think, response, tools with call and argument blocks, the message
close), with the usual damage: channels left open, calls without a close or a `tool` attribute,
typed arguments that are not JSON, markers spelled out as text, stray markers and multibyte text.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from render_service.model.example_renderers import build_kimi_k3_model
from tests.parsers.cases import TOOLS
from tests.parsers.families.outputs import WORDS

OPEN, CLOSE, SEP = "@<|open|>", "@<|close|>", "@<|sep|>"
EOS = 151675  # [EOS]
MODEL_EOS = frozenset({EOS, 151645, 151643})
TEXT_MARKERS = [
    "<|close|>think<|sep|>",
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|open|>tools<|sep|>",
    "<|close|>call<|sep|>",
    "<|close|>message<|sep|>",
    "<|open|>",
    "<|sep|>",
]


def build(target: Path) -> Path:
    Path(target).mkdir(parents=True, exist_ok=True)
    build_kimi_k3_model(Path(target))
    return Path(target)


def _marker(head: str, word: str) -> list[Any]:
    return [head, word, SEP]


def _argument(rng: random.Random) -> list[Any]:
    key = rng.choice(["city", "n", "q", "deep", 'a"b&c'])
    kind = rng.choice(["string", "string", "number", "object", "array", "boolean", "null", "bogus"])
    if kind == "string":
        value = rng.choice(["Paris", "東京 😀", "a < b", "", "line\nbreak", '{"x": 1}'])
    elif kind == "number":
        value = rng.choice(["3", "2.5", "-1e3", "3x", ""])
    elif kind == "object":
        value = rng.choice(
            [json.dumps({"a": [1, None, True]}), '{"a": 1', "{}", json.dumps({"q": "ünï"}, ensure_ascii=False)]
        )
    elif kind == "array":
        value = rng.choice(["[1, 2]", "[", '["é"]'])
    elif kind == "boolean":
        value = rng.choice(["true", "false", "True"])
    elif kind == "null":
        value = rng.choice(["null", "None"])
    else:
        value = "7"
    escaped = key.replace("&", "&amp;").replace('"', "&quot;")
    out: list[Any] = [OPEN, f'argument key="{escaped}" type="{kind}"', SEP, value]
    if rng.random() < 0.93:
        out.extend(_marker(CLOSE, "argument"))
    return out


def _call(rng: random.Random, index: int) -> list[Any]:
    name = rng.choice(["get_weather", "search"])
    attrs = rng.choice(
        [f'tool="{name}" index="{index}"', f'index="{index}" tool="{name}"', f'index="{index}"', f'tool="{name}"']
    )
    out: list[Any] = [OPEN, "call " + attrs, SEP]
    for _ in range(rng.randrange(0, 3)):
        out.extend(_argument(rng))
    if rng.random() < 0.9:
        out.extend(_marker(CLOSE, "call"))
    return out


def _words(rng: random.Random, most: int) -> list[Any]:
    return [rng.choice(WORDS) for _ in range(rng.randrange(0, most))]


def output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    # Reasoning: the thinking prompt ends with <|open|>think<|sep|>; the model may repeat it.
    if rng.random() < 0.1:
        segs.extend(_marker(OPEN, "think"))
    if rng.random() < 0.7:
        segs.extend(_words(rng, 6))
        if rng.random() < 0.8:
            segs.extend(_marker(CLOSE, "think"))
    # Response: opened in thinking mode (the non-thinking prompt already opened it).
    if rng.random() < 0.6:
        segs.extend(_marker(OPEN, "response"))
    segs.extend(_words(rng, 5))
    if rng.random() < 0.8:
        segs.extend(_marker(CLOSE, "response"))
    if rng.random() < 0.65:
        segs.extend(_marker(OPEN, "tools"))
        for i in range(rng.randrange(1, 4)):
            segs.extend(_call(rng, i + 1))
            if rng.random() < 0.15:
                segs.append(rng.choice(["\n", " ", "x"]))
        if rng.random() < 0.85:
            segs.extend(_marker(CLOSE, "tools"))
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.2:
            segs.append(rng.choice(TEXT_MARKERS))
        elif roll < 0.3:
            segs.append(("chars", rng.choice(TEXT_MARKERS)))
        else:
            segs.append(rng.choice(WORDS))
    if rng.random() < 0.8:
        segs.extend(_marker(CLOSE, "message"))
    if rng.random() < 0.5:
        segs.append("@<|end_of_msg|>")
    return segs


REQ: dict[str, dict[str, Any]] = {
    "auto": {"tools": TOOLS},
    "nothink": {"tools": TOOLS, "chat_template_kwargs": {"thinking": False}},
    "enable_thinking_off": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
    "none": {"tools": TOOLS, "tool_choice": "none"},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "noparallel": {"tools": TOOLS, "parallel_tool_calls": False},
    "noreason": {"tools": TOOLS, "include_reasoning": False},
    "notools": {},
    "notools_nothink": {"chat_template_kwargs": {"thinking": False}},
}
_TURN = [
    OPEN,
    'message role="user"',
    SEP,
    "hi",
    CLOSE,
    "message",
    SEP,
    "@<|end_of_msg|>",
    OPEN,
    'message role="assistant"',
    SEP,
]
PROMPTS: dict[str, list[Any]] = {
    "thinking": [*_TURN, OPEN, "think", SEP],
    "response": [*_TURN, OPEN, "response", SEP],
    # an earlier turn's closed think channel: the newest marker is still this turn's open one
    "history": [
        OPEN,
        'message role="assistant"',
        SEP,
        OPEN,
        "think",
        SEP,
        "x",
        CLOSE,
        "think",
        SEP,
        *_TURN,
        OPEN,
        "think",
        SEP,
    ],
}

FAMILY: dict[str, Any] = {
    "model": "kimi_k3",
    "configs": (("kimi_k3", "kimi_k3"), ("kimi_k3", None), (None, "kimi_k3")),
    "segments": output,
    "prompts": PROMPTS,
    "requests": REQ,
    "eos": (EOS, MODEL_EOS),
    "builder": build,
}
