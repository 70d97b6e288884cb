"""Incremental templating (render/history.py) gives the ids of a full render on every turn of random
conversations over the fixtures' templates; shapes where it would not are caught and render in full;
validating only a turn's new messages still answers vLLM's error for the whole request."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service.exceptions import RenderServiceError
from render_service.model.example import build_example_model
from render_service.model.loader import load_model
from render_service.render import pipeline as render
from render_service.settings import Settings

FAMILIES = ("qwen3", "deepseek", "glm", "minimax_m2", "seed_oss")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} <tool> & 'quotes'",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    for name in ("search", "read_file")
]


@pytest.fixture(scope="module", params=FAMILIES)
def contexts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(incremental templating on, off) for one fixture template."""
    folder = build_example_model(tmp_path_factory.mktemp(request.param), request.param)
    on = Settings(model=str(folder), served_model_name=["m"]).validate()
    off = Settings(model=str(folder), served_model_name=["m"], segment_cache_bytes=0).validate()
    model = load_model(on)
    return request.param, render.make_context(model, on), render.make_context(model, off)


_TEXT = st.sampled_from(
    ["", "ok", " spaced ", "line\nbreak", "<think>x</think>y", "</think>", "<tool_response>r</tool_response>", "中文😀"]
)


@st.composite
def _turn(draw: st.DrawFn, index: int) -> list[dict[str, Any]]:
    """What one turn adds after a request: the assistant's reply, then tool results and/or a user message."""
    calls = [
        {
            "id": f"call_{index}_{n}",
            "type": "function",
            "function": {"name": draw(st.sampled_from(["search", "read_file"])), "arguments": json.dumps({"q": n})},
        }
        for n in range(draw(st.integers(0, 2)))
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": draw(_TEXT)}
    if draw(st.booleans()):
        reply["reasoning"] = draw(st.sampled_from(["think", "\nstep one\nstep two\n", "plan: call"]))
    if calls:
        reply["tool_calls"] = calls
    added = [reply]
    added += [{"role": "tool", "tool_call_id": call["id"], "content": draw(_TEXT)} for call in calls]
    if not calls or draw(st.integers(0, 3)) == 0:
        added.append({"role": "user", "content": draw(_TEXT) or "go on"})
    return added


@st.composite
def _conversation(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], dict[str, Any]]:
    start: list[dict[str, Any]] = []
    if draw(st.booleans()):
        start.append({"role": "system", "content": draw(st.sampled_from(["Be brief.", "You are an agent.\n"]))})
    start.append({"role": "user", "content": draw(_TEXT) or "hi"})
    turns = [draw(_turn(index)) for index in range(draw(st.integers(1, 7)))]
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["tools"] = TOOLS
    if draw(st.booleans()):
        extra["chat_template_kwargs"] = {"enable_thinking": draw(st.booleans())}
    return start, turns, extra


def _ids(ctx: render.RenderContext, body: dict[str, Any]) -> Any:
    try:
        return render.render_chat(ctx, copy.deepcopy(body))["token_ids"]
    except RenderServiceError as exc:
        return (exc.status_code, exc.body())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_conversation())
def test_every_turn_equals_a_full_render(contexts: Any, data: Any) -> None:
    _, incremental, full = contexts
    messages, turns, extra = data
    for added in [[], *turns]:
        messages = [*messages, *added]
        body = {"model": "m", "messages": messages, **extra}
        assert _ids(incremental, body) == _ids(full, body)


def test_agent_conversation_is_mostly_incremental(contexts: Any) -> None:
    """On a long agent conversation the incremental path carries most turns (so the property
    above is not vacuous), and every turn's ids equal a full render's."""
    from benchmarks.agent_turns import conversation

    family, incremental, full = contexts
    before = incremental.history.stats()
    bodies = conversation(turns=24, seed=5)
    for body in bodies:
        body.update(model="m", tool_choice="none")
        assert _ids(incremental, body) == _ids(full, body)
    stats = incremental.history.stats()
    assert stats.incremental - before.incremental >= len(bodies) // 2, (family, stats)


@pytest.mark.parametrize("numbering", ["messages|length - loop.index0", "loop.index0"])
def test_templates_that_number_messages_render_in_full(tmp_path: Path, numbering: str) -> None:
    """A template that numbers messages cannot reuse the previous prompt + a short anchor: counting
    from the end fails the anchor's own prefix check, counting from the start passes it and is
    caught by the first full-render check of a shape; either way every prompt is a full render's."""
    folder = build_example_model(tmp_path / "m", "qwen3")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        f"{{% for m in messages %}}<|im_start|>{{{{ m.role }}}} {{{{ {numbering} }}}}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    on = Settings(model=str(folder), served_model_name=["m"]).validate()
    off = Settings(model=str(folder), served_model_name=["m"], segment_cache_bytes=0).validate()
    model = load_model(on)
    assert numbering in (model.chat_template or "")
    incremental, full = render.make_context(model, on), render.make_context(model, off)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    assert _ids(incremental, {"messages": messages}) == _ids(full, {"messages": messages})
    for turn in range(6):
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": f"u{turn}"}]
        assert _ids(incremental, {"messages": messages}) == _ids(full, {"messages": messages})
    stats = incremental.history.stats()
    assert stats.incremental == 0 and stats.full == 6
    assert stats.mismatches == (0 if numbering.startswith("messages") else 1)


def test_an_error_in_a_new_message_reads_as_for_the_whole_request(contexts: Any) -> None:
    """Only the new messages are validated when the history was validated before; an error in them
    still names its index in the whole request, as vLLM's validation does."""
    _, incremental, full = contexts
    history = [{"role": "user", "content": "hi"}]
    _ids(incremental, {"messages": history})
    broken = [*history, {"role": "assistant", "content": "x"}, {"role": "tool", "tool_call_id": 7, "content": "r"}]
    body = {"messages": broken, "tools": TOOLS}
    incremental_error = _ids(incremental, body)
    assert isinstance(incremental_error, tuple) and incremental_error == _ids(full, body)
    assert "messages.2" in json.dumps(incremental_error[1])


def test_full_templating_keeps_the_segment_cache_and_renders_every_turn_in_full(
    qwen3_model_dir: Path, loaded_models: Callable[[Path], Any]
) -> None:
    """`--full-templating` is the operator's switch for templates they do not want judged by the
    per-kind check: no incremental renders, the segment cache still on, the same ids."""
    from benchmarks.agent_turns import conversation

    folder = qwen3_model_dir
    default = Settings(model=str(folder), served_model_name=["m"]).validate()
    forced = Settings(model=str(folder), served_model_name=["m"], full_templating=True).validate()
    model = loaded_models(folder)  # what load_model(default) loads: the model is only read
    incremental, full = render.make_context(model, default), render.make_context(model, forced)
    assert full.history is None and full.segments is not None
    for body in conversation(turns=8, seed=3):
        body.update(model="m", tool_choice="none")
        assert _ids(incremental, body) == _ids(full, body)
    assert incremental.history is not None and incremental.history.stats().incremental >= 1
