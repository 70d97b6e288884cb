"""Our streamed answer accumulates to our batch answer (vLLM 0.33's), except where
`stream_vs_batch.NOT_ACCUMULATING` names the cause: a fixed-seed run of the fuzzed comparison
(`python -m tests.parsers.stream_vs_batch --check` runs it with more cases)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.parity.compare_parsers import FAMILIES
from tests.parsers import stream_vs_batch

CASES = 60  # per family: well under a second each once the tokenizer is loaded


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("stream-vs-batch")
    cache: dict[str, Any] = {}
    for name in sorted(FAMILIES):
        model = FAMILIES[name].model
        if model not in cache:
            cache[model] = stream_vs_batch.load_tokenizer(name, root)
    return cache


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_stream_accumulates_to_batch(tokenizers: dict[str, Any], family: str) -> None:
    diffs, examples = stream_vs_batch.compare(family, tokenizers[FAMILIES[family].model], CASES, 0, quiet=True)
    bad = stream_vs_batch.unlisted(family, diffs)
    shown = [f"{key}: {example}" for key, example in examples.items() if key[0] in bad]
    assert not bad, "\n".join(shown[:5])


def test_not_accumulating_names_only_known_configurations() -> None:
    for family, config in stream_vs_batch.NOT_ACCUMULATING:
        reasoning, tool = (None if part == "None" else part for part in config.split("+"))
        assert (reasoning, tool) in FAMILIES[family].configs, (family, config)
