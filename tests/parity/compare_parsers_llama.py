"""Fuzzed outputs for compare_parsers.py: the Llama 3/4 JSON, pythonic, Granite and Nemotron
families. Their model folders come from tests/parsers/families/llama.py (build them into the
`--models` folder first, with the service's venv):

    for f in llama3 llama4 granite nemotron; do python -m tests.parsers.families.llama MODELS/$f $f; done
    ORACLE_PYTHON -m tests.parity.compare_parsers --models MODELS --family llama3_json --cases 1000
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.parsers import cases
from tests.parsers.families.llama import family_ids

_WORDS = ["the", " quick", " é", " 😀", " 中文", " <", " >", " {", " }", "\n", " data", " [x]", "  ", ";", ":", " Here"]
_ARGS: list[Any] = [
    {"city": "Paris", "n": 3},
    {"q": 'ünï 😀 "q" {b}', "deep": {"a": [1, 2.5, None, True]}},
    {},
    {"n": -7, "x": 1e5, "s": "a\\nb"},
    # long string values: streamed without re-reading the call, their middle elided from the state
    {"city": "Paris is lovely in the spring " * 4 + "end", "n": 4},
    {"n": "5", "city": 'line "one"\n ü 😀 \\ ' * 6 + "tail"},
    {"city": "x" * 70 + "\t" + "y" * 70},
]


def _cut(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(1, len(text))] if rng.random() < 0.12 else text


def _json_call(rng: random.Random) -> str:
    name = rng.choice(["get_weather", "search"])
    key = rng.choice(["parameters", "arguments"])
    body = json.dumps({"name": name, key: rng.choice(_ARGS)}, ensure_ascii=False)
    if rng.random() < 0.05:
        body = body.replace('"name"', '"nom"')
    return _cut(rng, body)


def _llama_json_output(tag: str) -> Any:
    def gen(rng: random.Random) -> list[Any]:
        segs: list[Any] = []
        roll = rng.random()
        if roll < 0.45:
            segs.append("@" + tag)
        if roll < 0.8:
            calls = [_json_call(rng) for _ in range(rng.randrange(1, 4))]
            segs.append(rng.choice(["; ", ";", "\n"]).join(calls))
        if rng.random() < 0.4 or roll >= 0.8:
            segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(1, 6)))
        if rng.random() < 0.15:
            segs.append(("chars", rng.choice(["<|python_tag|>", '{"name": "search"}'])))
        return segs

    return gen


def _py_value(rng: random.Random) -> str:
    return rng.choice(
        [
            *("'Paris'", '"ünï 😀"', "3", "-2.5", "True", "None", "[1, 'a']", "{'k': {'z': 1}}", "(1, 2)", "null"),
            # long strings (streamed without re-parsing the call list): spaces, commas, = and :
            # that vLLM's closing step strips, cuts or stops at; an escape; a quote of the other kind
            "'" + "Paris is lovely in the spring, " * 4 + "end'",
            '"' + "a=b: c, d  " * 8 + '"',
            "'" + 'line one\\n ü 😀 "q" ' * 5 + "'",
            "{'k': '" + "deep value " * 8 + "'}",
        ]
    )


def _py_call(rng: random.Random) -> str:
    name = rng.choice(["get_weather", "search", "a.b"])
    args = ", ".join(f"{k}={_py_value(rng)}" for k in rng.sample(["city", "n", "q", "deep"], rng.randrange(0, 4)))
    return f"{name}({args})"


def _pythonic_output(wrapped: bool) -> Any:
    def gen(rng: random.Random) -> list[Any]:
        segs: list[Any] = []
        roll = rng.random()
        if wrapped and roll < 0.4:
            segs.append("@<|python_start|>")
        if roll < 0.8:
            body = "[" + ", ".join(_py_call(rng) for _ in range(rng.randrange(1, 4))) + "]"
            segs.append(_cut(rng, body))
            if wrapped and rng.random() < 0.5:
                segs.append("@<|python_end|>")
        if rng.random() < 0.3 or roll >= 0.8:
            segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(1, 6)))
        return segs

    return gen


_THINK = ["Here is my thought process:", "Here's my thought process:", "Here is my thought", "Here is"]
_RESPONSE = ["Here is my response:", " Here's my response:", "Here is my resp", " Here is my"]


def _granite_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.6:
        segs.append(rng.choice(_THINK))
    segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.6:
        segs.append(rng.choice(_RESPONSE))
    segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.5:
        segs.append(rng.choice(["@<|tool_call|>", "<tool_call>", "@<tool_call>"]))
        calls = [
            json.dumps({"name": rng.choice(["get_weather", "search"]), "arguments": rng.choice(_ARGS)})
            for _ in range(rng.randrange(1, 3))
        ]
        if rng.random() < 0.5:  # granite: a JSON array
            segs.append(_cut(rng, " [" + ", ".join(calls) + "]"))
        else:  # granite4: one call per <tool_call>...</tool_call>
            segs.append(_cut(rng, calls[0]))
            segs.append(rng.choice(["@</tool_call>", "</tool_call>"]))
    if rng.random() < 0.3:
        segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(1, 4)))
    return segs


def _nemotron_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    segs.extend(rng.choice([*_WORDS, "  \n", "\t"]) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.7:
        segs.append(rng.choice(["@</think>", "</think>", "@</think>"]))
    if rng.random() < 0.4:
        segs.extend(["@<tool_call>", cases.TC, "@</tool_call>"])
    segs.extend(rng.choice(_WORDS) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.5:
        segs.append("@<|im_end|>")
    return segs


_L3, _L4, _GR = family_ids("llama3"), family_ids("llama4"), family_ids("granite")
_LLAMA3_PROMPTS = {"open": ["@<|start_header_id|>", "assistant", "@<|end_header_id|>", "\n\n"]}
_LLAMA4_PROMPTS = {"open": ["@<|header_start|>", "assistant", "@<|header_end|>", "\n\n"]}
_GRANITE_PROMPTS = {"open": ["@<|start_of_role|>", "assistant", "@<|end_of_role|>"]}
_GRANITE_REQ = {**cases.REQ, "thinking": {"tools": cases.TOOLS, "chat_template_kwargs": {"thinking": True}}}
_NEMOTRON_REQ = {
    **cases.REQ,
    "force": {"tools": cases.TOOLS, "chat_template_kwargs": {"force_nonempty_content": True}},
}


def families(family_cls: Any) -> dict[str, Any]:
    """`compare_parsers.Family` objects for these parsers (the class is passed in to keep the
    comparison script the only entry point)."""
    l3_eos = (_L3["<|eot_id|>"], frozenset({_L3["<|eot_id|>"], _L3["<|eom_id|>"], _L3["<|end_of_text|>"]}))
    l4_eos = (_L4["<|eot|>"], frozenset({_L4["<|eot|>"], _L4["<|eom|>"], _L4["<|end_of_text|>"]}))
    gr_eos = (_GR["<|end_of_text|>"], frozenset({_GR["<|end_of_text|>"]}))
    return {
        "llama3_json": family_cls(
            "llama3", ((None, "llama3_json"),), _llama_json_output("<|python_tag|>"), _LLAMA3_PROMPTS, cases.REQ, l3_eos
        ),
        "llama4_json": family_cls(
            "llama4", ((None, "llama4_json"),), _llama_json_output("<|python_tag|>"), _LLAMA4_PROMPTS, cases.REQ, l4_eos
        ),
        "pythonic": family_cls(
            "llama3", ((None, "pythonic"),), _pythonic_output(False), _LLAMA3_PROMPTS, cases.REQ, l3_eos
        ),
        "llama4_pythonic": family_cls(
            "llama4", ((None, "llama4_pythonic"),), _pythonic_output(True), _LLAMA4_PROMPTS, cases.REQ, l4_eos
        ),
        "granite": family_cls(
            "granite",
            (("granite", "granite"), (None, "granite"), ("granite", None), (None, "granite4"), ("granite", "granite4")),
            _granite_output,
            _GRANITE_PROMPTS,
            _GRANITE_REQ,
            gr_eos,
        ),
        "nemotron_v3": family_cls(
            "nemotron",
            (("nemotron_v3", "hermes"), ("nemotron_v3", None)),
            _nemotron_output,
            cases.PROMPTS,
            _NEMOTRON_REQ,
            (cases.EOS, cases.MODEL_EOS),
        ),
    }
