"""Differential: Harmony message text encoded by fastokens (o200k_base ranks, o200k's pattern)
against the Harmony library itself, on generated texts and on whole messages."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from render_service.model.harmony_text import harmony_fastokens
from render_service.render.renderers.harmony import HarmonyRenderer

pytest.importorskip("openai_harmony")
pytest.importorskip("fastokens")

# Pieces chosen where pre-tokenization and BPE go wrong: contractions in every case (the
# pattern's `(?i:'s|...)`), digit runs (`\p{N}{1,3}`), whitespace runs before words and at the
# end (`\s+(?!\S)`), CR/LF mixes, punctuation runs followed by newlines, combining marks, ZWJ
# emoji, CJK and RTL scripts, Harmony's own framing written as text.
PIECES = [
    "hello", "World", "HTTPServer", "camelCase", "snake_case", "naïve", "e\u0301", "Ωμέγα", "Привет",
    "日本語", "中文", "한국어", "שלום", "مرحبا", "हिन्दी", "ไทย",
    "'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", "don't", "I'M", "o'clock", "''",
    "0", "7", "42", "123", "1234", "3.14159", "-1e10", "1,000,000", "٣٤٥", "²",
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u200b", "\u2009",
    "!", "?!", "...", "---", "/*", "*/", "//", "\\", '"', "{", "}", "[", "]", "(", ")", ":", ";", "=>",
    "🙂", "👍🏽", "🧑‍💻", "🏳️‍🌈", "1️⃣", "🇫🇷",
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>",
    "functions.get_weather", "to=functions.x", "analysis", "commentary", "final",
]  # fmt: skip


def _text(rng: random.Random) -> str:
    size = rng.choice([1, 2, 5, 20, 80, 400])
    glue = rng.choice(["", " ", ""])
    return glue.join(rng.choice(PIECES) for _ in range(size))


@pytest.fixture(scope="module")
def renderer(o200k_dir: Path) -> HarmonyRenderer:
    return HarmonyRenderer()


def test_renderer_encodes_message_text_with_fastokens(renderer: HarmonyRenderer) -> None:
    """With fastokens installed and the ranks file present, the self-test passes and the
    renderer uses it (otherwise the other tests here would compare the library with itself)."""
    assert renderer.text_encoder == "fastokens"
    assert renderer.text_encode is not None


def test_generated_texts_encode_as_the_library(renderer: HarmonyRenderer) -> None:
    rng = random.Random(20261201)
    fast = renderer.text_encode
    assert fast is not None
    for _ in range(1500):
        text = _text(rng)
        assert fast(text) == renderer.library_text_ids(text), repr(text[:80])


def test_long_runs_encode_as_the_library(renderer: HarmonyRenderer) -> None:
    fast = renderer.text_encode
    assert fast is not None
    for text in ["a" * 3000, "9" * 1001, " " * 999 + "x", "\n" * 500, "😀" * 300, "ab" * 1500, "x'S" * 400]:
        assert fast(text) == renderer.library_text_ids(text), repr(text[:40])


def test_messages_render_as_the_library(renderer: HarmonyRenderer) -> None:
    """The spliced render (library framing, fastokens text) of user, assistant (every channel,
    tool calls with content type), and tool messages equals the library's own render."""
    from openai_harmony import Author, Message, RenderOptions, Role, TextContent

    rng = random.Random(7)
    for index in range(300):
        texts = [TextContent(text=_text(rng)) for _ in range(rng.randint(1, 3))]
        kind = index % 4
        if kind == 0:
            message = Message(author=Author(role=Role.USER), content=texts)
        elif kind == 1:
            message = Message(author=Author(role=Role.ASSISTANT), content=texts).with_channel(
                rng.choice(["analysis", "final", "commentary"])
            )
        elif kind == 2:
            arguments = json.dumps({"q": _text(rng), "n": rng.randint(0, 10**6)}, ensure_ascii=rng.random() < 0.5)
            message = (
                Message(author=Author(role=Role.ASSISTANT), content=[TextContent(text=arguments)])
                .with_channel("commentary")
                .with_recipient("functions.get_weather")
                .with_content_type("json")
            )
        else:
            message = Message(author=Author.new(Role.TOOL, "functions.get_weather"), content=texts).with_channel(
                "commentary"
            )
        for tools in (False, True):
            library = renderer.legacy_tool_call_headers(
                renderer.encoding.render(message, RenderOptions(conversation_has_function_tools=tools))
            )
            assert renderer._render_message(message, tools) == library


def test_a_differing_encoder_is_refused(renderer: HarmonyRenderer) -> None:
    """The self-test rejects fastokens when the reference differs anywhere on its corpus."""

    def off_by_one(text: str) -> list[int]:
        ids = renderer.library_text_ids(text)
        return [*ids[:-1], ids[-1] + 1] if "0123456789" in text else ids

    assert harmony_fastokens(renderer.library_text_ids) is not None
    assert harmony_fastokens(off_by_one) is None


def test_no_ranks_file_keeps_the_library(renderer: HarmonyRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/nonexistent")
    assert harmony_fastokens(renderer.library_text_ids) is None
