"""The Harmony (gpt-oss) renderer selection, the o200k rebuild, and the derender state machine
checked against Harmony's own `StreamableParser` (the parser vLLM runs)."""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from render_service.parsers import RequestOptions, tool_ids
from render_service.parsers import harmony as hp
from render_service.render import renderers

ROOT = Path(__file__).resolve().parents[2]


# -- selection and the vocabulary script -------------------------------------------------------------


@pytest.mark.parametrize("requested", ["auto", "hf", "HF"])
def test_gpt_oss_model_type_selects_harmony(requested: str) -> None:
    mode, why = renderers.detect_mode(requested, {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]}, [])
    assert (mode, why) == ("harmony", "model_type gpt_oss")
    assert renderers.detect_mode("auto", {"model_type": "qwen3"}, [])[0] == "hf"


def _fetch_script() -> Any:
    spec = importlib.util.spec_from_file_location("fetch_o200k", ROOT / "scripts" / "fetch_o200k.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_o200k_rebuild_expands_js_tiktoken_ranks() -> None:
    fetch_o200k = _fetch_script()
    a, b, c = (base64.b64encode(x).decode() for x in (b"a", b"b", b" the"))
    module = 'export default {"pat_str":"x","bpe_ranks":"! 0 ' + f"{a} {b}\\n! 7 {c}" + '"};\n'
    assert fetch_o200k.ranks_from_js_module(module) == f"{a} 0\n{b} 1\n{c} 7\n".encode()


def test_o200k_file_has_the_pinned_hash(o200k_dir: Path) -> None:
    import hashlib

    fetch_o200k = _fetch_script()
    digest = hashlib.sha256((o200k_dir / "o200k_base.tiktoken").read_bytes()).hexdigest()
    assert digest == fetch_o200k.EXPECTED_SHA256


def test_header_grammar() -> None:
    assert hp.parse_header("<|channel|>commentary to=functions.f <|constrain|>json", True) == (
        "assistant",
        "commentary",
        "functions.f",
        "<|constrain|>json",
    )
    assert hp.parse_header("assistant to=functions.f<|channel|>commentary json", False) == (
        "assistant",
        "commentary",
        "functions.f",
        "json",
    )
    assert hp.parse_header("functions.get_weather to=assistant<|channel|>commentary", False)[0] == "tool"
    with pytest.raises(hp.HarmonyError):
        hp.parse_header("<|channel|> x", True)
    with pytest.raises(hp.HarmonyError):
        hp.parse_header("bogus", False)


# -- the state machine against Harmony's StreamableParser ---------------------------------------------


@pytest.fixture(scope="module")
def harmony_lib(o200k_dir: Path) -> Any:
    return pytest.importorskip("openai_harmony")


@pytest.fixture(scope="module")
def tokenizer(gpt_oss_model_dir: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(gpt_oss_model_dir / "tokenizer.json"))


PIECES = [
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "analysis",
    "final",
    "commentary",
    "assistant",
    " to=functions.get_weather",
    " to=browser.search",
    " json",
    "json",
    " ",
    "user",
    "Hello world",
    '{"a": 1}',
    "👋🏽",
    "日本",
    "\n",
]


def _random_output(rng: random.Random, tok: Any) -> list[int]:
    ids: list[int] = []
    for _ in range(rng.randint(1, 30)):
        ids += tok.encode(rng.choice(PIECES), add_special_tokens=False)
        if rng.random() < 0.1:  # a lone byte-level token: splits UTF-8 sequences
            ids.append(rng.randint(0, 255))
    return ids


def _well_formed(rng: random.Random, tok: Any) -> list[int]:
    messages = []
    for i in range(rng.randint(1, 4)):
        channel = rng.choice(["analysis", "final", "commentary"])
        header = f"<|channel|>{channel}"
        if channel == "commentary" and rng.random() < 0.6:
            header += rng.choice([" to=functions.get_weather <|constrain|>json", " to=functions.f"])
        body = rng.choice(["Hi there.", '{"city": "Paris"}', "naïve 👋🏽 日本", ""])
        end = rng.choice(["<|end|>", "<|call|>", "<|return|>"])
        messages.append(("" if i == 0 else "<|start|>assistant") + f"{header}<|message|>{body}{end}")
    text = "".join(messages)
    return tok.encode(text[: rng.randint(len(text) // 2, len(text))], add_special_tokens=False)


@functools.cache
def _encoding(lib: Any) -> Any:
    return lib.load_harmony_encoding(lib.HarmonyEncodingName.HARMONY_GPT_OSS)


def _reference(lib: Any, ids: list[int]) -> list[Any]:
    """What vLLM's HarmonyParser sees per token, from Harmony itself, then at EOS."""
    encoding = _encoding(lib)
    parser = lib.StreamableParser(encoding, role=lib.Role.ASSISTANT)
    out: list[Any] = []
    seen = 0
    for token in ids:
        try:
            parser.process(token)
        except lib.HarmonyError:
            out.append("error")
            continue
        done = None
        if len(parser.messages) > seen:
            message = parser.messages[seen]
            seen += 1
            done = (
                message.author.role.value,
                message.channel,
                hp.normalize_recipient(message.recipient),
                message.content[0].text,
            )
        out.append(
            (
                parser.current_channel,
                hp.normalize_recipient(parser.current_recipient),
                parser.last_content_delta or "",
                done,
            )
        )
    try:
        parser.process_eos()
        eos: Any = None
        if len(parser.messages) > seen:
            message = parser.messages[seen]
            eos = (
                message.author.role.value,
                message.channel,
                hp.normalize_recipient(message.recipient),
                message.content[0].text,
            )
    except lib.HarmonyError:
        eos = "error"
    out.append(eos)
    return out


def _ours(vocab: hp.Vocabulary, ids: list[int]) -> list[Any]:
    st = hp.HarmonyState()
    batch = hp.Collector()
    out: list[Any] = []
    for token in ids:
        before = len(batch.messages)
        segments = hp.feed(vocab, st, [token], batch)
        if not segments:
            out.append("error")
            continue
        (segment,) = segments
        done = None
        if segment.completed is not None:
            m = batch.messages[before]
            done = (m.role, m.channel, m.recipient, m.text)
        out.append((segment.channel, segment.recipient, segment.delta, done))
    try:
        m2 = hp.process_eos(st)
        out.append(None if m2 is None else (m2.role, m2.channel, m2.recipient, "".join(batch.pending) + m2.text))
    except hp.HarmonyError:
        out.append("error")
    return out


@pytest.mark.parametrize("seed", range(6))
def test_state_machine_matches_streamable_parser(seed: int, harmony_lib: Any, tokenizer: Any) -> None:
    vocab = hp.Vocabulary(hp.TokenizerInfo.of(tokenizer))
    rng = random.Random(seed)
    for _ in range(60):
        ids = _well_formed(rng, tokenizer) if rng.random() < 0.5 else _random_output(rng, tokenizer)
        assert _ours(vocab, ids) == _reference(harmony_lib, ids), tokenizer.decode(ids)


# -- streaming: resumable, bounded, the same as batch --------------------------------------------------

OUTPUT = (
    "<|channel|>analysis<|message|>Need the weather 👋🏽.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris"}<|call|>'
)


def _stream(parser: hp.HarmonyChatParser, ids: list[int], sizes: list[int], resume: bool) -> list[Any]:
    opts = RequestOptions(tool_choice="auto", has_tools=True, tools=[{"type": "function"}])
    state = parser.new_state([1, 2, 3])
    deltas, start = [], 0
    for k, size in enumerate(sizes):
        if resume:  # a snapshot taken, sent over the wire, and loaded by another replica's parser
            state = parser.load_state(msgspec.json.decode(msgspec.json.encode(state.to_obj())))
        chunk = ids[start : start + size]
        start += size
        last = k == len(sizes) - 1
        delta, finish = parser.step(state, "", chunk, "stop" if last else None, opts, tool_ids("r"))
        deltas.append((delta.to_wire() if delta else None, finish))
    return deltas


def test_stream_resumes_from_snapshots_and_matches_batch(tokenizer: Any) -> None:
    parser = hp.get_parser(tokenizer, "openai_gptoss", "openai", enable_auto_tools=True)
    assert parser is not None
    ids = tokenizer.encode(OUTPUT, add_special_tokens=False)
    rng = random.Random(7)
    sizes: list[int] = []
    while sum(sizes) < len(ids):
        sizes.append(min(rng.randint(1, 5), len(ids) - sum(sizes)))
    straight = _stream(parser, ids, sizes, resume=False)
    assert _stream(parser, ids, sizes, resume=True) == straight
    reasoning = "".join(d["reasoning"] or "" for d, _ in straight if d)
    arguments = "".join(tc["function"]["arguments"] or "" for d, _ in straight if d for tc in d.get("tool_calls", []))
    assert reasoning == "Need the weather 👋🏽."
    assert json.loads(arguments) == {"city": "Paris"}
    assert straight[-1][1] == "tool_calls"
    opts = RequestOptions(tool_choice="auto", has_tools=True)
    batch = parser.parse("", opts, None, ids)
    assert batch[0] == reasoning and batch[1] is None
    assert batch[2] is not None and [(c.name, c.arguments) for c in batch[2]] == [("get_weather", '{"city": "Paris"}')]


def test_stream_state_does_not_grow_with_the_output(tokenizer: Any) -> None:
    parser = hp.get_parser(tokenizer, "openai_gptoss", None, enable_auto_tools=False)
    assert parser is not None
    state = parser.new_state(None)
    opts = RequestOptions()
    head = tokenizer.encode("<|channel|>final<|message|>", add_special_tokens=False)
    parser.step(state, "", head, None, opts, tool_ids("r"))
    sizes = []
    word = tokenizer.encode(" word", add_special_tokens=False)
    for _ in range(2000):
        parser.step(state, "", word, None, opts, tool_ids("r"))
        sizes.append(len(msgspec.json.encode(state.to_obj())))
    assert max(sizes) == min(sizes) < 200


def test_harmony_parsers_refused_for_other_models(qwen3_model_dir: Path) -> None:
    from render_service.model.loader import ModelLoadError, load_model
    from render_service.settings import Settings

    settings = Settings(model=str(qwen3_model_dir), reasoning_parser="openai_gptoss").validate()
    with pytest.raises(ModelLoadError, match="openai_gptoss"):
        load_model(settings)


def test_gpt_oss_folder_loads_the_harmony_renderer(gpt_oss_model_dir: Path) -> None:
    from render_service.model.loader import load_model
    from render_service.settings import Settings

    settings = Settings(model=str(gpt_oss_model_dir)).validate()
    model = load_model(settings)
    assert model.renderer_mode == "harmony"
    assert settings.reasoning_parser == "openai_gptoss"  # vLLM's default for GptOssForCausalLM
    assert model.renderer.fingerprint["oss_harmony"] == "0.0.11"


def test_streaming_advance_does_not_detokenize_for_harmony(tokenizer: Any) -> None:
    """`parsers.advance` skips the detokenizer for Harmony (its parser reads ids only): the
    detokenizer state stays the seed, and the deltas are the parser's own."""
    from render_service.parsers import advance, new_parsed_stream

    parser = hp.get_parser(tokenizer, "openai_gptoss", "openai", enable_auto_tools=True)
    assert parser is not None
    prompt = tokenizer.encode("<|start|>user<|message|>hi<|end|><|start|>assistant", add_special_tokens=False)
    ids = tokenizer.encode(OUTPUT, add_special_tokens=False)
    parsed = new_parsed_stream(parser, prompt)
    seed = msgspec.json.encode(parsed.detok)
    opts = RequestOptions(tool_choice="auto", has_tools=True)
    streamed = [advance(parser, parsed, [i], [i], None, opts, tool_ids("r"))[0] for i in ids]
    assert msgspec.json.encode(parsed.detok) == seed
    state = parser.new_state(prompt)
    direct = [parser.step(state, "", [i], None, opts, tool_ids("r"))[0] for i in ids]
    assert [d.to_wire() if d else None for d in streamed] == [d.to_wire() if d else None for d in direct]
    assert any(d is not None and d.reasoning for d in streamed)
