"""Renderer selection (`--tokenizer-mode`, auto-detection) and the encoders' own rules.

Byte parity with vLLM is checked by tests/parity/test_renderer_parity.py; these tests pin the
selection logic and the behaviours the goldens cannot reach (fixture-independent rules).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service.model.example_renderers import build_renderer_model
from render_service.model.loader import ModelLoadError, load_model
from render_service.render import renderers
from render_service.render.renderers import deepseek_v4, deepseek_v32, deepseek_v41, dsml, kimi_k3
from render_service.render.renderers.base import ChatInput
from render_service.settings import Settings, SettingsError


def _chat(conversation: list[dict], kwargs: dict | None = None, tools: list[dict] | None = None) -> ChatInput:
    return ChatInput(
        messages=conversation, conversation=conversation, tools=tools, kwargs=kwargs or {}, chat_template=None
    )


@pytest.mark.parametrize(
    ("architecture", "mode"),
    [
        ("DeepseekV32ForCausalLM", "deepseek_v32"),
        ("DeepseekV4ForCausalLM", "deepseek_v4"),
        ("DeepseekV4ForConditionalGeneration", "deepseek_v4"),
        ("DeepseekV41ForCausalLM", "deepseek_v41"),
        ("KimiK3ForConditionalGeneration", "kimi_k3"),
        ("InklingForCausalLM", "inkling"),
        ("Qwen3ForCausalLM", "hf"),
    ],
)
def test_auto_detects_the_renderer_from_the_architecture(architecture: str, mode: str) -> None:
    assert renderers.detect_mode("auto", {"architectures": [architecture]}, [])[0] == mode


def test_an_explicit_mode_wins_over_the_architecture() -> None:
    config = {"architectures": ["DeepseekV32ForCausalLM"]}
    assert renderers.detect_mode("HF", config, [])[0] == "hf"


def test_a_mistral_format_folder_is_mistral() -> None:
    files = ["config.json", "consolidated.safetensors", "tekken.json"]
    assert renderers.detect_mode("auto", {"architectures": ["MistralForCausalLM"]}, files)[0] == "mistral"
    assert renderers.detect_mode("auto", {}, ["consolidated.safetensors", "tokenizer.model.v3"])[0] == "mistral"
    # A tokenizer file alone (HF-format repos ship tekken.json too) is not enough.
    assert renderers.detect_mode("auto", {}, ["model.safetensors", "tekken.json"])[0] == "hf"


def test_unknown_tokenizer_mode_fails_at_start() -> None:
    with pytest.raises(SettingsError, match="No tokenizer registered for tokenizer_mode='slowest'"):
        Settings(model="m", tokenizer_mode="slowest").validate()
    assert Settings(model="m", tokenizer_mode="DeepSeek_V4").validate().tokenizer_mode == "deepseek_v4"


@pytest.mark.parametrize("mode", ["cohere", "inkling", "kimi_audio", "alpamayo2_super", "terratorch"])
def test_a_renderer_we_lack_fails_at_start_naming_it(qwen3_model_dir: Path, mode: str) -> None:
    with pytest.raises(ModelLoadError, match=f"vLLM's '{mode}' renderer"):
        load_model(Settings(model=str(qwen3_model_dir), tokenizer_mode=mode).validate())


def test_an_auto_detected_renderer_we_lack_fails_at_start(tmp_path: Path, qwen3_model_dir: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((qwen3_model_dir / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["InklingForCausalLM"]}))
    with pytest.raises(ModelLoadError, match=r"vLLM's 'inkling' renderer \(architecture InklingForCausalLM\)"):
        load_model(Settings(model=str(tmp_path)).validate())
    # The documented way out: an explicit mode, as with vLLM.
    assert load_model(Settings(model=str(tmp_path), tokenizer_mode="hf").validate()).renderer_mode == "hf"


@pytest.mark.parametrize("mode", ["deepseek_v32", "deepseek_v4", "deepseek_v41", "kimi_k3"])
def test_fixture_folders_select_their_renderer(tmp_path: Path, mode: str) -> None:
    model = load_model(Settings(model=str(build_renderer_model(tmp_path, mode))).validate())
    assert model.renderer_mode == mode
    assert model.renderer.mode == mode


def test_the_fingerprint_names_the_renderer(tmp_path: Path, qwen3_model_dir: Path) -> None:
    from render_service.audit.fingerprint import fingerprint

    settings = Settings(model=str(build_renderer_model(tmp_path, "deepseek_v4"))).validate()
    print_ = fingerprint(settings, load_model(settings))
    assert print_["values"]["renderer"]["mode"] == "deepseek_v4"
    hf = Settings(model=str(qwen3_model_dir)).validate()
    assert fingerprint(hf, load_model(hf))["components"]["renderer"] != print_["components"]["renderer"]


def test_v32_ignores_generation_prompt_flags_and_ends_ready_for_the_assistant() -> None:
    conversation = [{"role": "user", "content": "Hi"}]
    prompt = deepseek_v32.DeepseekV32Renderer().render(_chat(conversation, {"add_generation_prompt": False})).text
    assert prompt == f"{dsml.BOS}{dsml.USER}Hi{dsml.ASSISTANT}{dsml.THINK_END}"
    thinking = deepseek_v32.DeepseekV32Renderer().render(_chat(conversation, {"enable_thinking": True})).text
    assert thinking is not None and thinking.endswith(dsml.THINK_START)


def test_v32_tools_go_into_a_new_leading_system_message() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": None, "parameters": {}}}]
    conversation = [{"role": "system", "content": "Sys."}, {"role": "user", "content": "Hi"}]
    prompt = deepseek_v32.DeepseekV32Renderer().render(_chat(conversation, tools=tools)).text
    assert prompt is not None
    assert prompt.startswith(dsml.BOS + "\n\n## Tools\n")
    assert '{"name": "f", "description": null, "parameters": {}}\n</functions>\nSys.' in prompt


@pytest.mark.parametrize("module", [deepseek_v32, deepseek_v4, deepseek_v41])
def test_the_tools_section_is_rendered_once_per_tool_list(module: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}}}]
    first = module.tools_section(tools)
    assert first == module.render_tools_section(tools)
    assert module.tools_section(json.loads(json.dumps(tools))) is first  # an equal list: the kept text
    changed = [{"type": "function", "function": dict(tools[0]["function"], description="G.")}]
    assert module.tools_section(changed) == module.render_tools_section(changed) != first


def test_tool_lists_a_null_could_confuse_are_rendered_every_time() -> None:
    """orjson writes NaN and None both as null; json.dumps (the prompt's JSON) does not."""
    blocks = dsml.ToolBlocks(deepseek_v4.render_tools_section)
    none = [{"type": "function", "function": {"name": "f", "description": None, "parameters": {"default": None}}}]
    nan = [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"default": float("nan")}}}
    ]
    assert '"default": null' in blocks(none) and '"default": NaN' in blocks(nan)
    assert blocks(none) is not blocks(none)  # not kept
    assert '"default": null' in blocks(none)


def test_tool_blocks_are_bounded() -> None:
    blocks = dsml.ToolBlocks(deepseek_v4.render_tools_section, max_entries=3)
    lists = [
        [{"type": "function", "function": {"name": f"f{i}", "description": "d", "parameters": {}}}] for i in range(5)
    ]
    for tools in lists:
        blocks(tools)
    assert len(blocks._blocks) == 3
    assert blocks(lists[-1]) is blocks(lists[-1])


def test_v4_tool_results_follow_the_call_order_and_merge_into_one_user_turn() -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Go"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"y": "s"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ]
    prompt = deepseek_v4.DeepseekV4Renderer().render(_chat(conversation, {"thinking": False})).text
    assert prompt is not None
    assert f"{dsml.USER}<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>{dsml.ASSISTANT}" in prompt
    assert f'<{dsml.DSML}parameter name="x" string="false">1</{dsml.DSML}parameter>' in prompt
    assert f'<{dsml.DSML}parameter name="y" string="true">s</{dsml.DSML}parameter>' in prompt


@pytest.mark.parametrize(
    ("effort", "preamble"), [("low", ""), ("medium", ""), ("max", "Beyond maximum"), ("xhigh", "Absolute maximum")]
)
def test_v4_reasoning_effort_levels(effort: str, preamble: str) -> None:
    chat = _chat([{"role": "user", "content": "Hi"}], {"reasoning_effort": effort})
    prompt = deepseek_v4.DeepseekV4Renderer().render(chat).text
    assert prompt is not None
    assert (preamble in prompt) if preamble else prompt.startswith(dsml.BOS + dsml.USER)


def test_v41_effort_is_checked_and_numeric() -> None:
    renderer = deepseek_v41.DeepseekV41Renderer()
    prompt = renderer.render(_chat([{"role": "user", "content": "Hi"}], {"reasoning_effort": 30})).text
    assert prompt is not None and prompt.startswith(f"{dsml.BOS}<｜System｜>Reasoning Effort: 30 (range 1-100")
    with pytest.raises(dsml.EncodingError, match="reasoning_effort must be low, high, xhigh, max"):
        renderer.render(_chat([{"role": "user", "content": "Hi"}], {"reasoning_effort": "medium"}))
    assert deepseek_v41.tolerant_arguments('"{\\"a\\": 1}"') == {"a": 1}
    assert deepseek_v41.tolerant_arguments("[1]") == {"arguments": "[1]"}


def test_v4_fim_and_others_without() -> None:
    assert (
        deepseek_v4.DeepseekV4Renderer().completion_suffix("a", "b") == "<｜fim▁begin｜>a<｜fim▁hole｜>b<｜fim▁end｜>"
    )
    assert deepseek_v32.DeepseekV32Renderer().completion_suffix("a", "b") is None


def test_k3_orders_tool_results_by_id_or_alias_and_tags_them() -> None:
    conversation: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "x", "function": {"name": "f", "arguments": {}}},
                {"function": {"name": "g", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "g:1", "content": "G"},
        {"role": "tool", "tool_call_id": "x", "content": "F"},
    ]
    ordered = kimi_k3.order_tool_results(conversation)
    assert [(m.get("tool"), m.get("index"), m["content"]) for m in ordered[1:]] == [("f", 1, "F"), ("g", 2, "G")]
    conversation[1]["tool_call_id"] = "unknown"
    assert [m["content"] for m in kimi_k3.order_tool_results(conversation)[1:]] == ["G", "F"]


def test_k3_thinking_kwargs() -> None:
    kwargs = kimi_k3.encoder_kwargs(_chat([], {"enable_thinking": False, "reasoning_effort": "high"}))
    assert kwargs == {"thinking": False, "thinking_effort": "high"}
    assert kimi_k3.encoder_kwargs(_chat([], {"reasoning_effort": "none"})) == {"thinking": False}
    with pytest.raises(Exception, match="Kimi K3 supports thinking_effort values: low, high, max"):
        kimi_k3.encoder_kwargs(_chat([], {"reasoning_effort": "medium"}))


def test_k3_calls_a_remote_code_encoder_itself() -> None:
    """A real K3 tokenizer overrides apply_chat_template (encoding_k3): it gets the prepared
    conversation and kwargs, and its ids are the prompt."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    class RemoteK3Tokenizer(PreTrainedTokenizerBase):
        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            calls.append((conversation, kwargs))
            return [1, 2, 3]

    renderer = kimi_k3.KimiK3Renderer(object.__new__(RemoteK3Tokenizer), lambda text, special: [])
    assert not renderer.needs_chat_template
    conversation = [{"role": "user", "content": "Hi"}]
    chat = ChatInput(conversation, conversation, None, {"enable_thinking": True, "tokenize": False}, None)
    assert renderer.render(chat).token_ids == [1, 2, 3]
    ((seen, kwargs),) = calls
    assert seen == conversation
    assert kwargs["tokenize"] is True and kwargs["thinking"] is True and "enable_thinking" not in kwargs
