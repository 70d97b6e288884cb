"""End-to-end parity corpus for the DeepSeek V3/V3.1 (and Kimi K2) parser families: render requests and
synthetic engine outputs, recorded from vLLM 0.33's `vllm launch render` started on the family's fixture
folder (tests/parsers/families/) with the family's parser flags.

Shared by record_families.py (writes goldens) and test_families_parity.py (replays them against our
app). Goldens: golden_parsers/<family>/<case>.json, in golden_derender's format plus, for render
cases, `{"kind": "render", "calls": [{request, status, response}]}`.

The machinery (outputs as token segments, batch/stream call building, llm-d style state echo) is
derender_corpus.py's; this module only adds the families' server configs and cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from render_service.model.example import build_example_model
from tests.parsers.families import deepseek as ds_fixture
from tests.parsers.families import gemma4 as gemma4_fixture
from tests.parsers.families import kimi as kimi_fixture

from .corpus import CONFIGS, ServerConfig
from .derender_corpus import (
    FAMILIES as DERENDER_FAMILIES,
)
from .derender_corpus import (
    CorpusBuilder,
    DerenderCase,
    Encoder,
    Family,
    Out,
    Seg,
    chat,
    load_tokenizer,
    streaming,
)

GOLDEN_ROOT = Path(__file__).resolve().parent / "golden_parsers"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}},
    },
}
STRICT_WEATHER = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
TOOLS = [WEATHER, SEARCH]


@dataclass(frozen=True)
class ModelFamily:
    """A fixture folder and the server configs started on it."""

    name: str
    builder: Callable[[Path], Path]
    served_name: str
    derender: Family


KIMI_IDS = kimi_fixture.IDS
G_IDS = gemma4_fixture.IDS
SEED_IDS = {"<seed:eos>": 151670, "<seed:think>": 151671, "</seed:think>": 151672, "<seed:tool_call>": 151673}
SEED_IDS["</seed:tool_call>"] = 151674
MODEL_FAMILIES: dict[str, ModelFamily] = {
    "seed_oss": ModelFamily(
        "seed_oss",
        lambda path: build_example_model(path, "seed_oss"),
        "tinyseed",
        Family(
            "tinyseed", eos=SEED_IDS["<seed:eos>"], think=SEED_IDS["<seed:think>"], end_think=SEED_IDS["</seed:think>"]
        ),
    ),
    "gemma4": ModelFamily(
        "gemma4",
        gemma4_fixture.build,
        gemma4_fixture.SERVED_NAME,
        Family(
            gemma4_fixture.SERVED_NAME,
            eos=G_IDS["<turn|>"],
            think=G_IDS["<|channel>"],
            end_think=G_IDS["<channel|>"],
        ),
    ),
    "dsv3": ModelFamily(
        "dsv3",
        ds_fixture.build,
        ds_fixture.SERVED_NAME,
        Family(ds_fixture.SERVED_NAME, eos=1, think=128821, end_think=128822),
    ),
    "kimi": ModelFamily(
        "kimi",
        kimi_fixture.build,
        kimi_fixture.SERVED_NAME,
        Family(
            kimi_fixture.SERVED_NAME,
            eos=KIMI_IDS["<|im_end|>"],
            think=KIMI_IDS["<think>"],
            end_think=KIMI_IDS["</think>"],
        ),
    ),
}

FAMILY_CONFIGS: dict[str, ServerConfig] = {
    c.name: c
    for c in (
        ServerConfig(
            "dsv3_tools",
            family="dsv3",
            served_model_name=ds_fixture.SERVED_NAME,
            reasoning_parser="deepseek_v3",
            tool_call_parser="deepseek_v3",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "dsv31_tools",
            family="dsv3",
            served_model_name=ds_fixture.SERVED_NAME,
            reasoning_parser="deepseek_v3",
            tool_call_parser="deepseek_v31",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "gemma4_tools",
            family="gemma4",
            served_model_name=gemma4_fixture.SERVED_NAME,
            reasoning_parser="gemma4",
            tool_call_parser="gemma4",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "gemma4_tools_only",
            family="gemma4",
            served_model_name=gemma4_fixture.SERVED_NAME,
            tool_call_parser="gemma4",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "dsv32_tools",
            family="dsv3",
            served_model_name=ds_fixture.SERVED_NAME,
            reasoning_parser="deepseek_v3",
            tool_call_parser="deepseek_v32",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "seed_tools",
            family="seed_oss",
            served_model_name="tinyseed",
            reasoning_parser="seed_oss",
            tool_call_parser="seed_oss",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "seed_tools_only",
            family="seed_oss",
            served_model_name="tinyseed",
            tool_call_parser="seed_oss",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "kimi_tools",
            family="kimi",
            served_model_name=kimi_fixture.SERVED_NAME,
            reasoning_parser="kimi_k2",
            tool_call_parser="kimi_k2",
            enable_auto_tool_choice=True,
        ),
        ServerConfig(
            "kimi_tools_only",
            family="kimi",
            served_model_name=kimi_fixture.SERVED_NAME,
            tool_call_parser="kimi_k2",
            enable_auto_tool_choice=True,
        ),
    )
}

# The derender corpus machinery looks configs and families up by name.
CONFIGS.update(FAMILY_CONFIGS)
DERENDER_FAMILIES.update({name: f.derender for name, f in MODEL_FAMILIES.items()})


def golden_dir(config: str) -> Path:
    return GOLDEN_ROOT / FAMILY_CONFIGS[config].family


@dataclass(frozen=True)
class RenderCase:
    name: str
    config: str
    body: dict[str, Any]
    kind: str = "render"

    def request(self) -> dict[str, Any]:
        return {"method": "POST", "path": "/v1/chat/completions/render", "headers": {}, "json": self.body}


class FamilyCorpus(CorpusBuilder):
    def __init__(self, encoders: Mapping[str, Encoder]) -> None:
        super().__init__(encoders)
        self.renders: list[RenderCase] = []

    def _add(self, case: DerenderCase) -> None:
        assert case.config in FAMILY_CONFIGS, case.config
        assert all(c.name != case.name for c in self.cases), case.name
        self.cases.append(case)

    def render(self, name: str, config: str, body: dict[str, Any]) -> None:
        assert all(r.name != name for r in self.renders), name
        self.renders.append(RenderCase(name, config, body))

    def tool_choice_cases(
        self,
        tag: str,
        config: str,
        req: dict[str, Any],
        *,
        calls: tuple[Seg, ...],
        named: tuple[Seg, ...],
        reasoning: tuple[Seg, ...],
        noreason: dict[str, Any],
    ) -> None:
        """Renders and outputs (batch and one token per chunk) of one family under each
        `tool_choice`, without tools, with strict tools, `parallel_tool_calls=false` and
        `include_reasoning=false` (`calls`: the output's calls up to the end of the turn; `named`:
        one get_weather call; `noreason`: the request that reasons)."""
        model, user = req["model"], req["messages"]
        named_choice = {"type": "function", "function": {"name": "get_weather"}}
        self.render(f"{tag}_render_auto", config, req)
        self.render(f"{tag}_render_required", config, {**req, "tool_choice": "required"})
        self.render(
            f"{tag}_render_named", config, {**req, "tool_choice": {"type": "function", "function": {"name": "search"}}}
        )
        self.render(f"{tag}_render_none", config, {**req, "tool_choice": "none"})
        self.render(f"{tag}_render_notools", config, chat(user, model))
        self.render(f"{tag}_render_strict", config, chat(user, model, tools=[STRICT_WEATHER, SEARCH]))
        self.chat_all(f"{tag}_none", config, {**req, "tool_choice": "none"}, [Out((*reasoning, "ok ", *calls))], "b1")
        self.chat_all(f"{tag}_notools", config, chat(user, model), [Out((*reasoning, "ok ", *calls))], "b1")
        self.chat_all(f"{tag}_required", config, {**req, "tool_choice": "required"}, [Out(calls)], "b1")
        self.chat_all(f"{tag}_named", config, {**req, "tool_choice": named_choice}, [Out(named)], "b1")
        self.chat_all(f"{tag}_noparallel", config, {**req, "parallel_tool_calls": False}, [Out(calls)], "b1")
        self.chat_all(
            f"{tag}_noreason", config, {**noreason, "include_reasoning": False}, [Out((*reasoning, *calls))], "b1"
        )


# -- DeepSeek V3 / V3.1 ------------------------------------------------------------------------------------

CB, CE, B, E, SEP = 128806, 128807, 128808, 128809, 128814
THINK, END_THINK, EOS = 128821, 128822, 1


def ds_call(name: str, args: str, v31: bool) -> tuple[Seg, ...]:
    if v31:
        return (B, name, SEP, args, E)
    return (B, "function", SEP, name + "\n```json\n" + args + "\n```", E)


def weather_history(user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`user`, then one get_weather call (id `call_1`) and its result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        *user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]


def _deepseek_cases(b: FamilyCorpus) -> None:
    model = ds_fixture.SERVED_NAME
    user = [{"role": "user", "content": "What's the weather in Paris and Tokyo?"}]
    history = weather_history(user)
    think_on = {"chat_template_kwargs": {"thinking": True}}
    for cfg, v31 in (("dsv3_tools", False), ("dsv31_tools", True)):
        tag = "v31" if v31 else "v3"
        req = chat(user, model, tools=TOOLS)
        # render: adjust_request / structural tags / reasoning_ended per tool_choice and thinking
        b.render(f"{tag}_render_auto", cfg, req)
        b.render(f"{tag}_render_think", cfg, {**req, **think_on})
        b.render(f"{tag}_render_required", cfg, {**req, "tool_choice": "required"})
        b.render(
            f"{tag}_render_named", cfg, {**req, "tool_choice": {"type": "function", "function": {"name": "search"}}}
        )
        b.render(f"{tag}_render_none", cfg, {**req, "tool_choice": "none"})
        b.render(f"{tag}_render_strict", cfg, chat(user, model, tools=[STRICT_WEATHER, SEARCH]))
        b.render(f"{tag}_render_noparallel", cfg, {**req, "tool_choice": "required", "parallel_tool_calls": False})
        b.render(f"{tag}_render_history", cfg, chat(history, model, tools=TOOLS, **think_on))

        paris = ds_call("get_weather", '{"city": "Paris", "unit": "celsius"}', v31)
        tokyo = ds_call("get_weather", '{"city": "東京"}', v31)
        search = ds_call("search", '{\n  "q": "weather 🎉",\n  "n": 3\n}', v31)
        calls = (CB, *paris, *tokyo, *search, CE, EOS)
        reasoning = (THINK, "The user wants two cities. I'll call get_weather twice.", END_THINK)
        b.chat_all(f"{tag}_calls_think", cfg, {**req, **think_on}, [Out((*reasoning, *calls))])
        b.chat_all(f"{tag}_calls", cfg, req, [Out(("Let me check. ", *calls))])
        b.chat_all(f"{tag}_content", cfg, req, [Out(("The weather is sunny in Paris — 晴れ ☀️.", EOS))])
        b.chat_all(f"{tag}_content_after", cfg, req, [Out((CB, *paris, CE, " Done, anything else?", EOS))])
        b.chat_all(f"{tag}_malformed", cfg, req, [Out((CB, *ds_call("get_weather", '{"city": "Par', v31), CE, EOS))])
        b.chat_all(
            f"{tag}_truncated", cfg, req, [Out((CB, B, "get_weather" if v31 else "function", SEP), "length")], "b1"
        )
        b.chat_all(
            f"{tag}_length_in_call",
            cfg,
            {**req, **think_on},
            [Out((*reasoning, CB, *ds_call("get_weather", '{"city": "Paris", "unit": "cel', v31)[:-1]), "length")],
        )
        b.chat_all(f"{tag}_none", cfg, {**req, "tool_choice": "none"}, [Out(("ok ", *calls))], "b1")
        b.chat_all(f"{tag}_required", cfg, {**req, "tool_choice": "required"}, [Out(calls)], "b1")
        b.chat_all(
            f"{tag}_named",
            cfg,
            {**req, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            [Out((CB, *paris, CE, EOS))],
            "b1",
        )
        b.chat_all(f"{tag}_noparallel", cfg, {**req, "parallel_tool_calls": False}, [Out(calls)], "b1")
        b.chat_all(
            f"{tag}_noreason", cfg, {**req, **think_on, "include_reasoning": False}, [Out((*reasoning, *calls))], "b1"
        )
        b.chat_all(
            f"{tag}_split_markers",
            cfg,
            req,
            [
                Out(
                    (
                        ("<｜tool▁", "calls▁begin｜>"),
                        "x",
                        CB,
                        B,
                        ("get_", "wea", "ther"),
                        SEP,
                        ("{", '"city": "東', "京"),
                        E,
                        CE,
                    )
                )
            ],
            "b1r",  # the batch twin: what a held-calls stream accumulates to (deliberate.HELD_CALLS)
        )
        b.chat_all(
            f"{tag}_history", cfg, {**history_req(history, model), **think_on}, [Out((*reasoning, "Sunny.", EOS))], "b1"
        )


def _kimi_cases(b: FamilyCorpus) -> None:
    k = KIMI_IDS
    model = kimi_fixture.SERVED_NAME
    think, end_think, eos = k["<think>"], k["</think>"], k["<|im_end|>"]
    sec, sec_end = k["<|tool_calls_section_begin|>"], k["<|tool_calls_section_end|>"]
    call, arg, call_end = k["<|tool_call_begin|>"], k["<|tool_call_argument_begin|>"], k["<|tool_call_end|>"]
    user = [{"role": "user", "content": "What's the weather in Paris and Tokyo?"}]
    history = [
        *user,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "functions.get_weather:1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "rain"},
        {"role": "user", "content": "And Tokyo?"},
    ]

    def kcall(header: str, args: str, close: bool = True) -> tuple[Seg, ...]:
        return (call, header, arg, args, *((call_end,) if close else ()))

    paris = kcall("functions.get_weather:0", '{"city": "Paris", "unit": "celsius"}')
    tokyo = kcall("functions.get_weather:1", '{"city": "東京"}')
    search = kcall("functions.search:2", '{\n  "q": "weather 🎉",\n  "n": 3\n}')
    calls = (sec, *paris, *tokyo, *search, sec_end, eos)
    reasoning = (think, "The user wants two cities. I'll call get_weather twice.\n", end_think)
    nothink = {"chat_template_kwargs": {"thinking": False}}
    for cfg, tag in (("kimi_tools", "kimi"), ("kimi_tools_only", "kimit")):
        req = chat(user, model, tools=TOOLS)
        b.tool_choice_cases(
            tag, cfg, req, calls=calls, named=(sec, *paris, sec_end, eos), reasoning=reasoning, noreason=req
        )
        b.render(f"{tag}_render_nothink", cfg, {**req, **nothink})
        b.render(f"{tag}_render_history", cfg, chat(history, model, tools=TOOLS))
        b.chat_all(f"{tag}_calls", cfg, req, [Out((*reasoning, *calls))])
        b.chat_all(f"{tag}_content", cfg, req, [Out((*reasoning, "Sunny in Paris — 晴れ ☀️.", eos))])
        b.chat_all(f"{tag}_nothink_calls", cfg, {**req, **nothink}, [Out(("Checking. ", *calls))])
        b.chat_all(
            f"{tag}_history_calls",
            cfg,
            chat(history, model, tools=TOOLS),
            [Out((*reasoning, sec, *kcall("functions.get_weather:2", '{"city": "Tokyo"}'), sec_end, eos))],
        )
        b.chat_all(
            f"{tag}_content_after", cfg, req, [Out((*reasoning, sec, *paris, sec_end, " trailing text", eos))], "b1"
        )
        b.chat_all(
            f"{tag}_bad_header",
            cfg,
            req,
            [Out((sec, *kcall("get_weather", '{"city": "Paris"}'), *kcall("functions.search:1", "{}"), sec_end, eos))],
            "b1",
        )
        b.chat_all(
            f"{tag}_malformed",
            cfg,
            req,
            [Out((sec, *kcall("functions.get_weather:0", '{"city": "Par'), sec_end, eos))],
            "b1",
        )
        b.chat_all(
            f"{tag}_length_in_call",
            cfg,
            req,
            [Out((*reasoning, sec, *kcall("functions.get_weather:0", '{"city": "Paris", "un', close=False)), "length")],
        )
        b.chat_all(
            f"{tag}_split",
            cfg,
            req,
            [
                Out(
                    (
                        think,
                        ("<", "thi", "nk>"),
                        " é\n\n",
                        end_think,
                        "  ",
                        sec,
                        call,
                        ("functions.", "get_", "weather:0"),
                        arg,
                        ('{"city": "東', '京"}'),
                        call_end,
                        sec_end,
                    )
                )
            ],
            "1r",
        )


def _gemma4_cases(b: FamilyCorpus) -> None:
    g = G_IDS
    model = gemma4_fixture.SERVED_NAME
    channel, end_channel, eos = g["<|channel>"], g["<channel|>"], g["<turn|>"]
    call, end_call, q = g["<|tool_call>"], g["<tool_call|>"], g['<|"|>']
    user = [{"role": "user", "content": "What's the weather in Paris and Tokyo?"}]
    history = weather_history(user)

    def gcall(name: str, *body: Seg, close: bool = True) -> tuple[Seg, ...]:
        return (call, f"call:{name}{{", *body, *(("}", end_call) if close else ()))

    paris = gcall("get_weather", "city:", q, "Paris", q, ",unit:", q, "celsius", q)
    tokyo = gcall("get_weather", "city:", q, "東京 (Tōkyō), Japan", q)
    search = gcall("search", "q:", q, "weather 🎉 {x}", q, ",n:3")
    calls = (paris, tokyo, search)
    flat_calls = tuple(seg for c in calls for seg in c)
    reasoning = (channel, "thought\nThe user wants two cities. I'll call get_weather twice.", end_channel)
    think_on = {"chat_template_kwargs": {"enable_thinking": True}}
    for cfg, tag in (("gemma4_tools", "g4"), ("gemma4_tools_only", "g4t")):
        req = chat(user, model, tools=TOOLS)
        b.tool_choice_cases(
            tag,
            cfg,
            req,
            calls=(*flat_calls, eos),
            named=(*paris, eos),
            reasoning=reasoning,
            noreason={**req, **think_on},
        )
        b.render(f"{tag}_render_think", cfg, {**req, **think_on})
        b.render(f"{tag}_render_history", cfg, chat(history, model, tools=TOOLS, **think_on))
        b.chat_all(f"{tag}_calls_think", cfg, {**req, **think_on}, [Out((*reasoning, *flat_calls, eos))])
        b.chat_all(f"{tag}_calls", cfg, req, [Out(("Let me check. ", *flat_calls, eos))])
        b.chat_all(f"{tag}_content", cfg, req, [Out(("The weather is sunny in Paris — 晴れ ☀️.", eos))])
        b.chat_all(f"{tag}_think_content", cfg, {**req, **think_on}, [Out((*reasoning, "Sunny.", eos))])
        b.chat_all(f"{tag}_content_after", cfg, req, [Out((*paris, " Done, anything else?", eos))])
        b.chat_all(
            f"{tag}_nested",
            cfg,
            req,
            [Out((*gcall("search", "q:", q, "a", q, ",deep:{a:[1,2.5,", q, "x", q, "],b:true}"), eos))],
            "b1",
        )
        b.chat_all(f"{tag}_malformed", cfg, req, [Out((*gcall("get_weather", "city:", q, "Par", ",n:"), eos))], "b1")
        b.chat_all(f"{tag}_truncated", cfg, req, [Out((call, "call:get_weather{city:", q), "length")], "b1")
        b.chat_all(
            f"{tag}_length_in_call",
            cfg,
            {**req, **think_on},
            [
                Out(
                    (*reasoning, *gcall("get_weather", "city:", q, "Paris", q, ",unit:", q, "cel", close=False)),
                    "length",
                )
            ],
        )
        b.chat_all(
            f"{tag}_history",
            cfg,
            {**chat(history, model, tools=TOOLS), **think_on},
            [Out(("thought\nThe tool answered.", end_channel, "Sunny, 21C.", eos))],
            "b1r",
        )
        b.chat_all(
            f"{tag}_split",
            cfg,
            {**req, **think_on},
            [
                Out(
                    (
                        channel,
                        ("tho", "ught", "\n é"),
                        end_channel,
                        "  ",
                        call,
                        ("ca", "ll:", "get_", "weather{"),
                        ("ci", "ty:"),
                        q,
                        ("東", "京 ("),
                        q,
                        ("}",),
                        end_call,
                        ("<|tool", "_call>"),
                        eos,
                    )
                )
            ],
            "1r",
        )


def _dsv32_cases(b: FamilyCorpus) -> None:
    """DeepSeek V3.2's DSML tool calls (no single-token markers: the tokenizer spells them)."""
    model, cfg = ds_fixture.SERVED_NAME, "dsv32_tools"
    user = [{"role": "user", "content": "What's the weather in Paris and Tokyo?"}]
    block, block_end = "\n\n<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>"

    def invoke(name: str, *params: tuple[str, str, bool], close: bool = True) -> str:
        body = "".join(
            f'<｜DSML｜parameter name="{k}" string="{"true" if is_str else "false"}">{v}</｜DSML｜parameter>\n'
            for k, v, is_str in params
        )
        return f'<｜DSML｜invoke name="{name}">\n{body}' + ("</｜DSML｜invoke>\n" if close else "")

    paris = invoke("get_weather", ("city", "Paris", True), ("unit", "celsius", True))
    tokyo = invoke("get_weather", ("city", "東京 > 😀", True))
    search = invoke("search", ("q", "weather", True), ("n", "3", False))
    calls = (block, paris, tokyo, search, block_end, EOS)
    reasoning = (THINK, "The user wants two cities. I'll call get_weather twice.", END_THINK)
    think_on = {"chat_template_kwargs": {"thinking": True}}
    req = chat(user, model, tools=TOOLS)
    b.tool_choice_cases(
        "v32",
        cfg,
        req,
        calls=calls,
        named=(block, paris, block_end, EOS),
        reasoning=reasoning,
        noreason={**req, **think_on},
    )
    b.render("v32_render_think", cfg, {**req, **think_on})
    b.chat_all("v32_calls_think", cfg, {**req, **think_on}, [Out((*reasoning, *calls))])
    b.chat_all("v32_calls", cfg, req, [Out(("Let me check.", *calls))])
    b.chat_all("v32_content", cfg, req, [Out(("The weather is sunny in Paris — 晴れ ☀️.", EOS))])
    b.chat_all("v32_content_after", cfg, req, [Out((block, paris, block_end, " Done, anything else?", EOS))], "b1")
    b.chat_all(
        "v32_wrapper",
        cfg,
        req,
        [Out((block, invoke("get_weather", ("arguments", '{"city": "Oslo"}', False)), block_end, EOS))],
        "b1",
    )
    b.chat_all(
        "v32_malformed",
        cfg,
        req,
        [Out((block, invoke("search", ("n", "not json {", False), ("q", "x", True)), block_end, EOS))],
        "b1",
    )
    b.chat_all("v32_truncated", cfg, req, [Out((block, '<｜DSML｜invoke name="get_wea'), "length")], "b1")
    b.chat_all(
        "v32_length_in_call",
        cfg,
        {**req, **think_on},
        [
            Out(
                (
                    *reasoning,
                    block,
                    invoke("get_weather", ("city", "Paris", True), close=False),
                    "<｜DSML｜parameter name=",
                ),
                "length",
            )
        ],
    )
    b.chat_all(
        "v32_split",
        cfg,
        req,
        [
            Out(
                (
                    ("\n\n<｜DS", "ML｜function_", "calls>\n"),
                    ("<｜DSML｜in", 'voke name="get_', 'weather">\n'),
                    tokyo.split("\n", 1)[1],
                    block_end,
                )
            )
        ],
        "1r",
    )


def _seed_cases(b: FamilyCorpus) -> None:
    """Seed-OSS: Qwen3 XML calls in `<seed:tool_call>`; required/named take vLLM's JSON paths."""
    ids = SEED_IDS
    think, end_think, eos = ids["<seed:think>"], ids["</seed:think>"], ids["<seed:eos>"]
    call, end_call = ids["<seed:tool_call>"], ids["</seed:tool_call>"]
    user = [{"role": "user", "content": "What's the weather in Paris and Tokyo?"}]

    def xml_call(name: str, **params: str) -> tuple[Seg, ...]:
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
        return (call, f"\n<function={name}>\n{body}</function>\n", end_call)

    paris = xml_call("get_weather", city="Paris", unit="celsius")
    calls = (*paris, *xml_call("get_weather", city="東京"), *xml_call("search", q="weather 🎉", n="3"), eos)
    reasoning = (think, "The user wants two cities. I'll call get_weather twice.", end_think)
    required_json = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "search", "parameters": {}}]'
    for cfg, tag in (("seed_tools", "seed"), ("seed_tools_only", "seedt")):
        req = chat(user, "tinyseed", tools=TOOLS)
        b.tool_choice_cases(tag, cfg, req, calls=calls, named=(*paris, eos), reasoning=reasoning, noreason=req)
        b.chat_all(f"{tag}_calls", cfg, req, [Out((*reasoning, "Checking.", *calls))])
        b.chat_all(f"{tag}_content", cfg, req, [Out((*reasoning, "Sunny in Paris — 晴れ ☀️.", eos))])
        b.chat_all(
            f"{tag}_nothink",
            cfg,
            {**req, "chat_template_kwargs": {"enable_thinking": False}},
            [Out(("Checking.", *calls))],
            "b1",
        )
        b.chat_all(f"{tag}_required_json", cfg, {**req, "tool_choice": "required"}, [Out((required_json, eos))])
        b.chat_all(
            f"{tag}_named_json",
            cfg,
            {**req, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            [Out(('{"city": "Paris"}', eos))],
        )
        b.chat_all(
            f"{tag}_length_in_call",
            cfg,
            req,
            [Out((*reasoning, call, "\n<function=get_weather>\n<parameter=city>\nPar"), "length")],
        )
        b.chat_all(
            f"{tag}_split",
            cfg,
            req,
            [
                Out(
                    (
                        think,
                        ("pl", "an é"),
                        end_think,
                        call,
                        ("\n<func", "tion=search>\n<para", "meter=q>\nx"),
                        ("\n</par", "ameter>\n</function>\n"),
                        end_call,
                        eos,
                    )
                )
            ],
            "1r",
        )


def history_req(messages: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return chat(messages, model, tools=TOOLS)


def build_corpus(encoders: Mapping[str, Encoder]) -> FamilyCorpus:
    b = FamilyCorpus(encoders)
    _deepseek_cases(b)
    _kimi_cases(b)
    _gemma4_cases(b)
    _dsv32_cases(b)
    _seed_cases(b)
    return b


def build_corpus_from_dirs(model_dirs: Mapping[str, str | Path]) -> FamilyCorpus:
    return build_corpus({name: Encoder(load_tokenizer(path)) for name, path in model_dirs.items()})


def golden_path(config: str, name: str) -> Path:
    return golden_dir(config) / f"{name}.json"


def iter_goldens() -> list[dict[str, Any]]:
    out = []
    # golden_parsers/ is shared with other families' corpora: only this corpus's model families
    for path in sorted(GOLDEN_ROOT.glob("*/*.json")):
        if path.parent.name in MODEL_FAMILIES:
            out.append(json.loads(path.read_text(encoding="utf-8")))
    return out


__all__ = ["FAMILY_CONFIGS", "MODEL_FAMILIES", "RenderCase", "build_corpus_from_dirs", "golden_path", "streaming"]
