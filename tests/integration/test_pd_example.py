"""examples/pd_flow.py end to end: this render service, two real vLLM CPU `--tokens-only` engines (prefill,
decode) with the shared-storage KV connector, streaming derender. Opt-in (`-m live`): the engines take
~40 s each to start and ~4 GB each. `PD_EXAMPLE_OUT=FILE` keeps the printed output (for the README)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_fixture import engine_python

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(900),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
]


def test_pd_flow_example_runs_end_to_end() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "examples.pd_flow"],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out = run.stdout
    if os.environ.get("PD_EXAMPLE_OUT"):
        Path(os.environ["PD_EXAMPLE_OUT"]).write_text(out)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    prompt = int(re.search(r"\[  render\] \S+ (\d+) prompt tokens", out).group(1))
    assert prompt > 256, "the prompt must span whole KV blocks for the connector to move anything"
    prefill = re.search(r"first token (\d+) \(logprob (-?[\d.]+)\); returned kv_transfer_params", out)
    assert prefill is not None
    # The decode engine's own counter: prompt tokens that came through the connector, not recomputed.
    loaded = int(re.search(r"loaded (\d+) of (\d+) prompt tokens through the KV connector", out).group(1))
    assert 0 < loaded <= prompt and loaded % 16 == 0
    # Loaded KV that is wrong would change the first decoded token's logprob.
    decode = re.search(r"\[  decode\] first token (\d+) \(logprob (-?[\d.]+)\): matches the prefill engine's", out)
    assert decode is not None and decode.group(1) == prefill.group(1)
    assert abs(float(decode.group(2)) - float(prefill.group(2))) < 1e-3
    result = re.search(r"\[  result\] (\d+) chunks derendered, finish_reason (\w+)", out)
    assert result is not None and int(result.group(1)) >= 2 and result.group(2) == "length"
    assert "[derender] chunk 1:" in out
