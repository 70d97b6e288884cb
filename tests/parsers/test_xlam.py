"""xlam (`parsers/xlam.py`): vLLM 0.33's batch (JSON lists bare, in code fences, after
`[TOOL_CALLS]`, in `<tool_call>`, after `</think>`); content streams up to the first marker with
whitespace at either end held, the rest is held to the end of the stream; our batch keeps the
content's leading whitespace where vLLM's strips it (listed), and is vLLM's everywhere else."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import xlam
from tests.parsers.families import json_checks, json_tools

EOS = json_tools.eos("xlam")
CALL = '{"name": "get_weather", "arguments": {"city": "Paris é 😀", "n":3}}'
ARGS = '{"city": "Paris é 😀", "n": 3}'


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    folder = json_tools.build(tmp_path_factory.mktemp("xlam") / "m", "xlam")
    return AutoTokenizer.from_pretrained(str(Path(folder)))


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("[" + CALL + "]", "", [["get_weather", ARGS]]),
        ("  \n[" + CALL + ", " + CALL + "]", "", [["get_weather", ARGS]] * 2),
        ("Sure.\n```json\n[" + CALL + "]\n```\nDone. ", "Sure.\n\nDone.", [["get_weather", ARGS]]),
        ("  Sure. <tool_call>[" + CALL + "]</tool_call>", "  Sure.", [["get_weather", ARGS]]),  # vLLM: "Sure."
        ("a [TOOL_CALLS][" + CALL + "]\nb", "a \nb", [["get_weather", ARGS]]),
        ("plan</think>\n[" + CALL + "]", "plan</think>", [["get_weather", ARGS]]),
        ('[{"name": "f", "arguments": "{\\"a\\": 1}"}]', "", [["f", '{"a": 1}']]),  # string arguments kept
        ('[{"name": "f", "arguments": [1]}]', '[{"name": "f", "arguments": [1]}]', []),  # not a string: content
        ('[{"nom": "f", "arguments": {}}]', '[{"nom": "f", "arguments": {}}]', []),  # no call: all content
        ("x ```json\n{" + CALL[1:] + "\n```", "x ```json\n{" + CALL[1:] + "\n```", []),  # not a list
        ("[" + CALL, "[" + CALL, []),  # cut
        ("no calls here ``", "no calls here ``", []),
        ("  text with trailing space  ", "  text with trailing space  ", []),
    ],
)
def test_stream_accumulates_to_batch(tok: Any, text: str, content: str, calls: list[list[str]]) -> None:
    batch = json_checks.check_any_chunking(tok, json_checks.parser_for(tok, "xlam"), text, EOS)
    assert [c[:2] for c in batch["tool_calls"]] == calls
    assert (batch["content"] or "") == content


def test_batch_is_vllms_but_for_the_leading_whitespace(tok: Any) -> None:
    """Our batch against our port of vLLM's (itself checked against vLLM by the goldens): the same
    calls, and the same content but for leading whitespace that vLLM strips."""
    rng = random.Random(7)
    for _ in range(400):
        segments = json_tools.xlam_output(rng)
        text = "".join(s if isinstance(s, str) else s[1] for s in segments).replace("@", "")
        ours = xlam._HOLDER.extract_with_leading_ws(text)
        theirs = xlam.vllm_extract(text)
        assert ours[:2] == theirs[:2], text
        if ours[0]:
            assert ours[2] == theirs[2] or (ours[2] or "").lstrip() == theirs[2], text


def test_resume_from_every_snapshot_with_a_long_call_held(tok: Any) -> None:
    value = "alpha beta é 😀 \\n " * 400
    text = "Checking.\n```json\n[" + '{"name": "search", "arguments": {"q": "' + value + '"}}' + "]\n```"
    batch = json_checks.check_resume_and_bounds(tok, json_checks.parser_for(tok, "xlam"), text, EOS)
    assert batch["content"] == "Checking."
    assert len(batch["tool_calls"]) == 1


def test_registered_without_request_adjustments() -> None:
    cls = parsers.tool_parser_class("xlam")
    assert cls is xlam.XlamToolParser
    assert cls.supports_required_and_named and cls.structural_tag_model is None
    adjustment = parsers.adjust_request(None, "xlam", parsers.RequestAdjustment(True, "auto", None))
    assert adjustment.skip_special_tokens is None
