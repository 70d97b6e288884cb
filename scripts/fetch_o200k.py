"""Rebuild tiktoken's `o200k_base.tiktoken` from the `js-tiktoken` npm package, offline-friendly.

gpt-oss renders through Harmony (`openai_harmony`), which loads the `o200k_base` vocabulary from
`$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` and checks its SHA-256. No Python wheel ships that
file, but `js-tiktoken` carries the same ranks (compressed: lines `! <first rank> <base64 token>...`).
This script gets the package with `npm pack` (npm's own configured registry), expands the ranks
into tiktoken's format (`<base64 token> <rank>` per line, rank order) and refuses to write
anything whose hash is not the one tiktoken and Harmony pin, so a match proves it is the real file.

    python scripts/fetch_o200k.py DIR      # writes DIR/o200k_base.tiktoken
    export TIKTOKEN_ENCODINGS_BASE=DIR
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "js-tiktoken@1.0.21"
RANKS_MEMBER = "package/dist/ranks/o200k_base.js"
FILE_NAME = "o200k_base.tiktoken"
# tiktoken_ext.openai_public.o200k_base and openai_harmony's public encodings pin this hash.
EXPECTED_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def ranks_from_js_module(source: str) -> bytes:
    """js-tiktoken's `export default {... "bpe_ranks": "..."}` -> the `.tiktoken` file's bytes."""
    body = source.strip().removeprefix("export default").strip().removesuffix(";")
    compressed: str = json.loads(body)["bpe_ranks"]
    lines: list[str] = []
    for row in compressed.split("\n"):
        if not row:
            continue
        # "! <offset> tok tok ...": consecutive ranks starting at offset (js-tiktoken's loader).
        _, offset, *tokens = row.split(" ")
        lines.extend(f"{token} {int(offset) + index}\n" for index, token in enumerate(tokens))
    return "".join(lines).encode("ascii")


def fetch_js_module(workdir: Path) -> str:
    subprocess.run(
        ["npm", "pack", PACKAGE, "--pack-destination", str(workdir), "--silent"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (tarball,) = workdir.glob("js-tiktoken-*.tgz")
    with tarfile.open(tarball) as archive:
        member = archive.extractfile(RANKS_MEMBER)
        if member is None:
            raise SystemExit(f"{tarball.name} has no {RANKS_MEMBER}")
        return io.TextIOWrapper(member, encoding="utf-8").read()


def build(target_dir: Path) -> Path:
    target = target_dir / FILE_NAME
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == EXPECTED_SHA256:
        return target
    with tempfile.TemporaryDirectory() as scratch:
        data = ranks_from_js_module(fetch_js_module(Path(scratch)))
    digest = hashlib.sha256(data).hexdigest()
    if digest != EXPECTED_SHA256:
        raise SystemExit(f"rebuilt {FILE_NAME} has SHA-256 {digest}, expected {EXPECTED_SHA256}: not written")
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("directory", type=Path, help="where to write o200k_base.tiktoken")
    args = parser.parse_args(argv)
    print(build(args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
