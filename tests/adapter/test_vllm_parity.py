"""Every vLLM 0.33 parser name we have no native code for, through the adapter, against vLLM's own
render tier: batch and chunked streaming derender (and chat render) must be identical.

Opt-in (`-m live`) and run with a Python that has vLLM 0.33 installed (the extra), e.g.:

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=. VLLM_PYTHON -m pytest -m live -p no:cacheprovider tests/adapter

vLLM's render tier runs in the same process: `build_app(args, ("render",))` and
`init_render_app_state`, exactly what `vllm launch render` serves, with the `OnlineDerenderer`
rebuilt for each parser configuration (vLLM builds it from the same flags at start). Names that
vLLM cannot build on a fixture tokenizer (its start-up check fails) must fail our start too; a
name counts as covered on the first fixture model where vLLM builds it.

Names vLLM 0.33 cannot build on any fixture tokenizer are listed in `CANNOT_BUILD` with vLLM's
reason (a name that newly fails to build fails the test instead of skipping quietly). The Cohere
Command parsers need the `cohere-melody` package, as in vLLM: without it they are skipped.

Streaming sends each scripted output in random chunks and checks every chunk and the carried
state; a second pass drops our stream id half-way (another worker, an eviction) so the replay
path is checked as well as the live one. Tool-call ids are random in vLLM: they are compared by
order of first appearance (ids a family derives from the output, `functions.NAME:N`, verbatim).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.live, pytest.mark.timeout(3600)]

vllm = pytest.importorskip("vllm", reason="the adapter parity run needs vLLM (the render-service[vllm] extra)")

from starlette.testclient import TestClient  # noqa: E402

from render_service.adapter.names import VLLM_REASONING_PARSERS, VLLM_TOOL_PARSERS  # noqa: E402
from render_service.model.example import build_example_model  # noqa: E402
from render_service.parsers import reasoning_parser_names, tool_parser_names  # noqa: E402
from render_service.server.app import create_app  # noqa: E402
from render_service.settings import Settings  # noqa: E402
from tests.helpers import chunk_body  # noqa: E402

MODELS = ("qwen3", "deepseek", "minimax_m2", "seed_oss", "glm")

# vLLM's start-up check refuses these on every fixture tokenizer (the same names fail our start).
_NEEDS_RESPONSE_TEMPLATE = "needs `response_template` metadata in the tokenizer configuration"
CANNOT_BUILD = {
    ("reasoning", "beam"): _NEEDS_RESPONSE_TEMPLATE,
    ("reasoning", "hf"): _NEEDS_RESPONSE_TEMPLATE,
    ("reasoning", "k2_horizon"): "needs K2 Horizon's reasoning tokens in the vocabulary",
    ("reasoning", "mistral"): "needs Mistral's [TOOL_CALLS] control token in the vocabulary",
    ("reasoning", "poolside_v1"): "needs the '<assistant>' token in the vocabulary",
    ("tool", "beam"): _NEEDS_RESPONSE_TEMPLATE,
    ("tool", "hf"): _NEEDS_RESPONSE_TEMPLATE,
    ("tool", "hy_v3"): "needs Hunyuan V3's tool-call start/end tokens in the vocabulary",
    ("tool", "hy_v4"): "needs Hunyuan V4's tool-call start/end tokens in the vocabulary",
    ("tool", "jamba"): "needs Jamba's <tool_calls> start/end tokens in the vocabulary",
    ("tool", "lfm2"): "needs LFM2's <|tool_call_start|> / <|tool_call_end|> tokens in the vocabulary",
    ("tool", "mistral"): "needs Mistral's [TOOL_CALLS] control token in the vocabulary",
}
SERVED = "tiny"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
REQUESTS: dict[str, dict[str, Any]] = {
    "tools_auto": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]},
    "no_tools": {"messages": [{"role": "user", "content": "Hi"}]},
    "hidden_reasoning": {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "include_reasoning": False,
    },
}
_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# Markup of many families (the fixture tokenizers spell what they lack as text).
OUTPUTS = (
    "Hello world, no markup at all 😀 天气.",
    "<think>I should check 天气.</think>The answer is 42.",
    "I should check.</think>\n\nLet me look.<tool_call>\n" + _CALL + "\n</tool_call>",
    "Sure.<tool_call>\n" + _CALL + "\n</tool_call><tool_call>\n" + _CALL + "\n</tool_call>",
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS]get_weather{"city": "Paris"}',
    '[get_weather(city="Paris")]',
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    "<tool_calls>[" + _CALL + "]</tool_calls>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    "</invoke>\n</minimax:tool_call>",
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "<think>thinking</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "</tool_call>",
    " functools[" + _CALL + "]",
    "<seed:think>hmm</seed:think><seed:tool_call><function=get_weather><parameter=city>Paris</parameter>"
    "</function></seed:tool_call>",
)


# -- vLLM's render tier, in this process --------------------------------------------------------------


class VllmRenderTier:
    """`vllm launch render MODEL` as an ASGI app, its derenderer rebuilt per parser configuration."""

    def __init__(self, model_dir: Path) -> None:
        from vllm import AsyncEngineArgs, envs
        from vllm.config import VllmConfig
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.render.app_state import init_render_app_state
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.parser = make_arg_parser(FlexibleArgumentParser())
        args = self.parser.parse_args(["--model", str(model_dir), "--served-model-name", SERVED])
        engine_args = AsyncEngineArgs.from_cli_args(args)
        model_config = engine_args.create_model_config()
        model_config.quantization = None
        envs.VLLM_CPU_KVCACHE_SPACE = 0
        self.vllm_config = VllmConfig(
            model_config=model_config,
            logging_config=engine_args.create_logging_config(),
            structured_outputs_config=engine_args.create_structured_outputs_config(),
        )
        self.app = build_app(args, ("render",))
        asyncio.run(init_render_app_state(self.vllm_config, self.app.state, args))
        self.model_dir = model_dir
        self.args = args
        self.client = TestClient(self.app)

    def configure(self, reasoning: str | None, tool: str | None) -> None:
        """Rebuild the derenderer and renderer as vLLM does at start for these flags (raises when
        vLLM refuses them on this tokenizer)."""
        from vllm.entrypoints.common.cli_args import resolve_default_chat_template_kwargs
        from vllm.renderers.online_derenderer import OnlineDerenderer
        from vllm.renderers.online_renderer import OnlineRenderer

        state = self.app.state
        common = {
            "model_config": self.vllm_config.model_config,
            "renderer": state.online_derenderer.renderer,
            "request_logger": None,
            "chat_template": None,
            "chat_template_content_format": "auto",
            "enable_auto_tools": tool is not None,
            "tool_parser": tool,
            "reasoning_parser": reasoning,
            "default_chat_template_kwargs": resolve_default_chat_template_kwargs(self.args),
        }
        derenderer = OnlineDerenderer(**common)
        renderer = OnlineRenderer(**common)
        state.online_derenderer = derenderer
        state.serving_derender.online_derenderer = derenderer
        state.online_renderer = renderer
        for name in ("serving_render", "openai_serving_render"):
            serving = getattr(state, name, None)
            if serving is not None and hasattr(serving, "online_renderer"):
                serving.online_renderer = renderer


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_example_model(tmp_path_factory.mktemp(f"adapter-{name}"), name) for name in MODELS}


@pytest.fixture(scope="module")
def tiers(models: dict[str, Path]) -> Iterator[dict[str, VllmRenderTier]]:
    built: dict[str, VllmRenderTier] = {}

    class Lazy(dict[str, VllmRenderTier]):
        def __missing__(self, key: str) -> VllmRenderTier:
            built[key] = self[key] = VllmRenderTier(models[key])
            return built[key]

    yield Lazy()


# -- normalization ----------------------------------------------------------------------------------


def _normalize(value: Any, ids: dict[str, str]) -> Any:
    """Drop what differs by design (timestamps, our `rs_*` keys) and number the tool-call ids by
    order of first appearance (vLLM makes most of them at random, with family-specific prefixes)."""

    def number(call_id: Any) -> Any:
        return ids.setdefault(call_id, f"<tool-id-{len(ids)}>") if isinstance(call_id, str) else call_id

    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "created" or key.startswith("rs_"):
                continue
            if key == "tool_calls" and isinstance(item, list):
                item = [{**call, "id": number(call.get("id"))} if isinstance(call, dict) else call for call in item]
            if key == "last_tool_call_ids" and isinstance(item, list):
                item = [number(call_id) for call_id in item]
            out[key] = _normalize(item, ids)
        return out
    if isinstance(value, list):
        return [_normalize(item, ids) for item in value]
    return value


# -- the run ----------------------------------------------------------------------------------------


def _configs() -> list[tuple[str | None, str | None]]:
    native_r, native_t = set(reasoning_parser_names()), set(tool_parser_names())
    return [(name, None) for name in sorted(VLLM_REASONING_PARSERS - native_r)] + [
        (None, name) for name in sorted(VLLM_TOOL_PARSERS - native_t)
    ]


def _stream(
    post: Any, base: dict[str, Any], ids: list[int], lens: list[int], drop_sid_at: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """(status, body) per chunk, up to the first error (a parser that fails on a chunk, e.g. one
    that only accepts one token per chunk, fails every later chunk too)."""
    state = None
    responses = []
    start = 0
    for index, length in enumerate(lens):
        chunk = ids[start : start + length]
        start += length
        if drop_sid_at == index and state is not None:
            state = {k: v for k, v in state.items() if not k.startswith("rs_")}
        response = post(chunk_body(base, chunk, "stop" if start >= len(ids) else None, state))
        responses.append((response.status_code, response.json()))
        if response.status_code != 200:
            break
        state = responses[-1][1]["stream_state"]
    return responses


def _compare(
    tier: VllmRenderTier, ours: TestClient, reasoning: str | None, tool: str | None, rng: random.Random
) -> int:
    compared = 0
    for request_name, request in REQUESTS.items():
        chat_request = {"model": SERVED, **request}
        if tool is None and request.get("tools"):
            chat_request = {k: v for k, v in chat_request.items() if k != "tools"}
        theirs_render = tier.client.post("/v1/chat/completions/render", json=chat_request)
        ours_render = ours.post("/v1/chat/completions/render", json=chat_request)
        assert ours_render.status_code == theirs_render.status_code, (request_name, ours_render.text)
        if theirs_render.status_code != 200:
            continue
        rendered = theirs_render.json()
        assert _render_view(ours_render.json()) == _render_view(rendered), (reasoning, tool, request_name)
        prompt = rendered["token_ids"]
        base = {"model": SERVED, "chat_request": chat_request, "prompt_token_ids": prompt}
        for text in OUTPUTS:
            output = tier.client.post("/tokenize", json={"model": SERVED, "prompt": text, "add_special_tokens": False})
            ids = output.json()["tokens"]
            generate = {"request_id": "gen-1", "choices": [{"index": 0, "token_ids": ids, "finish_reason": "stop"}]}
            body = {**base, "generate_response": generate}
            theirs = tier.client.post("/v1/chat/completions/derender", json=body)
            mine = ours.post("/v1/chat/completions/derender", json=body)
            where = (reasoning, tool, request_name, text)
            assert mine.status_code == theirs.status_code, (where, mine.text, theirs.text)
            assert _normalize(mine.json(), {}) == _normalize(theirs.json(), {}), where
            lens, left = [], len(ids)
            while left:
                lens.append(min(left, rng.randint(1, 4)))
                left -= lens[-1]
            theirs_stream = _stream(
                lambda b: tier.client.post("/v1/chat/completions/derender", json=b), base, ids, lens
            )
            for drop in (None, len(lens) // 2):
                mine_stream = _stream(
                    lambda b: ours.post("/v1/chat/completions/derender", json=b), base, ids, lens, drop
                )
                theirs_ids: dict[str, str] = {}
                mine_ids: dict[str, str] = {}
                assert len(mine_stream) == len(theirs_stream), (where, drop, mine_stream[-1], theirs_stream[-1])
                for i, (a, b) in enumerate(zip(mine_stream, theirs_stream, strict=True)):
                    assert a[0] == b[0] and _normalize(a[1], mine_ids) == _normalize(b[1], theirs_ids), (
                        where,
                        "chunk",
                        i,
                        drop,
                    )
            compared += 1
    return compared


def _render_view(rendered: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rendered.items() if k not in ("request_id",)}


@pytest.mark.parametrize(("reasoning", "tool"), _configs(), ids=lambda v: str(v))
def test_adapter_parser_matches_vllms_render_tier(
    reasoning: str | None, tool: str | None, tiers: dict[str, VllmRenderTier], models: dict[str, Path]
) -> None:
    rng = random.Random(f"{reasoning}/{tool}")
    for model in MODELS:
        tier = tiers[model]
        try:
            tier.configure(reasoning, tool)
        except Exception as exc:  # vLLM cannot build this parser on this tokenizer: neither may we
            settings = Settings(
                model=str(models[model]),
                served_model_name=[SERVED],
                reasoning_parser=reasoning,
                tool_call_parser=tool,
                enable_auto_tool_choice=tool is not None,
            )
            with pytest.raises(Exception):  # noqa: B017 (vLLM raises TypeError or its cause)
                with TestClient(create_app(settings.validate())):
                    pass
            last = exc
            continue
        settings = Settings(
            model=str(models[model]),
            served_model_name=[SERVED],
            reasoning_parser=reasoning,
            tool_call_parser=tool,
            enable_auto_tool_choice=tool is not None,
        ).validate()
        with TestClient(create_app(settings)) as ours:
            assert _compare(tier, ours, reasoning, tool, rng) > 0
            metrics = ours.get("/metrics").text
            assert "render_adapter_stream_hits_total" in metrics
        return
    key = ("reasoning", reasoning) if reasoning is not None else ("tool", tool)
    if "cohere_melody" in str(last):
        pytest.skip(f"the {key[1]} parser needs the cohere-melody package (as in vLLM): {last}")
    assert key in CANNOT_BUILD, f"vLLM cannot build the {key[0]} parser {key[1]} on any fixture tokenizer: {last}"
    pytest.skip(f"vLLM cannot build the {key[0]} parser {key[1]} on any fixture tokenizer ({CANNOT_BUILD[key]})")


def test_compact_stream_state_is_refused(models: dict[str, Path]) -> None:
    settings = Settings(
        model=str(models["qwen3"]), served_model_name=[SERVED], reasoning_parser="minicpmv", stream_state_mode="compact"
    ).validate()
    with TestClient(create_app(settings)) as ours:
        request = {"model": SERVED, **REQUESTS["no_tools"]}
        prompt = ours.post("/v1/chat/completions/render", json=request).json()["token_ids"]
        body = chunk_body({"model": SERVED, "chat_request": request, "prompt_token_ids": prompt}, [9707], None, None)
        response = ours.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "stream_state" and "--stream-state-mode full" in error["message"]
