"""Where our streamed answer does not accumulate to our batch answer, per family and parser
configuration: the fuzzed outputs of `tests/parity/compare_parsers.py` (the same families,
requests and prompts), streamed under random chunkings (`parsers.advance`, state JSON
round-tripped every chunk) and parsed in one batch call; the concatenated reasoning, content,
tool-call names and arguments, and the finish reason are compared.

    python -m tests.parsers.stream_vs_batch [--models DIR] [--family NAME ...] [--cases N]

No vLLM needed (our parsers only). Since both of our paths reproduce vLLM 0.33's (the parity
goldens), a difference printed here is one of vLLM's own stream/batch disagreements; the output
lists, per family and configuration, how many cases differ in which field (and how: only in
whitespace, one side a prefix of the other, more calls on one side, ...) and one example.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from render_service import parsers
from render_service.model.example import build_example_model
from tests.parity.compare_parsers import FAMILIES, random_chunks
from tests.parsers import cases


def _batch_view(batch: dict[str, Any]) -> dict[str, Any]:
    calls = batch["tool_calls"]
    return {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "names": [c[0] for c in calls],
        "args": [c[1] for c in calls],
        "finish": batch["finish_reason"],
    }


def _stream_view(steps: list[tuple[Any, str | None]]) -> dict[str, Any]:
    joined = cases.concat(steps)
    indexes = sorted(set(joined["names"]) | set(joined["args"]))
    return {
        "reasoning": joined["reasoning"],
        "content": joined["content"],
        "names": [joined["names"].get(i, "") for i in indexes],
        "args": [joined["args"].get(i, "") for i in indexes],
        "finish": joined["finish"],
    }


def _kind(field: str, streamed: Any, whole: Any) -> str:
    """A coarse class of one difference."""
    if isinstance(streamed, str) and streamed.strip() == whole.strip():
        return "whitespace"
    if isinstance(streamed, list):
        if len(streamed) != len(whole):
            return "more calls streamed" if len(streamed) > len(whole) else "more calls in batch"
        return "differ"
    if field == "finish":
        return f"{streamed}/{whole}"
    if not streamed or not whole:
        return "only streamed" if streamed else "only in batch"
    if whole.startswith(streamed):
        return "stream is a prefix"
    if streamed.startswith(whole):
        return "batch is a prefix"
    return "differ"


def compare(family_name: str, model_dir: Path, n: int, seed: int) -> Counter[tuple[str, str, str]]:
    from transformers import AutoTokenizer

    family = FAMILIES[family_name]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(seed)
    diffs: Counter[tuple[str, str, str]] = Counter()
    examples: dict[tuple[str, str, str], str] = {}
    for _ in range(n):
        reasoning, tool = rng.choice(family.configs)
        req_name = rng.choice(sorted(family.requests))
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **family.requests[req_name]}
        ids = cases.encode(tok, family.segments(rng))
        if not ids:
            continue
        prompt = cases.encode(tok, family.prompts[rng.choice(sorted(family.prompts))])
        chunks = random_chunks(rng, ids)
        # An engine stops with "stop" on an end-of-turn token; "length" there is not a real stream.
        finish = "stop" if ids[-1] in family.eos[1] else rng.choice(["stop", "stop", "length"])
        kwargs = req.get("chat_template_kwargs") or {}
        parser = parsers.get_parser(
            tok,
            reasoning,
            tool,
            enable_auto_tools=True,
            thinking_enabled=parsers.thinking_enabled(reasoning, kwargs, tool),
        )
        if parser is None:
            continue
        steps = cases.run_stream(tok, parser, req, prompt, chunks, finish, roundtrip_every=1, eos=family.eos)
        batch = cases.run_batch(tok, parser, req, prompt, ids, finish, eos=family.eos)
        streamed, whole = _stream_view(steps), _batch_view(batch)
        config = f"{reasoning}+{tool}"
        for field in ("reasoning", "content", "names", "args", "finish"):
            if streamed[field] != whole[field]:
                key = (config, field, _kind(field, streamed[field], whole[field]))
                diffs[key] += 1
                examples.setdefault(
                    key, f"text={batch['text']!r}\n      stream={streamed[field]!r}\n      batch={whole[field]!r}"
                )
    print(f"{family_name}: {n} cases")
    for key, count in sorted(diffs.items()):
        config, field, req_name = key
        print(f"  {config:<36} {field:<9} {req_name:<20} {count:>4}  e.g. {examples[key]}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, help="folder of fixture models, one sub-folder per model family")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.models or Path(tmp)
        for name in args.family or sorted(FAMILIES):
            family = FAMILIES[name]
            path = root / family.model
            if not (path / "tokenizer.json").exists():
                path = family.builder(path) if family.builder is not None else build_example_model(path, family.model)
            compare(name, path, args.cases, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
