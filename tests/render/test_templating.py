"""Templating: content-format detection, kwargs filtering, and minijinja only where it equals jinja2."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from render_service.exceptions import BadRequestError
from render_service.render import templating


@pytest.fixture(scope="module")
def tokenizer(qwen3_model_dir: Path):
    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


def test_content_format_detection() -> None:
    assert templating.detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "string"
    openai = "{% for m in messages %}{% for part in m.content %}{{ part.text }}{% endfor %}{% endfor %}"
    assert templating.detect_content_format(openai) == "openai"


def test_kwargs_filtered_to_what_the_template_reads(tokenizer) -> None:
    template = tokenizer.chat_template
    resolved = templating.resolve_template_kwargs(
        template, {"enable_thinking": False, "cohere_format": "cmd4", "add_generation_prompt": True}
    )
    assert resolved == {"enable_thinking": False, "add_generation_prompt": True}


def test_minijinja_used_and_identical_for_the_example_templates(tokenizer, deepseek_model_dir: Path) -> None:
    special = templating._special_tokens(tokenizer)
    assert templating.fast_template(tokenizer.chat_template, special) is not None
    deepseek = AutoTokenizer.from_pretrained(str(deepseek_model_dir))
    assert templating.fast_template(deepseek.chat_template, templating._special_tokens(deepseek)) is not None
    conversation = templating.build_conversation(
        [
            {"role": "system", "content": "Résumé"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        "string",
    )
    fast = templating.render_prompt(
        tokenizer, tokenizer.chat_template, conversation, None, {"add_generation_prompt": True}
    )
    reference = templating._reference_render(
        tokenizer, tokenizer.chat_template, conversation, None, {"add_generation_prompt": True}
    )
    assert fast == reference
    assert "a\nb" in fast


def test_template_minijinja_cannot_match_falls_back_to_jinja2(tokenizer) -> None:
    # `namespace` attribute assignment through a loop-scoped mutation is rendered differently: whatever the
    # reason, a template whose probes differ must not be served by minijinja.
    template = "{{ messages | map(attribute='role') | list }}"
    fast = templating.fast_template(template, templating._special_tokens(tokenizer))
    rendered = templating.render_prompt(tokenizer, template, [{"role": "user", "content": "x"}], None, {})
    assert rendered == "['user']"
    assert fast is None or fast.render([{"role": "user", "content": "x"}], None, {}) == rendered


def test_template_errors_are_400_with_hf_message(tokenizer) -> None:
    template = "{{ raise_exception('only user messages, please') }}"
    with pytest.raises(BadRequestError, match="only user messages, please"):
        templating.render_prompt(tokenizer, template, [{"role": "user", "content": "x"}], None, {})


def test_tojson_memo_never_confuses_values_orjson_writes_alike() -> None:
    """`tojson` memoises dicts by their orjson bytes; orjson writes NaN and infinities as null
    where json.dumps writes NaN/Infinity, so such dicts must not share an entry with null ones."""
    import json

    from render_service.render.templating import _hf_tojson

    for value in ({"a": None}, {"a": float("nan")}, {"a": None}, {"a": float("inf")}, {"a": [None, 1.5]}):
        assert _hf_tojson(value) == json.dumps(value, ensure_ascii=False)
