"""Tiny Mistral-format model folders built from the tokenizer files mistral-common ships.

    python -m tests.mistral_fixture OUT_DIR {v7,v11,v13}

mistral-common's package data has Tekken vocabularies (`data/tekken_240911.json`, a v3 file
with no special-token list). A folder here is that vocabulary cut to its first
`VOCAB_TOKENS` ranks (so loading takes milliseconds), with the tokenizer version and the
special-token table of the Mistral release it stands for:

- `v7`: the twenty legacy specials (`[TOOL_CALLS]` + a JSON array of calls, `[SYSTEM_PROMPT]`);
- `v11`: adds `[ARGS]` and `[CALL_ID]` (`[TOOL_CALLS]name[ARGS]{...}`), as Mistral Small 3.2;
- `v13`: adds `[THINK]`/`[/THINK]` and drops call ids from the prompt, as Magistral/Devstral 2.

Next to `tekken.json` sit a one-scalar `consolidated.safetensors` and a Mistral `config.json`,
so vLLM's `is_mistral_model_repo` (and ours) picks the `mistral` renderer with
`--tokenizer-mode auto`. No hub access, no weights.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path
from typing import Any

VOCAB_TOKENS = 8000
NUM_SPECIAL = 1000
VERSIONS = ("v7", "v11", "v13")

# mistral-common's `Tekkenizer.DEPRECATED_SPECIAL_TOKENS` order (ranks 0..19).
_LEGACY_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
# The ranks the released v11+ Tekken files give the newer markers.
_NEWER_SPECIALS = {
    "v11": {32: "[ARGS]", 33: "[CALL_ID]"},
    "v13": {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"},
}


def _source_vocabulary() -> dict[str, Any]:
    import mistral_common

    path = Path(mistral_common.__file__).resolve().parent / "data" / "tekken_240911.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def tekken_file(version: str) -> dict[str, Any]:
    """The tekken.json content for `version`."""
    if version not in VERSIONS:
        raise ValueError(f"unknown fixture version {version!r}; one of {VERSIONS}")
    source = _source_vocabulary()
    specials: list[dict[str, Any]] = [
        {"rank": rank, "token_str": token, "is_control": True} for rank, token in enumerate(_LEGACY_SPECIALS)
    ]
    newer = _NEWER_SPECIALS.get(version, {})
    if newer:
        for rank in range(len(_LEGACY_SPECIALS), max(newer) + 1):
            token = newer.get(rank, f"<SPECIAL_{rank}>")
            specials.append({"rank": rank, "token_str": token, "is_control": True})
    config = dict(source["config"])
    config.update(
        version=version, default_vocab_size=VOCAB_TOKENS + NUM_SPECIAL, default_num_special_tokens=NUM_SPECIAL
    )
    config["num_vocab_tokens"] = VOCAB_TOKENS
    out: dict[str, Any] = {"config": config, "vocab": source["vocab"][:VOCAB_TOKENS]}
    if version != "v7":  # v7 files may omit the table (mistral-common then uses the legacy one)
        out["special_tokens"] = specials
    return out


def _tiny_safetensors() -> bytes:
    """A valid safetensors file with one bf16 scalar (vLLM reads the header for the dtype)."""
    header = json.dumps({"norm.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"\x00\x00"


def build_mistral_model(out_dir: str | Path, version: str) -> Path:
    """Write a Mistral-format folder for tokenizer `version` into `out_dir`; returns it."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tekken.json").write_text(json.dumps(tekken_file(version)), encoding="utf-8")
    (folder / "consolidated.safetensors").write_bytes(_tiny_safetensors())
    config = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": VOCAB_TOKENS + NUM_SPECIAL,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("version", choices=VERSIONS)
    args = parser.parse_args(argv)
    print(build_mistral_model(args.out_dir, args.version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
