"""Fixture folders and fuzzed outputs for the JSON-shaped tool families `phi4_mini_json`, `xlam`,
`internlm` and `jamba`. No registry package ships these tokenizers in a form the render tier
loads without a hub, so each folder is the Qwen vocabulary (`vocab.qwen_tokenizer_with`) with the
family's control tokens added (flagged special as the family flags them) and a chat template
written here that emits the family's tool-call format:

- `phi4_mini`: `<|system|>`, `<|user|>`, `<|assistant|>`, `<|end|>`, `<|tool|>`/`<|/tool|>`
  (special); calls are the text `functools[{...}, ...]`;
- `xlam`: ChatML (`<|im_start|>`, `<|im_end|>` special) with `<think>`, `</think>`, `<tool_call>`,
  `</tool_call>` (not special, as Qwen3 has them); calls are a bare JSON list;
- `internlm`: InternLM2's `<|im_start|>`, `<|im_end|>`, `<|action_start|>`, `<|action_end|>`,
  `<|plugin|>`, `<|interpreter|>` (special); a call is `<|action_start|><|plugin|>\\n{...}<|action_end|>`;
- `jamba`: Jamba 1.5's `<|bom|>`, `<|eom|>`, role tokens, `<tool_definitions>`, `<tool_calls>`,
  `</tool_calls>` (special); calls are `<tool_calls>[{...}]</tool_calls>`.

    python -m tests.parsers.families.json_tools DIR FOLDER   # phi4_mini | xlam | internlm | jamba
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from tests.parsers import cases
from tests.parsers.families.vocab import (
    QWEN_VOCAB,
    added_tokens_decoder,
    qwen_tokenizer_with,
    tiny_config,
    write_json,
)

# folder -> (added tokens in id order as (content, special), bos, eos tokens (the first is the
# tokenizer's eos))
MARKERS: dict[str, tuple[list[tuple[str, bool]], str | None, list[str]]] = {
    "phi4_mini": (
        [
            ("<|endoftext|>", True),
            ("<|system|>", True),
            ("<|end|>", True),
            ("<|user|>", True),
            ("<|assistant|>", True),
            ("<|tool|>", True),
            ("<|/tool|>", True),
        ],
        None,
        ["<|end|>", "<|endoftext|>"],
    ),
    "xlam": (
        [
            ("<|endoftext|>", True),
            ("<|im_start|>", True),
            ("<|im_end|>", True),
            ("<tool_call>", False),
            ("</tool_call>", False),
            ("<think>", False),
            ("</think>", False),
        ],
        None,
        ["<|im_end|>", "<|endoftext|>"],
    ),
    "internlm": (
        [
            ("<|endoftext|>", True),  # InternLM2's <s>/</s> are ordinary tokens of the Qwen vocabulary
            ("<|im_start|>", True),
            ("<|im_end|>", True),
            ("<|action_start|>", True),
            ("<|action_end|>", True),
            ("<|interpreter|>", True),
            ("<|plugin|>", True),
        ],
        None,
        ["<|im_end|>", "<|endoftext|>"],
    ),
    "jamba": (
        [
            ("<|startoftext|>", True),
            ("<|endoftext|>", True),
            ("<|bom|>", True),
            ("<|eom|>", True),
            ("<|system|>", True),
            ("<|user|>", True),
            ("<|assistant|>", True),
            ("<tool_definitions>", True),
            ("</tool_definitions>", True),
            ("<tool_calls>", True),
            ("</tool_calls>", True),
            ("<tool_output>", True),
            ("</tool_output>", True),
        ],
        "<|startoftext|>",
        ["<|eom|>", "<|endoftext|>"],
    ),
}

# The assistant's calls as each family writes them (`f` is one call's function, arguments a
# mapping or a JSON string).
_ARGS_JSON = "{%- if f.arguments is string %}{{- f.arguments }}{% else %}{{- f.arguments | tojson }}{% endif %}"
_CALL_JSON = '{{- \'{"name": "\' + f.name + \'", "arguments": \' }}' + _ARGS_JSON + "{{- '}' }}"
_CALL_LIST = (
    "{{- '[' }}{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function else tc %}"
    "{%- if not loop.first %}{{- ', ' }}{% endif %}" + _CALL_JSON + "{%- endfor %}{{- ']' }}"
)

TEMPLATES = {
    "phi4_mini": (
        "{%- for message in messages %}"
        "{%- if message.role == 'system' %}{{- '<|system|>' + message.content }}"
        "{%- if tools %}{{- '<|tool|>' + tools | tojson + '<|/tool|>' }}{% endif %}{{- '<|end|>' }}"
        "{%- elif message.role == 'assistant' and message.tool_calls %}{{- '<|assistant|>functools' }}"
        + _CALL_LIST
        + "{{- '<|end|>' }}"
        "{%- else %}{{- '<|' + message.role + '|>' + (message.content or '') + '<|end|>' }}{% endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|assistant|>' }}{% endif %}"
    ),
    "xlam": (
        "{%- if tools %}{{- '<|im_start|>system\\nYou may call tools. Answer with a JSON list of calls.\\n' }}"
        "{{- tools | tojson + '<|im_end|>\\n' }}{% endif %}"
        "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if message.role == 'assistant' and message.tool_calls %}" + _CALL_LIST + "{%- else %}"
        "{{- message.content or '' }}{% endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "internlm": (
        "{%- if tools %}{{- '<|im_start|>system name=<|plugin|>\\n' + tools | tojson + '<|im_end|>\\n' }}"
        "{% endif %}{%- for message in messages %}"
        "{%- if message.role == 'assistant' and message.tool_calls %}"
        "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
        "{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function else tc %}"
        "{{- '<|action_start|><|plugin|>\\n' }}"
        + _CALL_JSON.replace('"arguments"', '"parameters"')
        + "{{- '<|action_end|>' }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}{{- '<|im_start|>environment name=<|plugin|>\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}{% endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "jamba": (
        "{{- bos_token }}{%- if tools %}{{- '<|bom|><|system|><tool_definitions>' + tools | tojson }}"
        "{{- '</tool_definitions><|eom|>' }}{% endif %}{%- for message in messages %}"
        "{%- if message.role == 'assistant' and message.tool_calls %}{{- '<|bom|><|assistant|>' + (message.content or '') }}"
        "{{- '<tool_calls>' }}" + _CALL_LIST + "{{- '</tool_calls><|eom|>' }}"
        "{%- elif message.role == 'tool' %}{{- '<|bom|><tool_output>' + message.content + '</tool_output><|eom|>' }}"
        "{%- else %}{{- '<|bom|><|' + message.role + '|>' + (message.content or '') + '<|eom|>' }}{% endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|bom|><|assistant|>' }}{% endif %}"
    ),
}


def ids(folder: str) -> dict[str, int]:
    return {content: QWEN_VOCAB + i for i, (content, _) in enumerate(MARKERS[folder][0])}


def build(target: str | Path, folder: str) -> Path:
    added, bos, eos = MARKERS[folder]
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    parsed = qwen_tokenizer_with(added)
    (path / "tokenizer.json").write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    write_json(
        path / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder(parsed),
            "bos_token": bos,
            "chat_template": TEMPLATES[folder],
            "clean_up_tokenization_spaces": False,
            "eos_token": eos[0],
            "model_max_length": 131072,
            "pad_token": eos[-1],
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
    )
    known = ids(folder)
    eos_ids = [known[e] for e in eos]
    write_json(path / "config.json", tiny_config(QWEN_VOCAB + len(added), eos=eos_ids[0], bos=known.get(bos or "")))
    write_json(path / "generation_config.json", {"eos_token_id": eos_ids, "temperature": 0.7})
    return path


def builder(folder: str) -> Any:
    return lambda target: build(target, folder)


def eos(folder: str) -> tuple[int, frozenset[int]]:
    known = ids(folder)
    names = MARKERS[folder][2]
    return known[names[0]], frozenset(known[n] for n in names)


# -- fuzzed outputs ---------------------------------------------------------------------------------

WORDS = ["the", " quick", " é", " 😀", " 中文", " <", " >", " {", " }", "\n", " data", " [x]", "  ", "]", " ", "\n\n"]
ARGS: list[Any] = [
    {"city": "Paris", "n": 3},
    {"q": 'ünï 😀 "q" {b}', "deep": {"a": [1, 2.5, None, True]}},
    {},
    {"n": -7, "x": 1e5, "s": "a\\nb"},
    {"city": "Paris is lovely in the spring " * 4 + "end", "n": 4},
    {"list": [1, [2, 3]], "o": {"k": {"z": None}}},
]


def _words(rng: random.Random, most: int) -> list[Any]:
    return [rng.choice(WORDS) for _ in range(rng.randrange(1, most))]


def _call_obj(rng: random.Random, keys: tuple[str, ...] = ("arguments",)) -> str:
    """One call object, mostly valid: sometimes the arguments are a JSON string, the name is not
    a string or missing, the object is cut short."""
    name: Any = rng.choice(["get_weather", "search"])
    key = rng.choice(keys)
    roll = rng.random()
    obj: dict[str, Any] = {"name": name, key: rng.choice(ARGS)}
    if roll < 0.05:
        obj = {"nom": name, key: {}}
    elif roll < 0.08:
        obj = {"name": 3, key: {}}
    elif roll < 0.12:
        obj = {key: rng.choice(ARGS), "name": name}
    elif roll < 0.16:
        obj = {"name": name, key: json.dumps(rng.choice(ARGS))}
    elif roll < 0.19:
        obj = {"name": name}
    return json.dumps(obj, ensure_ascii=False)


def _cut(rng: random.Random, text: str, p: float = 0.1) -> str:
    return text[: rng.randrange(1, len(text))] if rng.random() < p else text


def _spelled(rng: random.Random, text: str) -> Any:
    """A marker as ordinary text: whole, or one character per token."""
    return ("chars", text) if rng.random() < 0.5 else text


def phi4_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.4:
        segs.extend(_words(rng, 5))
    if rng.random() < 0.8:
        calls = [_call_obj(rng, ("arguments", "parameters")) for _ in range(rng.randrange(1, 4))]
        body = _cut(rng, rng.choice([", ", ","]).join(calls))
        segs += [_spelled(rng, "functools["), body]
        if rng.random() < 0.85:
            segs.append("]")
    if rng.random() < 0.3:
        segs.extend(_words(rng, 4))
    if rng.random() < 0.1:
        segs.append(_spelled(rng, rng.choice(["functools", "functools[", "functools.partial"])))
    if rng.random() < 0.5:
        segs.append("@<|end|>")
    return segs


FAMILIES: dict[str, dict[str, Any]] = {}
# tool_choice required reads the output as a JSON list (vLLM's generic path, `parsers/forced.py`): its
# stream scans leniently past a `functools[` or code-fence prefix that its batch rejects. The JSON
# schema constraint the render tier adds keeps such text out of a real required output, so the
# family outputs here are tried with the other choices (the required path has its own goldens).
_REQUESTS = {k: cases.REQ[k] for k in ("auto", "none", "named", "noparallel", "notools")}

FAMILIES["phi4_mini_json"] = {
    "model": "phi4_mini",
    "configs": ((None, "phi4_mini_json"),),
    "segments": phi4_output,
    "prompts": {"open": ["@<|user|>", "What is the weather?", "@<|end|>", "@<|assistant|>"]},
    "requests": _REQUESTS,
    "eos": eos("phi4_mini"),
    "builder": builder("phi4_mini"),
}


def _call_list(rng: random.Random) -> str:
    return "[" + ", ".join(_call_obj(rng) for _ in range(rng.randrange(1, 4))) + "]"


def xlam_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.2:
        segs.append(rng.choice(["", "\n", "  "]))
    if rng.random() < 0.25:
        segs += ["@<think>", *_words(rng, 4), "@</think>" if rng.random() < 0.8 else "</think>"]
    if rng.random() < 0.35:
        segs.extend(_words(rng, 5))
    shape = rng.random()
    body = _cut(rng, _call_list(rng) if rng.random() < 0.9 else _call_obj(rng))
    if shape < 0.3:
        segs.append(body)
    elif shape < 0.5:
        segs += [_spelled(rng, rng.choice(["```json\n", "```", "```\n"])), body]
        if rng.random() < 0.85:
            segs.append(rng.choice(["\n```", "```"]))
    elif shape < 0.6:
        segs += [_spelled(rng, "[TOOL_CALLS]"), body, rng.choice(["\n", ""])]
    elif shape < 0.75:
        segs += [rng.choice(["@<tool_call>", "<tool_call>"]), body]
        if rng.random() < 0.85:
            segs.append(rng.choice(["@</tool_call>", "</tool_call>"]))
    elif shape < 0.85:
        segs.append(_spelled(rng, rng.choice(["``", "[TOOL_", "</think", "<tool_call", "[x]"])))
    if rng.random() < 0.35:
        segs.extend(_words(rng, 4))
    if rng.random() < 0.5:
        segs.append("@<|im_end|>")
    return segs


FAMILIES["xlam"] = {
    "model": "xlam",
    "configs": ((None, "xlam"), ("qwen3", "xlam")),
    "segments": xlam_output,
    "prompts": {
        "open": ["@<|im_start|>", "user\nWhat is the weather?", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n"]
    },
    "requests": _REQUESTS,
    "eos": eos("xlam"),
    "builder": builder("xlam"),
}


def _valid_call(rng: random.Random, keys: tuple[str, ...]) -> str:
    """A call object that loads (vLLM's internlm batch raises on any other)."""
    name = rng.choice(["get_weather", "search"])
    obj: dict[str, Any] = {"name": name, rng.choice(keys): rng.choice(ARGS)}
    if rng.random() < 0.1:
        obj = {"name": name}
    elif rng.random() < 0.1:
        obj = {rng.choice(keys): rng.choice(ARGS), "name": name}
    return json.dumps(obj, ensure_ascii=False)


def internlm_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.5:
        segs.extend(_words(rng, 5))
    roll = rng.random()
    if roll < 0.7:
        segs += [
            "@<|action_start|>",
            "@<|plugin|>",
            rng.choice(["\n", "", " "]),
            _valid_call(rng, ("parameters", "arguments")),
        ]
        if rng.random() < 0.15:
            return segs  # unclosed: nothing may follow the object (vLLM's batch raises on extra data)
        segs.append("@<|action_end|>")
        if rng.random() < 0.2:
            segs.extend(_words(rng, 4))
    elif roll < 0.8:
        segs += ["@<|action_start|>", "@<|interpreter|>", "\nprint(1)", "@<|action_end|>"]
    elif roll < 0.9:
        segs.append(rng.choice(["@<|action_start|>", "@<|plugin|>", "<|action_start|>"]))
    if rng.random() < 0.5:
        segs.append("@<|im_end|>")
    return segs


FAMILIES["internlm"] = {
    "model": "internlm",
    "configs": ((None, "internlm"),),
    "segments": internlm_output,
    "prompts": {
        "open": ["@<|im_start|>", "user\nWhat is the weather?", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n"]
    },
    "requests": _REQUESTS,
    "eos": eos("internlm"),
    "builder": builder("internlm"),
}


def jamba_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.5:
        segs.extend(_words(rng, 5))
    roll = rng.random()
    if roll < 0.7:
        body = rng.choice([_call_list(rng)] * 8 + ["[]", _call_obj(rng)])
        segs += [rng.choice(["@<tool_calls>"] * 9 + ["<tool_calls>"]), rng.choice(["", "\n"]), _cut(rng, body, 0.05)]
        if rng.random() < 0.9:
            segs.append(rng.choice(["@</tool_calls>"] * 9 + ["</tool_calls>"]))
        if rng.random() < 0.2:
            segs.extend(_words(rng, 4))
    elif roll < 0.8:
        segs.append(rng.choice(["@<tool_calls>", "@</tool_calls>", "<tool_calls"]))
    if rng.random() < 0.5:
        segs.append("@<|eom|>")
    return segs


FAMILIES["jamba"] = {
    "model": "jamba",
    "configs": ((None, "jamba"),),
    "segments": jamba_output,
    "prompts": {"open": ["@<|bom|>", "@<|user|>", "What is the weather?", "@<|eom|>", "@<|bom|>", "@<|assistant|>"]},
    "requests": _REQUESTS,
    "eos": eos("jamba"),
    "builder": builder("jamba"),
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    parser.add_argument("folder", choices=sorted(MARKERS))
    options = parser.parse_args()
    print(build(options.dir, options.folder))
