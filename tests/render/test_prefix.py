"""The prefix-stability guard counts breaks by cause, and the segment cache gives today's ids."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from benchmarks.agent_turns import conversation
from render_service.model.loader import load_model
from render_service.render import pipeline as render
from render_service.render import prefix
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import segment_cache_contexts

FLAGS: dict[str, Any] = {
    "served_model_name": ["tinyqwen3"],
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "enable_auto_tool_choice": True,
}


@pytest.fixture(scope="module")
def contexts(qwen3_model_dir: Path) -> tuple[render.RenderContext, render.RenderContext]:
    """(segment cache on, segment cache off): the guard is on in both."""
    return segment_cache_contexts(qwen3_model_dir, **FLAGS)


def _render(ctx: render.RenderContext, body: dict[str, Any]) -> tuple[list[int], prefix.PrefixCheck]:
    checks: list[prefix.PrefixCheck] = []
    ids = render.render_chat(ctx, copy.deepcopy(body), prefix_checks=checks)["token_ids"]
    return ids, checks[0]


def test_agent_conversation_breaks_where_the_template_drops_thinking(contexts) -> None:
    """25 turns, a user message after turns 10 and 20: Qwen3 then drops every earlier reply's
    thinking, so exactly turns 11 and 21 break; the others extend the previous prompt."""
    cached, uncached = contexts
    verdicts = []
    for body in conversation(turns=25, seed=3):
        ids, check = _render(cached, body)
        plain_ids, plain_check = _render(uncached, body)
        assert ids == plain_ids
        assert check == plain_check
        verdicts.append(check)
    assert verdicts[0].status == prefix.FIRST
    breaks = {turn: check for turn, check in enumerate(verdicts, 1) if check.status == prefix.BREAKS}
    assert sorted(breaks) == [11, 21]
    assert {check.cause for check in breaks.values()} == {prefix.THINKING_DROPPED}
    assert all(check.status == prefix.EXTENDS for turn, check in enumerate(verdicts, 1) if turn not in (1, 11, 21))
    for turn in (11, 21):  # shared: up to the first reply whose thinking was dropped
        check = breaks[turn]
        assert check.shared_tokens is not None and check.previous_tokens is not None
        assert 0 < check.shared_tokens < check.previous_tokens
    extended = verdicts[4]
    assert extended.shared_tokens == extended.previous_tokens
    assert cached.segments is not None and cached.segments.stats().reused_prompts > 0


def test_template_change_unknown_and_skipped(contexts) -> None:
    ctx, _ = contexts
    bodies = conversation(turns=3, seed=5)
    _render(ctx, bodies[0])
    changed = copy.deepcopy(bodies[1])
    changed["tools"] = changed["tools"][:-1]
    _, check = _render(ctx, changed)
    assert (check.status, check.cause) == (prefix.BREAKS, prefix.TEMPLATE_CHANGED)
    stranger = copy.deepcopy(bodies[2])
    stranger["messages"][0]["content"] += " (another conversation)"
    assert _render(ctx, stranger)[1].status == prefix.UNKNOWN
    continued = copy.deepcopy(bodies[1])
    continued["messages"].append({"role": "assistant", "content": "Partial"})
    continued.update(add_generation_prompt=False, continue_final_message=True)
    assert _render(ctx, continued)[1].status == prefix.SKIPPED


def test_enable_thinking_false_reply_breaks_the_prefix(contexts) -> None:
    """With thinking off the prompt ends in an empty think block the template does not repeat
    for the reply: the guard calls that a history change."""
    ctx, _ = contexts
    first = {"messages": [{"role": "user", "content": "Hi there"}], "chat_template_kwargs": {"enable_thinking": False}}
    _render(ctx, first)
    second = copy.deepcopy(first)
    second["messages"] += [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "More"}]
    check = _render(ctx, second)[1]
    assert (check.status, check.cause) == (prefix.BREAKS, prefix.HISTORY_CHANGED)


def test_retokenization_at_the_old_end(contexts) -> None:
    """Same text, different ids: the previous prompt ended inside a word the reply continued."""
    ctx, _ = contexts
    assert ctx.segments is not None
    guard = prefix.PrefixGuard(ctx.segments.segmenter, ctx.model.encode)
    old = [{"role": "user", "content": "q"}]
    new = [*old, {"role": "assistant", "content": "ey"}, {"role": "user", "content": "r"}]
    previous_text = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nTh"
    turn = guard.begin(old, fingerprint=1)
    assert turn is not None
    ids = ctx.model.encode(previous_text)
    guard.finish(turn, previous_text, ids, *guard.head_of(previous_text, ids))
    text = previous_text + "ey<|im_end|>\n<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\n"
    ids = ctx.model.encode(text)
    turn = guard.begin(new, fingerprint=1)
    assert turn is not None and turn.previous is not None
    check = guard.finish(turn, text, ids, *guard.head_of(text, ids))
    assert (check.status, check.cause) == (prefix.BREAKS, prefix.RETOKENIZATION)
    assert check.shared_tokens is not None and check.previous_tokens is not None
    assert check.shared_tokens == check.previous_tokens - 1  # all but "Th"
    assert guard.stats()[1][prefix.RETOKENIZATION] == 1


def test_header_and_metrics_over_http(qwen3_model_dir: Path) -> None:
    settings = Settings(model=str(qwen3_model_dir), **FLAGS).validate()
    bodies = conversation(turns=12, seed=7)
    with TestClient(create_app(settings)) as client:
        responses = [client.post("/v1/chat/completions/render", json=body) for body in bodies]
        assert all(r.status_code == 200 for r in responses)
        assert "shared_tokens" not in responses[1].text  # the body is vLLM's; the verdict is a header
        headers = [r.headers[prefix.HEADER] for r in responses]
        assert headers[0] == "status=first"
        assert headers[1].startswith("status=extends; shared_tokens=")
        assert headers[10].startswith("status=breaks; cause=thinking_dropped; shared_tokens=")
        metrics = client.get("/metrics").text
    assert 'render_prefix_breaks_total{cause="thinking_dropped"} 1.0' in metrics
    assert 'render_prefix_checks_total{status="extends"} 10.0' in metrics
    assert "render_segment_cache_enabled 1.0" in metrics
    assert "render_segment_cache_hits_total" in metrics and "render_segment_cache_bytes" in metrics
    history = {
        name: float(metrics.split(f"\nrender_history_{name}_total ", 1)[1].split("\n", 1)[0])
        for name in ("incremental", "full", "verified", "mismatches")
    }
    # Every turn after the first had its previous prompt on this worker: templated from it, or in full.
    assert history["incremental"] + history["full"] == 11
    assert history["incremental"] >= 1 and history["verified"] >= 1
    assert history["mismatches"] <= history["verified"]


def test_audit_reports_a_template_that_drops_history(qwen3_model_dir: Path) -> None:
    from render_service.audit import audit

    settings = Settings(model=str(qwen3_model_dir), served_model_name=["tinyqwen3"]).validate()
    report = audit.run_audit([], [], local=(settings, load_model(settings)))
    notes = [f for f in report.findings if f.component == "template_history"]
    assert [(f.severity, f.ours) for f in notes] == [("info", prefix.THINKING_DROPPED)]
    assert "new user message" in notes[0].detail


_REASONINGS = ["", "  ", "alpha", "beta gamma", "alpha beta"]


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["assistant", "user", "tool"])},
            optional={
                "reasoning": st.one_of(st.none(), st.sampled_from(_REASONINGS)),
                "reasoning_content": st.sampled_from(_REASONINGS),
            },
        ),
        max_size=8,
    ),
    text=st.sampled_from(["", "alpha", "beta gamma", "alpha beta gamma"]),
    before=st.one_of(st.none(), st.sampled_from(["", "alpha", "beta gamma", "alpha beta"])),
)
def test_thinking_dropped_latest_first_equals_any_order(
    messages: list[dict[str, Any]], text: str, before: str | None
) -> None:
    """`_thinking_dropped` looks at the latest replies first (where a dropped thinking is found
    after a search or two); its answer is the first-to-last one's."""

    def reference() -> bool:
        for message in messages:
            if message.get("role") != "assistant":
                continue
            reasoning = message.get("reasoning")
            if not isinstance(reasoning, str):
                reasoning = message.get("reasoning_content")
            if not isinstance(reasoning, str) or not reasoning.strip():
                continue
            if reasoning.strip() not in text and (before is None or reasoning.strip() in before):
                return True
        return False

    assert prefix._thinking_dropped(messages, text, before) == reference()
