"""Benchmarks against vLLM's render tier, run as modules from the repository root.

    python3 -m benchmarks.render_bench --help

See benchmarks/README.md (and docs/benchmarks.md for the latest figures).
"""
