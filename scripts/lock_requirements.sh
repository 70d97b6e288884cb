#!/usr/bin/env bash
# Regenerate requirements/constraints.txt: every package that `pip install '.[test]'` (or any
# other extra, or the image's runtime install) can pull in, pinned to one version, for every
# Python >= 3.11 and platform (uv's universal resolution; environment markers where they differ).
# CI (.ci/run) and the Dockerfile install with `-c requirements/constraints.txt`, so a fresh
# machine resolves exactly what was locked here: in particular the `hypothesis` whose derandomized
# examples tests/faults/test_fuzz.py runs, and the `transformers` whose template semantics we match.
#
#   scripts/lock_requirements.sh            # re-resolve to the newest versions allowed by pyproject.toml
#   scripts/lock_requirements.sh --check    # exit 1 if the lock is stale against pyproject.toml
#
# Needs network access to the package index. uv is installed into a throwaway virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
tool_env=$(mktemp -d)
trap 'rm -rf "$tool_env"' EXIT
python3 -m venv "$tool_env"
"$tool_env/bin/python" -m pip install -q "uv==${UV_VERSION}"

compile() {
  # --no-emit-index-url: no index or mirror host names in the committed file.
  "$tool_env/bin/python" -m uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
    --no-emit-index-url --custom-compile-command "scripts/lock_requirements.sh" "$@"
}

if [ "${1:-}" = "--check" ]; then
  # Resolve again, preferring the locked versions: any change means pyproject.toml moved.
  fresh=$(mktemp)
  cp requirements/constraints.txt "$fresh"
  compile -q -o "$fresh"
  if ! diff -u requirements/constraints.txt "$fresh"; then
    echo "requirements/constraints.txt is stale: run scripts/lock_requirements.sh" >&2
    exit 1
  fi
  echo "requirements/constraints.txt is up to date"
else
  mkdir -p requirements
  compile -q --upgrade -o requirements/constraints.txt
  echo "wrote requirements/constraints.txt ($(grep -c '==' requirements/constraints.txt) pins)"
fi
