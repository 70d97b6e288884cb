"""Random outputs, prompts and requests for the DeepSeek, Kimi K2 and Gemma 4 parser families, in the
segment language of `tests.parsers.cases.encode` ("@<tok>" = that added token by id, ("chars", text) =
text spelled one character per token). `tests/parity/compare_parsers.py` runs them through vLLM's own
parser classes and ours (`FAMILIES` entries are its `Family` fields).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from tests.parsers.cases import TOOLS
from tests.parsers.families import deepseek, gemma4, kimi

WORDS = ["the", " quick", " é", " 😀", " 中文", " <", " >", " {", " }", "\n", " data", " a<b", "  ", "\n\n", '"}']
ARGS = [
    {"city": "Paris", "n": 3},
    {"q": 'ünï 😀 "q" {b}', "deep": {"a": [1, 2.5, None, True]}},
    {},
    {"city": "東京"},
]

# -- DeepSeek V3 / V3.1 ------------------------------------------------------------------------------

DS_CALLS_BEGIN = "@" + deepseek.TOOL_CALLS_BEGIN
DS_CALLS_END = "@" + deepseek.TOOL_CALLS_END
DS_CALL_BEGIN = "@" + deepseek.TOOL_CALL_BEGIN
DS_CALL_END = "@" + deepseek.TOOL_CALL_END
DS_SEP = "@" + deepseek.TOOL_SEP
DS_TEXT_MARKERS = [deepseek.TOOL_CALL_END, "<｜tool", "<think", "</think>", "```", "\n```json\n"]


def _json_args(rng: random.Random) -> str:
    args = rng.choice(ARGS)
    body = json.dumps(args, ensure_ascii=False, indent=rng.choice([None, None, 2]))
    shape = rng.random()
    if shape < 0.1:
        body = body[: rng.randrange(1, len(body) + 1)]  # truncated
    elif shape < 0.15:
        body = body.replace("}", "", 1)  # malformed
    elif shape < 0.2:
        body = "not json, just text"
    return body


def _ds_call(rng: random.Random, v31: bool) -> list[Any]:
    name = rng.choice(["get_weather", "search"])
    args = _json_args(rng)
    if v31:
        out: list[Any] = [DS_CALL_BEGIN, name, DS_SEP, args]
    else:
        kind = "function" if rng.random() < 0.95 else "other"
        fence = "\n```json\n" if rng.random() < 0.95 else "\n```\n"
        out = [DS_CALL_BEGIN, kind, DS_SEP, name + fence + args + "\n```"]
    if rng.random() < 0.9:
        out.append(DS_CALL_END)
    return out


def deepseek_output(rng: random.Random) -> list[Any]:
    v31 = rng.random() < 0.5
    segs: list[Any] = []
    if rng.random() < 0.4:
        segs.append("@<think>")
    if rng.random() < 0.6:
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.7:
            segs.append("@</think>")
    segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.75:
        segs.append(DS_CALLS_BEGIN)
        for _ in range(rng.randrange(1, 4)):
            segs.extend(_ds_call(rng, v31))
            if rng.random() < 0.15:
                segs.append(rng.choice(["\n", " ", "x"]))
        if rng.random() < 0.8:
            segs.append(DS_CALLS_END)
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.3:
            segs.append(rng.choice(DS_TEXT_MARKERS))
        elif roll < 0.4:
            segs.append(("chars", rng.choice(DS_TEXT_MARKERS)))
        else:
            segs.append(rng.choice(WORDS))
    if rng.random() < 0.5:
        segs.append("@<｜end▁of▁sentence｜>")
    return segs


DS_REQ: dict[str, dict[str, Any]] = {
    "auto": {"tools": TOOLS},
    "think": {"tools": TOOLS, "chat_template_kwargs": {"thinking": True}},
    "enable_thinking": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": True}},
    "none": {"tools": TOOLS, "tool_choice": "none", "chat_template_kwargs": {"thinking": True}},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "noparallel": {"tools": TOOLS, "parallel_tool_calls": False, "chat_template_kwargs": {"thinking": True}},
    "noreason": {"tools": TOOLS, "include_reasoning": False, "chat_template_kwargs": {"thinking": True}},
    "notools": {},
}
DS_PROMPTS: dict[str, list[Any]] = {
    "think": ["@<｜begin▁of▁sentence｜>", "@<｜User｜>", "What is the weather?", "@<｜Assistant｜>", "@<think>"],
    "nothink": ["@<｜begin▁of▁sentence｜>", "@<｜User｜>", "What is the weather?", "@<｜Assistant｜>", "@</think>"],
    "bare": ["@<｜begin▁of▁sentence｜>", "@<｜User｜>", "hi", "@<｜Assistant｜>"],
}

# -- Kimi K2 ---------------------------------------------------------------------------------------------

KIMI_TEXT_MARKERS = ["<|tool_call_begin|>", "<|tool_calls_section_begin|>", "<think>", "</think>", "functions.", ":0"]


def _kimi_call(rng: random.Random, index: int) -> list[Any]:
    name = rng.choice(["get_weather", "search"])
    header = rng.choice([f"functions.{name}:{index}", f" functions.{name}:{index} ", f"{name}:{index}", name, ""])
    out: list[Any] = ["@<|tool_call_begin|>", header]
    if rng.random() < 0.92:
        out.append("@<|tool_call_argument_begin|>")
        args = _json_args(rng)
        if rng.random() < 0.1:
            args = json.dumps({"name": name, "arguments": rng.choice(ARGS)})
        out.append(args)
    if rng.random() < 0.9:
        out.append("@<|tool_call_end|>")
    return out


def kimi_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.5:
        segs.append("@<think>")
    if rng.random() < 0.7:
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.7:
            segs.append("@</think>")
    segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.75:
        segs.append("@<|tool_calls_section_begin|>")
        for i in range(rng.randrange(1, 4)):
            segs.extend(_kimi_call(rng, i))
            if rng.random() < 0.15:
                segs.append(rng.choice(["\n", " ", "x"]))
        if rng.random() < 0.8:
            segs.append("@<|tool_calls_section_end|>")
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.3:
            segs.append(rng.choice(KIMI_TEXT_MARKERS))
        elif roll < 0.4:
            segs.append(("chars", rng.choice(KIMI_TEXT_MARKERS)))
        else:
            segs.append(rng.choice(WORDS))
    if rng.random() < 0.5:
        segs.append("@<|im_end|>")
    return segs


KIMI_REQ: dict[str, dict[str, Any]] = {
    "auto": {"tools": TOOLS},
    "nothink": {"tools": TOOLS, "chat_template_kwargs": {"thinking": False}},
    "enable_thinking_off": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
    "none": {"tools": TOOLS, "tool_choice": "none"},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "noparallel": {"tools": TOOLS, "parallel_tool_calls": False},
    "noreason": {"tools": TOOLS, "include_reasoning": False},
    "notools": {},
}
KIMI_PROMPTS: dict[str, list[Any]] = {
    "open": [
        "@<|im_user|>",
        "user",
        "@<|im_middle|>",
        "hi",
        "@<|im_end|>",
        "@<|im_assistant|>",
        "assistant",
        "@<|im_middle|>",
    ],
    "closed": ["@<|im_assistant|>", "assistant", "@<|im_middle|>", "@<think>", "@</think>"],
    "history": [
        "@<|im_assistant|>",
        "assistant",
        "@<|im_middle|>",
        "@<think>",
        "x",
        "@</think>",
        "ok",
        "@<|im_end|>",
        "@<|im_user|>",
        "more",
        "@<|im_end|>",
        "@<|im_assistant|>",
        "assistant",
        "@<|im_middle|>",
        "@<think>",
    ],
}

FAMILIES: dict[str, dict[str, Any]] = {
    "deepseek": {
        "model": "deepseek",
        "configs": (
            ("deepseek_v3", "deepseek_v3"),
            ("deepseek_v3", "deepseek_v31"),
            ("deepseek_r1", "deepseek_v31"),
            ("deepseek_r1", "deepseek_v3"),
            (None, "deepseek_v3"),
            (None, "deepseek_v31"),
            ("deepseek_v3", None),
        ),
        "segments": deepseek_output,
        "prompts": DS_PROMPTS,
        "requests": DS_REQ,
        "eos": (1, frozenset({1})),
        "builder": deepseek.build,
    },
    "kimi": {
        "model": "kimi",
        # (a reasoning parser of another family beside kimi_k2 tools reads the template kwargs its
        # own way; ours then builds the tool engine with the reasoning parser's thinking decision)
        "configs": (("kimi_k2", "kimi_k2"), (None, "kimi_k2"), ("kimi_k2", None)),
        "segments": kimi_output,
        "prompts": KIMI_PROMPTS,
        "requests": KIMI_REQ,
        "eos": (kimi.IDS["<|im_end|>"], frozenset({kimi.IDS["<|im_end|>"]})),
        "builder": kimi.build,
    },
}


# -- Gemma 4 ---------------------------------------------------------------------------------------------

G_DELIM = '@<|"|>'
G_TEXT_MARKERS = ["<|channel>", "<channel|>", "<|tool_call>", "call:", '<|"|>', "thought\n", "{", ")", ":"]
G_STRINGS = ["Paris", "東京 😀", "a, b: {c}", "x (y) z)", " spaced \n", "", "it's }", "<|", "1.5"]


def _g_string(rng: random.Random) -> list[Any]:
    value = rng.choice(G_STRINGS)
    if rng.random() < 0.3:
        value = "".join(
            rng.choice(["word ", "(", ")", "}", ",", "é😀", "\n", "<", "|", '"']) for _ in range(rng.choice([20, 80]))
        )
    close = [G_DELIM] if rng.random() < 0.92 else []
    return [G_DELIM, value, *close]


def _g_value(rng: random.Random, depth: int = 0) -> list[Any]:
    roll = rng.random()
    if roll < 0.5:
        return _g_string(rng)
    if roll < 0.7:
        return [rng.choice(["3", "2.5", "true", "false", "null", "-1", "1e3", "108."])]
    if roll < 0.85 and depth < 2:
        out: list[Any] = ["{"]
        for i in range(rng.randrange(0, 3)):
            out += ([","] if i else []) + [rng.choice(["a", "b", "city"]), ":", *_g_value(rng, depth + 1)]
        return out + (["}"] if rng.random() < 0.9 else [])
    if depth < 2:
        out = ["["]
        for i in range(rng.randrange(0, 3)):
            out += ([","] if i else []) + _g_value(rng, depth + 1)
        return out + (["]"] if rng.random() < 0.9 else [])
    return _g_string(rng)


def _g_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "get_weather", "search", "unknown_tool"])
    paren = rng.random() < 0.15
    out: list[Any] = ["@<|tool_call>" if rng.random() < 0.95 else "<|tool_call>"]
    out.append(rng.choice(["call:", "call:", "call:", ":", ""]) + name)
    out.append("(" if paren else "{")
    keys = rng.sample(["city", "n", "q", "deep"], rng.randrange(0, 4))
    for i, key in enumerate(keys):
        out += ([","] if i else []) + [key + rng.choice([":", ":", ": "])]
        out += ["3"] if key == "n" and rng.random() < 0.7 else _g_value(rng)
    if rng.random() < 0.9:
        out.append(")" if paren else "}")
    if rng.random() < 0.9:
        out.append("@<tool_call|>")
    if rng.random() < 0.05:
        out = out[: rng.randrange(1, len(out) + 1)]
    return out


def gemma4_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    roll = rng.random()
    if roll < 0.5:
        segs.append("@<|channel>")
    if roll < 0.75:
        segs.append(rng.choice(["thought\n", ("chars", "thought\n"), "thought", "thou", ""]))
        segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 5)))
        if rng.random() < 0.8:
            segs.append("@<channel|>")
    segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 3)))
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.5:
            segs.extend(_g_call(rng))
        elif roll < 0.65:
            marker = rng.choice(G_TEXT_MARKERS)
            segs.append(rng.choice([marker, ("chars", marker), "@<|channel>", "@<channel|>", "@<tool_call|>"]))
        else:
            segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    if rng.random() < 0.6:
        segs.append(rng.choice(["@<turn|>", "@<eos>"]))
    return segs


G_REQ: dict[str, dict[str, Any]] = {
    **{k: v for k, v in KIMI_REQ.items() if k not in ("nothink", "enable_thinking_off")},
    "thinking": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": True}},
}
G_PROMPTS: dict[str, list[Any]] = {
    "open": ["@<bos>", "@<|turn>", "user\nhi", "@<turn|>", "\n", "@<|turn>", "model\n"],
    "channel": ["@<|turn>", "model\n", "@<|channel>", "thought\n"],
    "closed": ["@<|turn>", "model\n", "@<|channel>", "x", "@<channel|>"],
    "tool_response": ["@<|tool_call>", "call:f{}", "@<tool_call|>", "@<|tool_response>", "r", "@<tool_response|>"],
}
FAMILIES["gemma4"] = {
    "model": "gemma4",
    "configs": (("gemma4", "gemma4"), (None, "gemma4"), ("gemma4", None), ("gemma4", "hermes")),
    "segments": gemma4_output,
    "prompts": G_PROMPTS,
    "requests": G_REQ,
    "eos": (gemma4.IDS["<turn|>"], frozenset({gemma4.IDS["<turn|>"], gemma4.IDS["<eos>"]})),
    "builder": gemma4.build,
}


# -- DeepSeek V3.2 (DSML) --------------------------------------------------------------------------------

DSML_BLOCK, DSML_BLOCK_END = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
DSML_TEXT_MARKERS = [DSML_BLOCK, "<｜DSML｜invoke", "</｜DSML｜parameter>", '">', "<｜DSML｜", "<think>"]


def _dsml_param(rng: random.Random) -> str:
    key = rng.choice(["city", "n", "q", "deep", "arguments"])
    value: Any = rng.choice([*ARGS, "Paris", "東京 > 😀", 3, 2.5, True, None, "not json {", '{"city": "Rome"}'])
    if key == "arguments" and rng.random() < 0.6:
        value = rng.choice([{"city": "Oslo", "n": 2}, '{"city": "Oslo"}', {"other": 1}])
    is_string = isinstance(value, str)
    text = value if is_string else json.dumps(value, ensure_ascii=False)
    attr = rng.choice([f' string="{"true" if is_string else "false"}"', "", ' string="true"', ' string="false"'])
    close = "</｜DSML｜parameter>" if rng.random() < 0.9 else ""
    return f'<｜DSML｜parameter name="{key}"{attr}>{text}{close}\n'


def _dsml_invoke(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "get_weather", "search", "unknown_tool"])
    body = "".join(_dsml_param(rng) for _ in range(rng.randrange(0, 4)))
    invoke = f'<｜DSML｜invoke name="{name}">\n{body}' + ("</｜DSML｜invoke>\n" if rng.random() < 0.9 else "")
    cut = rng.random()
    if cut < 0.1:
        invoke = invoke[: rng.randrange(1, len(invoke) + 1)]
    if cut < 0.3:  # spelled one character per token: markers split everywhere
        return [("chars", invoke)]
    pieces = [invoke[i : i + 7] for i in range(0, len(invoke), 7)]
    return pieces if rng.random() < 0.5 else [invoke]


def dsml_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.4:
        segs += ["@<think>", *(rng.choice(WORDS) for _ in range(rng.randrange(0, 5)))]
        if rng.random() < 0.8:
            segs.append("@</think>")
    segs.extend(rng.choice(WORDS) for _ in range(rng.randrange(0, 4)))
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.6:
            segs.append(rng.choice(["\n\n", "", " "]) + DSML_BLOCK + "\n")
            for _ in range(rng.randrange(1, 4)):
                segs.extend(_dsml_invoke(rng))
            if rng.random() < 0.85:
                segs.append(DSML_BLOCK_END)
        elif roll < 0.75:
            segs.extend(_dsml_invoke(rng))  # an invoke without the block
        else:
            marker = rng.choice(DSML_TEXT_MARKERS)
            segs.append(rng.choice([marker, ("chars", marker), rng.choice(WORDS)]))
    if rng.random() < 0.3:
        segs.append(rng.choice(WORDS))
    if rng.random() < 0.5:
        segs.append("@<｜end▁of▁sentence｜>")
    return segs


FAMILIES["deepseek_v32"] = {
    **FAMILIES["deepseek"],
    "configs": (("deepseek_v3", "deepseek_v32"), (None, "deepseek_v32"), ("deepseek_r1", "deepseek_v32")),
    "segments": dsml_output,
}


# -- DeepSeek V4 / V4.1 (DSML with a `tool_calls` block; V4.1 spells the tags with a space) -----------


def _dsml_v4_output(spaced: bool) -> Callable[[random.Random], list[Any]]:
    """`dsml_output` in V4's (or V4.1's) spelling, plus the opener variants and stray think markers."""
    if spaced:
        block, block_end = "<｜DSML｜ calls>", "</｜DSML｜ calls>"
        extra = ["<｜DSML｜tool_calls>", "<｜DSML｜ invoke", "</｜DSML｜ parameter>"]
    else:
        block, block_end = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
        extra = ["<｜DSML｜toolcalls>", "<｜DSML｜tool>", "<｜DSML｜ calls>"]

    def respell(seg: Any) -> Any:
        def fix(text: str) -> str:
            text = text.replace(DSML_BLOCK_END, block_end).replace(DSML_BLOCK, block)
            if spaced:
                for tag in ("invoke", "parameter"):
                    text = text.replace(f"<｜DSML｜{tag}", f"<｜DSML｜ {tag}").replace(
                        f"</｜DSML｜{tag}", f"</｜DSML｜ {tag}"
                    )
            return text

        if isinstance(seg, tuple):
            return (seg[0], fix(seg[1]))
        return fix(seg)

    def output(rng: random.Random) -> list[Any]:
        segs = [respell(s) for s in dsml_output(rng)]
        if rng.random() < 0.2:  # an opener variant, a bare </think>, a second <think>, a block inside reasoning
            at = rng.randrange(0, len(segs) + 1)
            segs.insert(at, rng.choice([*extra, "@</think>", "@<think>", block + "\n"]))
        return segs

    return output


for _name, _spaced in (("deepseek_v4", False), ("deepseek_v41", True)):
    FAMILIES[_name] = {
        **FAMILIES["deepseek"],
        "configs": ((_name, _name), (None, _name), (_name, None), ("deepseek_r1", _name)),
        "segments": _dsml_v4_output(_spaced),
        "requests": {
            **DS_REQ,
            "think_off": {"tools": TOOLS, "chat_template_kwargs": {"thinking": False}},
            "effort_none": {"tools": TOOLS, "chat_template_kwargs": {"reasoning_effort": "none"}},
        },
    }
