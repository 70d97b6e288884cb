"""Model output nested deeper than `json` can read is text, never an error: the JSON-shaped batch
extractors (xlam, internlm, hunyuan_a13b) answer it as content, as vLLM's catch-all does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from render_service.parsers import hunyuan_a13b, internlm, xlam
from render_service.parsers.base import FunctionCall

DEEP = "[" * 100_000 + "]" * 100_000
Extract = Callable[[str], tuple[bool, list[FunctionCall], str | None]]


@pytest.mark.parametrize(
    ("extract", "output"),
    [
        (xlam.vllm_extract, DEEP),
        (xlam.vllm_extract, "[TOOL_CALLS]" + DEEP),
        (internlm.extract_calls, internlm.MARKER + '{"name": "f", "parameters": ' + DEEP + "}"),
        (hunyuan_a13b.extract_calls, "<tool_calls>" + DEEP + "</tool_calls>"),
    ],
)
def test_deeply_nested_output_is_content(extract: Extract, output: str) -> None:
    called, calls, content = extract(output)
    assert (called, calls) == (False, [])
    assert content is not None and DEEP in content
