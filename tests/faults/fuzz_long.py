"""A long random fuzz run of tests/faults/test_fuzz.py, outside CI.

CI runs the fuzz properties derandomized (the same ~1,650 examples on every run, reproducible
under the locked `hypothesis`). This runs them with fresh random seeds, round after round, until the
time is up, and stops at the first failure with the seed that reproduces it:

    python -m tests.faults.fuzz_long --minutes 10
    python -m tests.faults.fuzz_long --minutes 60 --examples 5000 -k request_shaped

Exit status 0 when every round passed, 1 on a failure (the round's output is printed), 2 on usage.
Replay a failure with the seed it prints:
`RENDER_FUZZ_EXAMPLES=N python -m pytest tests/faults/test_fuzz.py --hypothesis-seed=SEED`.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

FUZZ_TESTS = Path(__file__).resolve().parent / "test_fuzz.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    parser.add_argument("--examples", type=int, default=2000, help="examples per property per round (default 2000)")
    parser.add_argument(
        "-k", dest="keyword", default=None, help="only the fuzz tests matching this pytest -k expression"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    while (left := deadline - time.monotonic()) > 5:
        seed = random.SystemRandom().randrange(2**32)
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(FUZZ_TESTS),
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            f"--hypothesis-seed={seed}",
            f"--timeout={int(left) + 60}",
        ]
        if args.keyword:
            command += ["-k", args.keyword]
        env = {**os.environ, "RENDER_FUZZ_EXAMPLES": str(args.examples)}
        started = time.monotonic()
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"round {rounds + 1} (seed {seed}) stopped at the time limit; no failure so far")
            break
        rounds += 1
        took = time.monotonic() - started
        if result.returncode != 0:
            print(result.stdout[-20000:], result.stderr[-5000:], sep="\n")
            print(f"round {rounds} FAILED (seed {seed}, {args.examples} examples per property, {took:.0f}s)")
            return 1
        print(f"round {rounds} passed (seed {seed}, {args.examples} examples per property, {took:.0f}s)", flush=True)
    print(f"{rounds} rounds passed in {args.minutes:g} minutes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
