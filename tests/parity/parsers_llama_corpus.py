"""Derender parity corpus for the Llama 3/4, pythonic, Granite and Nemotron parsers.

Same machinery as derender_corpus.py (segments encoded with the fixture tokenizer, marker ids
spliced in, batch + one-token + random-chunk streams driven like an llm-d client), over the fixture
folders of tests/parsers/families/llama.py, one server config per parser flag set. Goldens live in
golden_parsers/<config>/<case>.json (record_parsers_llama.py writes them from vLLM 0.33).

Importing this module adds its configs to corpus.CONFIGS and its token families to
derender_corpus.FAMILIES (new keys only), so the shared builders and comparison work unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.parsers.families.llama import SERVED_NAMES, family_ids

from .corpus import CONFIGS, SEARCH_TOOL, WEATHER_TOOL, ServerConfig, U
from .derender_corpus import (
    FAMILIES,
    CorpusBuilder,
    DerenderCase,
    Encoder,
    Family,
    Out,
    chat,
    load_tokenizer,
)

GOLDEN_ROOT = Path(__file__).resolve().parent / "golden_parsers"
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

# -- families and configs ---------------------------------------------------------------------------

_L3 = family_ids("llama3")
_L4 = family_ids("llama4")
_GR = family_ids("granite")
QWEN_THINK, QWEN_END_THINK, QWEN_TC, QWEN_END_TC, IM_END = 151667, 151668, 151657, 151658, 151645

PARSER_FAMILIES = {
    "llama3": Family(SERVED_NAMES["llama3"], eos=_L3["<|eot_id|>"], think=-1, end_think=-1),
    "llama4": Family(SERVED_NAMES["llama4"], eos=_L4["<|eot|>"], think=-1, end_think=-1),
    "granite": Family(SERVED_NAMES["granite"], eos=_GR["<|end_of_text|>"], think=-1, end_think=-1),
    "nemotron": Family(
        SERVED_NAMES["nemotron"], eos=IM_END, think=QWEN_THINK, end_think=QWEN_END_THINK, tool_call=QWEN_TC
    ),
}


def _cfg(name: str, family: str, reasoning: str | None = None, tool: str | None = None) -> ServerConfig:
    return ServerConfig(
        name,
        family=family,
        served_model_name=SERVED_NAMES[family],
        reasoning_parser=reasoning,
        tool_call_parser=tool,
        enable_auto_tool_choice=tool is not None,
    )


PARSER_CONFIGS = {
    c.name: c
    for c in (
        _cfg("p_llama3_json", "llama3", tool="llama3_json"),
        _cfg("p_llama4_json", "llama4", tool="llama4_json"),
        _cfg("p_pythonic", "llama3", tool="pythonic"),
        _cfg("p_llama4_pythonic", "llama4", tool="llama4_pythonic"),
        _cfg("p_granite", "granite", reasoning="granite", tool="granite"),
        _cfg("p_granite_tool", "granite", tool="granite"),
        _cfg("p_granite4", "granite", tool="granite4"),
        _cfg("p_nemotron_v3", "nemotron", reasoning="nemotron_v3", tool="hermes"),
    )
}
for _name, _family in PARSER_FAMILIES.items():
    FAMILIES.setdefault(_name, _family)
for _name, _config in PARSER_CONFIGS.items():
    CONFIGS.setdefault(_name, _config)


class ParserCorpusBuilder(CorpusBuilder):
    def _add(self, case: DerenderCase) -> None:
        assert case.config in PARSER_CONFIGS, case.config
        assert all(c.name != case.name for c in self.cases), case.name
        self.cases.append(case)


# -- cases ---------------------------------------------------------------------------------------

REQUEST = [U("What's the weather in Paris, and find me red shoes?")]
UNI = "こんにちは！🎉 Привет — 東京は晴れです ☀️ e\u0301 🇫🇷"
SEARCH_ARGS = {"query": "red shoes", "filters": {"price": {"max": 50, "min": 10.5}, "brands": ["Acme"]}, "limit": 5}


def _req(config: str, **extra: Any) -> dict[str, Any]:
    family = PARSER_CONFIGS[config].family
    return chat(REQUEST, model=SERVED_NAMES[family], **extra)


def _tools(config: str, **extra: Any) -> dict[str, Any]:
    return _req(config, tools=TOOLS, **extra)


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _json_call(name: str, args: Any, key: str = "parameters") -> str:
    return json.dumps({"name": name, key: args}, ensure_ascii=False)


def _json_list(*calls: tuple[str, Any]) -> str:
    """The JSON list vLLM parses for tool_choice required/named on parsers that support it."""
    return json.dumps([{"name": n, "parameters": a} for n, a in calls], ensure_ascii=False)


def _forced_cases(b: CorpusBuilder, cfg: str, native: tuple[Any, ...], eos: int) -> None:
    """tool_choice none / required / named, over the native call and over a JSON list."""
    json_list = _json_list(("get_weather", {"city": "Paris"}))
    b.chat_all(f"{cfg}_choice_none", cfg, _tools(cfg, tool_choice="none"), [Out((*native, eos))], "b1")
    b.chat_all(f"{cfg}_required_native", cfg, _tools(cfg, tool_choice="required"), [Out((*native, eos))], "b1")
    b.chat_all(f"{cfg}_required_json", cfg, _tools(cfg, tool_choice="required"), [Out((json_list, eos))], "b1r")
    b.chat_all(f"{cfg}_named_native", cfg, _tools(cfg, tool_choice=NAMED), [Out((*native, eos))], "b1")
    b.chat_all(f"{cfg}_named_json", cfg, _tools(cfg, tool_choice=NAMED), [Out(('{"city": "Rome"}', eos))], "b1r")
    b.chat_all(
        f"{cfg}_parallel_false", cfg, _tools(cfg, parallel_tool_calls=False), [Out((*native, "; ", *native, eos))], "b1"
    )


def _llama_json_cases(b: CorpusBuilder, cfg: str, tag: int, eos: int) -> None:
    paris = _json_call("get_weather", {"city": "Paris", "unit": "celsius"})
    shoes = _json_call("search_products", SEARCH_ARGS)
    b.chat_all(f"{cfg}_content", cfg, _req(cfg), [Out(("Hello! The weather is fine. {not json} ok", eos))])
    b.chat_all(f"{cfg}_content_tools", cfg, _tools(cfg), [Out(("I can help with that: " + UNI, eos))])
    b.chat_all(f"{cfg}_tag_call", cfg, _tools(cfg), [Out((tag, paris, eos))])
    b.chat_all(f"{cfg}_bare_call", cfg, _tools(cfg), [Out((paris, eos))])
    b.chat_all(
        f"{cfg}_arguments_key", cfg, _tools(cfg), [Out((_json_call("get_weather", {"city": UNI}, "arguments"), eos))]
    )
    b.chat_all(f"{cfg}_two_calls", cfg, _tools(cfg), [Out((tag, paris, "; ", shoes, eos))])
    b.chat_all(f"{cfg}_content_then_call", cfg, _tools(cfg), [Out(("Sure, checking. ", paris, eos))])
    b.chat_all(f"{cfg}_call_then_content", cfg, _tools(cfg), [Out((tag, paris, " Done, see above.", eos))])
    b.chat_all(f"{cfg}_missing_name", cfg, _tools(cfg), [Out((tag, '{"parameters": {"city": "Paris"}}', eos))])
    b.chat_all(
        f"{cfg}_malformed",
        cfg,
        _tools(cfg),
        [Out((tag, '{"name": "get_weather", "parameters": {"city": Paris}}', eos))],
    )
    b.chat_all(
        f"{cfg}_length_in_call",
        cfg,
        _tools(cfg),
        [Out((tag, '{"name": "search_products", "parameters": {"query": "red sh'), finish_reason="length")],
    )
    b.chat_all(
        f"{cfg}_split_markup",
        cfg,
        _tools(cfg),
        [Out((("{", '"na', 'me": "get_', 'weather", "param', 'eters": {"city": "Pa', 'ris"}}'), eos))],
    )
    b.chat_all(f"{cfg}_no_eos", cfg, _tools(cfg), [Out((tag, paris), finish_reason="stop", stop_reason=None)])
    b.chat_all(f"{cfg}_no_reasoning", cfg, _tools(cfg, include_reasoning=False), [Out((tag, paris, eos))], "b1")
    _forced_cases(b, cfg, (tag, paris), eos)


PY_PARIS = "get_weather(city='Paris', unit='celsius')"
PY_SHOES = (
    "search_products(query='red shoes', filters={'price': {'max': 50, 'min': 10.5}, 'brands': ['Acme']}, limit=5)"
)


def _pythonic_cases(b: CorpusBuilder, cfg: str, eos: int, start: int | None, end: int | None) -> None:
    wrap = (lambda *s: (start, *s, end)) if start is not None else (lambda *s: s)
    b.chat_all(f"{cfg}_content", cfg, _tools(cfg), [Out(("Hello! [not a call] " + UNI, eos))])
    b.chat_all(f"{cfg}_one_call", cfg, _tools(cfg), [Out(("[" + PY_PARIS + "]", eos))])
    b.chat_all(f"{cfg}_two_calls", cfg, _tools(cfg), [Out(("[" + PY_PARIS + ", " + PY_SHOES + "]", eos))])
    b.chat_all(
        f"{cfg}_literals",
        cfg,
        _tools(cfg),
        [
            Out(
                (
                    '[search_products(query="caf\\u00e9 '
                    + UNI
                    + '", limit=-3, in_stock=True, x=None, y=(1, 2.5), z=false)]',
                    eos,
                )
            )
        ],
    )
    b.chat_all(f"{cfg}_content_then_call", cfg, _tools(cfg), [Out(("Let me check. [" + PY_PARIS + "]", eos))])
    b.chat_all(f"{cfg}_call_then_content", cfg, _tools(cfg), [Out(("[" + PY_PARIS + "] and more text", eos))])
    b.chat_all(f"{cfg}_malformed", cfg, _tools(cfg), [Out(("[get_weather(city=Paris)]", eos))])
    b.chat_all(f"{cfg}_length_in_call", cfg, _tools(cfg), [Out(("[get_weather(city='Par",), finish_reason="length")])
    b.chat_all(
        f"{cfg}_split_markup",
        cfg,
        _tools(cfg),
        [Out((("[get", "_weather(ci", "ty='Pa", "ris', un", "it='cel", "sius')", "]"), eos))],
    )
    if start is not None:
        b.chat_all(f"{cfg}_wrapped_call", cfg, _tools(cfg), [Out((*wrap("[" + PY_PARIS + ", " + PY_SHOES + "]"), eos))])
        b.chat_all(f"{cfg}_wrapped_no_end", cfg, _tools(cfg), [Out((start, "[" + PY_PARIS + "]", eos))])
    _forced_cases(b, cfg, ("[" + PY_PARIS + "]",), eos)


THOUGHT = "Here is my thought process: The user asks about Paris weather. I should call the tool."
RESPONSE = " Here is my response: It is sunny in Paris, 21 degrees."


def _granite_cases(b: CorpusBuilder) -> None:
    cfg = "p_granite"
    eos, tc = _GR["<|end_of_text|>"], _GR["<|tool_call|>"]
    calls = json.dumps(
        [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search_products", "arguments": SEARCH_ARGS}]
    )
    think = _req(cfg, chat_template_kwargs={"thinking": True})
    b.chat_all(f"{cfg}_content", cfg, _req(cfg), [Out(("Hello there: " + UNI, eos))])
    b.chat_all(f"{cfg}_reasoning", cfg, think, [Out((THOUGHT + RESPONSE, eos))])
    b.chat_all(
        f"{cfg}_reasoning_heres",
        cfg,
        think,
        [Out(("Here's my thought process: hmm: Here it is. Here's my response: ok", eos))],
    )
    b.chat_all(
        f"{cfg}_reasoning_unfinished", cfg, think, [Out((THOUGHT + " Here is my resp",), finish_reason="length")]
    )
    b.chat_all(
        f"{cfg}_reasoning_split",
        cfg,
        think,
        [
            Out(
                (
                    (
                        "Here",
                        " is my",
                        " thought pro",
                        "cess:",
                        " a: b",
                        " Here is",
                        " my resp",
                        "onse:",
                        " done " + UNI,
                    ),
                    eos,
                )
            )
        ],
    )
    b.chat_all(
        f"{cfg}_reasoning_no_reasoning",
        cfg,
        dict(think, include_reasoning=False),
        [Out((THOUGHT + RESPONSE, eos))],
        "b1",
    )
    b.chat_all(f"{cfg}_tool_token", cfg, _tools(cfg), [Out((tc, calls, eos))])
    b.chat_all(f"{cfg}_tool_string", cfg, _tools(cfg), [Out(("Sure. <tool_call>", calls, eos))])
    b.chat_all(f"{cfg}_tool_then_content", cfg, _tools(cfg), [Out((tc, calls, " anything else?", eos))])
    b.chat_all(
        f"{cfg}_tool_length",
        cfg,
        _tools(cfg),
        [Out((tc, '[{"name": "get_weather", "arguments": {"city": "Pa'), finish_reason="length")],
    )
    b.chat_all(
        f"{cfg}_tool_malformed",
        cfg,
        _tools(cfg),
        [Out((tc, '[{"name": "get_weather", "arguments": {"city": Paris}}]', eos))],
    )
    b.chat_all(
        f"{cfg}_reasoning_tool",
        cfg,
        dict(_tools(cfg), chat_template_kwargs={"thinking": True}),
        [Out((THOUGHT + " Here is my response:", tc, calls, eos))],
    )
    _forced_cases(b, cfg, (tc, calls), eos)


def _granite_tool_cases(b: CorpusBuilder) -> None:
    """The granite tool parser alone: with the granite reasoning parser vLLM's stream never
    leaves reasoning, so only this config streams through the tool parser."""
    cfg = "p_granite_tool"
    eos, tc = _GR["<|end_of_text|>"], _GR["<|tool_call|>"]
    calls = json.dumps(
        [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search_products", "arguments": SEARCH_ARGS}]
    )
    b.chat_all(f"{cfg}_content", cfg, _tools(cfg), [Out(("Hello there <tool " + UNI, eos))])
    b.chat_all(f"{cfg}_tool_token", cfg, _tools(cfg), [Out((tc, calls, eos))])
    b.chat_all(f"{cfg}_tool_string", cfg, _tools(cfg), [Out(("Sure. ", ("<tool", "_call>"), " " + calls, eos))])
    b.chat_all(f"{cfg}_tool_then_content", cfg, _tools(cfg), [Out(("Ok ", tc, calls, " anything else?", eos))])
    b.chat_all(
        f"{cfg}_tool_length",
        cfg,
        _tools(cfg),
        [Out((tc, '[{"name": "get_weather", "arguments": {"city": "Pa'), finish_reason="length")],
    )
    b.chat_all(f"{cfg}_not_an_array", cfg, _tools(cfg), [Out((tc, ' {"name": "get_weather"} trailing', eos))])
    b.chat_all(
        f"{cfg}_args_first",
        cfg,
        _tools(cfg),
        [Out((tc, '[{"arguments": {"city": "Rome", "unit": "celsius"}, "name": "get_weather"}]', eos))],
    )
    b.chat_all(f"{cfg}_string_args", cfg, _tools(cfg), [Out((tc, '[{"name": "get_weather", "arguments": "x"}]', eos))])
    _forced_cases(b, cfg, (tc, calls), eos)


def _granite4_cases(b: CorpusBuilder) -> None:
    cfg = "p_granite4"
    eos = _GR["<|end_of_text|>"]
    paris = json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})
    shoes = json.dumps({"name": "search_products", "arguments": SEARCH_ARGS}, ensure_ascii=False)
    b.chat_all(f"{cfg}_content", cfg, _tools(cfg), [Out(("Hello <tool" + UNI, eos))])
    b.chat_all(f"{cfg}_one_call", cfg, _tools(cfg), [Out((QWEN_TC, "\n" + paris + "\n", QWEN_END_TC, eos))])
    b.chat_all(
        f"{cfg}_two_calls",
        cfg,
        _tools(cfg),
        [Out(("Checking. ", QWEN_TC, paris, QWEN_END_TC, "\n", QWEN_TC, shoes, QWEN_END_TC, " ok", eos))],
    )
    b.chat_all(f"{cfg}_text_markers", cfg, _tools(cfg), [Out((("<tool", "_call>", paris, "</tool", "_call>"), eos))])
    b.chat_all(
        f"{cfg}_malformed",
        cfg,
        _tools(cfg),
        [Out((QWEN_TC, '{"name": "get_weather", "arguments": {city}}', QWEN_END_TC, eos))],
    )
    b.chat_all(f"{cfg}_unterminated", cfg, _tools(cfg), [Out((QWEN_TC, paris, eos))])
    b.chat_all(
        f"{cfg}_length_in_call",
        cfg,
        _tools(cfg),
        [Out((QWEN_TC, '{"name": "get_weather", "argu'), finish_reason="length")],
    )
    b.chat_all(
        f"{cfg}_string_args",
        cfg,
        _tools(cfg),
        [Out((QWEN_TC, '{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}', QWEN_END_TC, eos))],
    )
    _forced_cases(b, cfg, (QWEN_TC, paris, QWEN_END_TC), eos)


def _nemotron_cases(b: CorpusBuilder) -> None:
    cfg = "p_nemotron_v3"
    hermes = (QWEN_TC, "\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}) + "\n", QWEN_END_TC)
    b.chat_all(
        f"{cfg}_reasoning",
        cfg,
        _req(cfg),
        [Out(("Let me think about " + UNI + " \n\n", QWEN_END_THINK, "\n\nHello! Fine.", IM_END))],
    )
    b.chat_all(
        f"{cfg}_reasoning_only", cfg, _req(cfg), [Out(("Thinking only, no answer.  \n", QWEN_END_THINK, IM_END))]
    )
    b.chat_all(f"{cfg}_unfinished", cfg, _req(cfg), [Out(("Still thinking ...",), finish_reason="length")])
    b.chat_all(
        f"{cfg}_thinking_off",
        cfg,
        _req(cfg, chat_template_kwargs={"enable_thinking": False}),
        [Out(("Plain answer " + UNI, IM_END))],
    )
    b.chat_all(
        f"{cfg}_thinking_off_empty",
        cfg,
        _req(cfg, chat_template_kwargs={"enable_thinking": False}),
        [Out(("Some text", QWEN_END_THINK, "  ", IM_END))],
    )
    b.chat_all(
        f"{cfg}_force_nonempty",
        cfg,
        _req(cfg, chat_template_kwargs={"force_nonempty_content": True}),
        [Out(("Only reasoning here.", QWEN_END_THINK, IM_END))],
    )
    b.chat_all(
        f"{cfg}_tool", cfg, _tools(cfg), [Out(("I should call the tool.\n", QWEN_END_THINK, "\n\n", *hermes, IM_END))]
    )
    b.chat_all(
        f"{cfg}_no_reasoning",
        cfg,
        _req(cfg, include_reasoning=False),
        [Out(("hidden", QWEN_END_THINK, "shown", IM_END))],
    )
    b.chat_all(f"{cfg}_split_end", cfg, _req(cfg), [Out((("abc </th", "ink> def"), IM_END))])


def build_parser_corpus(encoders: Mapping[str, Encoder]) -> list[DerenderCase]:
    b = ParserCorpusBuilder(encoders)
    _llama_json_cases(b, "p_llama3_json", _L3["<|python_tag|>"], _L3["<|eot_id|>"])
    _llama_json_cases(b, "p_llama4_json", _L4["<|python_tag|>"], _L4["<|eot|>"])
    paris = _json_call("get_weather", {"city": "Paris"})
    b.chat_all(
        "p_llama4_json_python_start",
        "p_llama4_json",
        _tools("p_llama4_json"),
        [Out((_L4["<|python_start|>"], paris, _L4["<|python_end|>"], _L4["<|eot|>"]))],
    )
    _pythonic_cases(b, "p_pythonic", _L3["<|eot_id|>"], None, None)
    _pythonic_cases(b, "p_llama4_pythonic", _L4["<|eot|>"], _L4["<|python_start|>"], _L4["<|python_end|>"])
    _granite_cases(b)
    _granite_tool_cases(b)
    _granite4_cases(b)
    _nemotron_cases(b)
    return b.cases


def build_parser_corpus_from_dirs(model_dirs: Mapping[str, str | Path]) -> dict[str, DerenderCase]:
    encoders = {family: Encoder(load_tokenizer(path)) for family, path in model_dirs.items()}
    return {c.name: c for c in build_parser_corpus(encoders)}


def parser_golden_path(config: str, name: str) -> Path:
    return GOLDEN_ROOT / config / f"{name}.json"


def iter_parser_goldens() -> Iterator[dict[str, Any]]:
    # golden_parsers/ is shared with other families' corpora: this one's configs are named p_*
    for path in sorted(GOLDEN_ROOT.glob("p_*/*.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


# -- render (the parsers' adjust_request / structural-tag effects on the GenerateRequest) ---------

RENDER_ROOT = GOLDEN_ROOT / "render"
STRICT_WEATHER = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}


def render_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(case, config, chat render request) for every parser config."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for cfg, config in PARSER_CONFIGS.items():
        model = SERVED_NAMES[config.family]

        def req(**extra: Any) -> dict[str, Any]:
            return {"model": model, "messages": REQUEST, **extra}  # noqa: B023

        variants: dict[str, dict[str, Any]] = {
            "plain": req(),
            "auto": req(tools=TOOLS),
            "auto_strict": req(tools=[STRICT_WEATHER, SEARCH_TOOL]),
            "none": req(tools=TOOLS, tool_choice="none"),
            "required": req(tools=TOOLS, tool_choice="required"),
            "named": req(tools=TOOLS, tool_choice=NAMED),
            "no_parallel": req(tools=TOOLS, parallel_tool_calls=False),
            "skip_special": req(tools=TOOLS, skip_special_tokens=True),
            "thinking_off": req(tools=TOOLS, chat_template_kwargs={"enable_thinking": False, "thinking": False}),
            "thinking_on": req(chat_template_kwargs={"thinking": True}),
        }
        out += [(f"render_{cfg}_{name}", cfg, body) for name, body in variants.items()]
    return out


def render_golden_path(config: str, name: str) -> Path:
    return RENDER_ROOT / config / f"{name}.json"


def iter_render_goldens() -> Iterator[dict[str, Any]]:
    for path in sorted(RENDER_ROOT.glob("*/*.json")):
        yield json.loads(path.read_text(encoding="utf-8"))
