#!/usr/bin/env python3
"""render-service vs vLLM 0.33's `vllm launch render`, side by side, on the same requests.

A benchmark script, not a timed test. For each target (ours, vLLM and the floor servers of
floor_server.py, bare Starlette + orjson + template + fastokens, with jinja2 and with minijinja;
each one process, one worker) and each scenario (short chat, ~9k-token chat, multi-turn agent
conversation with a large tools block) it sends N chat-render requests sequentially and then at
concurrency 8, in rounds interleaved across the targets, and prints req/s, p50/p99 wall latency
and server CPU-ms per request (schedstat of every thread of the server's process tree over the
run, divided by the requests), with vLLM/ours and ours/floor-server ratios, plus the in-process
floor: the same chat rendered with transformers' `apply_chat_template(tokenize=False)` and encoded
with the fastest tokenizer that gives the same ids, timed in this process.

Before anything is timed, ours and vLLM must return identical `token_ids` for every payload
(the comparison must be of the same work); the script aborts otherwise. The floor servers'
token_ids are compared with ours too; a difference is reported, not fatal.

Example (starts both servers itself, stops them at the end):

    python3 -m benchmarks.render_bench --json render_bench.json

See benchmarks/README.md for the options and how to read the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

# benchmarks/ is a folder of scripts, not a package: make the shared helpers importable.
from benchmarks._common import (
    DEFAULT_ORACLE_PYTHON,
    Memory,
    Server,
    example_model_dir,
    fmt,
    fmt_bytes,
    format_table,
    free_port,
    percentile,
    ratio,
    start_floor_server,
    start_render_service,
    start_vllm_render,
    wait_healthy,
)

RENDER_PATH = "/v1/chat/completions/render"
MODEL_NAME = "tinyqwen3"
DEFAULT_SERVER_ARGS = (
    f"--served-model-name {MODEL_NAME} --reasoning-parser qwen3 --enable-auto-tool-choice "
    "--tool-call-parser hermes --max-model-len 16384"
)
HEADERS = {"content-type": "application/json"}
# benchmarks/floor_server.py (bare Starlette + orjson + template + fastokens), one per template engine:
# jinja2 (the issue's sketch) and minijinja (render-service's own fast path: the stricter floor).
FLOOR_SERVERS = {"jinja2": "floor-j2", "minijinja": "floor-mj"}

# =============================================================================================
# Payloads: deterministic (seeded) realistic English, code, logs and JSON.
# =============================================================================================

_SUBJECTS = (
    "the ingestion pipeline",
    "our billing service",
    "the scheduler",
    "each worker",
    "the cache layer",
    "this migration",
    "the new API gateway",
    "the retry policy",
    "the nightly batch job",
    "the search index",
    "the rate limiter",
    "the payments team",
    "the feature flag service",
    "the load balancer",
    "the reconciliation job",
    "the on-call engineer",
    "the event bus",
    "the session store",
    "the query planner",
    "the deployment controller",
    "the metrics exporter",
    "the auth middleware",
    "the connection pool",
    "the background compactor",
    "the upstream provider",
    "the staging cluster",
)
_VERBS = (
    "processes",
    "rejects",
    "buffers",
    "retries",
    "writes",
    "reads",
    "validates",
    "streams",
    "drops",
    "deduplicates",
    "forwards",
    "caches",
    "serializes",
    "throttles",
    "re-queues",
    "partitions",
    "aggregates",
    "flushes",
    "replays",
    "snapshots",
    "batches",
    "invalidates",
    "emits",
    "reconciles",
)
_OBJECTS = (
    "incoming events from Kafka",
    "the customer records",
    "about {n},000 rows per second",
    "every request with a stale token",
    "the pending invoices",
    "the write-ahead log",
    "partial results to object storage",
    "the hot keys in memory",
    "duplicate webhook deliveries",
    "the per-tenant quotas",
    "the schema changes",
    "{n} shards in parallel",
    "the audit trail",
    "the largest payloads",
    "the health-check responses",
    "the configuration snapshot",
    "messages older than {n} minutes",
    "the p99 latency budget",
    "all open transactions",
    "the results of the previous run",
    "the dead-letter queue",
    "the user-facing error messages",
)
_CLAUSES = (
    "",
    "",
    "",
    " before the lock is released",
    " when the queue depth exceeds the high-water mark",
    " unless the request carries an idempotency key",
    " during the maintenance window",
    " so that downstream consumers never see a partial batch",
    " after the leader election settles",
    " because the upstream API returns 429 under load",
    " without holding the global mutex",
    " only if the checksum matches",
    " within {n} milliseconds",
    " as soon as the circuit breaker closes",
    " in the same transaction as the outbox write",
    " whenever a deploy is in progress",
    " while the replica is still catching up",
    " to keep memory under {n} MiB",
)
_OPENERS = (
    "",
    "",
    "",
    "",
    "However, ",
    "In practice, ",
    "As a result, ",
    "For example, ",
    "Note that ",
    "In the current design, ",
    "Historically, ",
    "After the incident on {date}, ",
    "In our benchmarks, ",
    "To be safe, ",
    "Unfortunately, ",
    "By default, ",
    "With the new flag enabled, ",
    "Once again, ",
)
_NOUNS = (
    "user",
    "order",
    "invoice",
    "event",
    "batch",
    "record",
    "token",
    "session",
    "request",
    "shard",
    "queue",
    "metric",
    "payload",
    "config",
    "schema",
    "cursor",
    "offset",
    "partition",
    "tenant",
    "account",
    "ledger",
    "snapshot",
    "window",
    "bucket",
    "span",
    "trace",
    "job",
    "task",
    "worker",
    "lease",
    "chunk",
)
_ID_VERBS = (
    "load",
    "parse",
    "validate",
    "merge",
    "flush",
    "resolve",
    "compute",
    "fetch",
    "render",
    "encode",
    "split",
    "retry",
    "emit",
    "collect",
    "normalize",
    "apply",
    "build",
    "refresh",
    "sync",
    "drain",
)
_TYPES = ("int", "str", "float", "bool", "list[str]", "dict[str, Any]", "Sequence[int]", "Path", "bytes")
_HEADINGS = (
    "Background",
    "Goals",
    "Non-goals",
    "Current architecture",
    "Proposed design",
    "Data model",
    "Failure modes",
    "Rollout plan",
    "Observability",
    "Performance",
    "Security considerations",
    "Alternatives considered",
    "Open questions",
    "Migration",
    "Testing strategy",
    "Capacity planning",
)
_QUESTIONS = (
    "Can you explain why the p99 latency doubled after the last deploy?",
    "What is the safest way to roll this change out to all regions?",
    "How should we handle retries so that we never charge a customer twice?",
    "Is there a simpler way to write this function without the nested loops?",
    "Could you summarize the trade-offs between the two designs in a short table?",
    "Why does the consumer lag keep growing even though CPU usage is low?",
    "What tests would you add before we enable this flag in production?",
    "How do I make this endpoint idempotent without adding a new table?",
)


def _past(verb: str) -> str:
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y"):
        return verb[:-1] + "ied"
    if verb in ("emit", "split"):
        return verb + ("ted" if verb == "emit" else "")
    return verb + "ed"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


class Writer:
    """Seeded generator of realistic-looking technical prose, Python code, logs and JSON."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _fill(self, template: str) -> str:
        rng = self.rng
        return template.format(
            n=rng.choice((2, 3, 4, 8, 12, 16, 32, 64, 120, 250, 500)),
            date=f"2026-0{rng.randint(1, 9)}-{rng.randint(10, 28)}",
        )

    def ident(self, words: int = 2) -> str:
        parts = [self.rng.choice(_ID_VERBS)] + [self.rng.choice(_NOUNS) for _ in range(words - 1)]
        return "_".join(parts)

    def sentence(self) -> str:
        rng = self.rng
        text = self._fill(
            rng.choice(_OPENERS) + f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} "
            f"{rng.choice(_OBJECTS)}{rng.choice(_CLAUSES)}."
        )
        if rng.random() < 0.15:
            text = text[:-1] + f" (see `{self.ident(2)}()` in `{_plural(rng.choice(_NOUNS))}/{self.ident(1)}.py`)."
        return text[0].upper() + text[1:]

    def paragraph(self, sentences: tuple[int, int] = (3, 6)) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(*sentences)))

    def bullets(self, count: int | None = None) -> str:
        count = count or self.rng.randint(3, 6)
        return "\n".join(f"- {self.sentence()}" for _ in range(count))

    def function(self, indent: str = "") -> str:
        rng = self.rng
        name = self.ident(rng.randint(2, 3))
        params = [
            (rng.choice(_NOUNS) + ("s" if rng.random() < 0.4 else ""), rng.choice(_TYPES))
            for _ in range(rng.randint(1, 4))
        ]
        params = list(dict(params).items())
        signature = ", ".join(f"{p}: {t}" for p, t in params)
        is_async = rng.random() < 0.3
        lines = [
            f"{'async ' if is_async else ''}def {name}({signature}) -> {rng.choice(_TYPES)}:",
            f'    """{self.sentence()}"""',
        ]
        first = params[0][0]
        acc = rng.choice(_NOUNS) + "s"
        lines.append(f"    {acc} = []")
        for _ in range(rng.randint(3, 7)):
            kind = rng.randrange(6)
            p = rng.choice(params)[0]
            if kind == 0:
                lines += [f"    if {p} is None:", f'        raise ValueError("{p} must be set")']
            elif kind == 1:
                lines.append(f"    {rng.choice(_NOUNS)}_map = {{k: v for k, v in {p}.items() if v is not None}}")
            elif kind == 2:
                item = rng.choice(_NOUNS)
                lines += [
                    f"    for {item} in {p}:",
                    f"        if {item}.{rng.choice(_NOUNS)}_count > {rng.randint(2, 999)}:",
                    f"            {acc}.append({item})",
                ]
            elif kind == 3:
                lines.append(
                    f'    logger.info("{_past(rng.choice(_ID_VERBS))} %d {rng.choice(_NOUNS)}s in %.1f ms", '
                    f"len({acc}), elapsed * 1000)"
                )
            elif kind == 4 and is_async:
                lines.append(
                    f"    {rng.choice(_NOUNS)} = await self.{self.ident(2)}({p}, "
                    f"timeout={rng.choice((0.5, 2.0, 30.0))})"
                )
            else:
                lines += [
                    "    try:",
                    f"        {acc}.extend({self.ident(2)}({first}))",
                    f"    except {rng.choice(('KeyError', 'TimeoutError', 'OSError'))} as exc:",
                    f'        logger.warning("skipping {first}: %s", exc)',
                ]
        lines.append(f"    return {acc}")
        return "\n".join(indent + line if line else line for line in lines)

    def module(self, functions: int) -> str:
        header = (
            '"""' + self.sentence() + '"""\n\nfrom __future__ import annotations\n\nimport logging\n'
            "from collections.abc import Sequence\nfrom pathlib import Path\nfrom typing import Any\n\n"
            "logger = logging.getLogger(__name__)\n"
        )
        return header + "\n\n" + "\n\n\n".join(self.function() for _ in range(functions)) + "\n"

    def log(self, lines: int) -> str:
        rng = self.rng
        out = []
        for i in range(lines):
            level = rng.choices(("INFO", "DEBUG", "WARN", "ERROR"), (10, 4, 2, 1))[0]
            out.append(
                f"2026-03-14T09:{12 + i // 60:02d}:{i % 60:02d}.{rng.randint(0, 999):03d}Z {level:<5} "
                f"worker-{rng.randint(0, 7)} {self.ident(2)}: {_past(rng.choice(_ID_VERBS))} "
                f"{rng.randint(1, 4096)} {rng.choice(_NOUNS)}s from shard {rng.randint(0, 15)} "
                f"in {rng.randint(1, 900)}ms (queue_depth={rng.randint(0, 20000)})"
            )
        return "\n".join(out)

    def traceback(self) -> str:
        frames = "\n".join(
            f'  File "/srv/app/{_plural(self.rng.choice(_NOUNS))}/{self.ident(1)}.py", line {self.rng.randint(10, 900)}, '
            f"in {self.ident(2)}\n    {self.ident(2)}({self.rng.choice(_NOUNS)}, retries=3)"
            for _ in range(self.rng.randint(3, 6))
        )
        return f"Traceback (most recent call last):\n{frames}\nTimeoutError: {self.sentence()}"

    def markdown(self, char_budget: int) -> str:
        rng = self.rng
        parts = [f"# RFC: {self.ident(2).replace('_', ' ').title()} redesign\n"]
        size = len(parts[0])
        headings = list(_HEADINGS)
        rng.shuffle(headings)
        while size < char_budget:
            heading = headings.pop() if headings else f"Appendix {rng.randint(1, 9)}"
            section = [f"## {heading}\n", self.paragraph()]
            roll = rng.random()
            if roll < 0.35:
                section.append(self.bullets())
            elif roll < 0.6:
                section.append("```python\n" + self.function() + "\n```")
            elif roll < 0.7:
                rows = "\n".join(
                    f"| {self.ident(1)} | {rng.randint(1, 500)} ms | {rng.randint(1, 99)}% |"
                    for _ in range(rng.randint(3, 6))
                )
                section.append("| component | p99 | share |\n|---|---|---|\n" + rows)
            section.append(self.paragraph())
            text = "\n\n".join(section) + "\n"
            parts.append(text)
            size += len(text)
        return "\n".join(parts)

    def json_blob(self, items: int) -> str:
        rng = self.rng
        data = {
            "results": [
                {
                    "path": f"src/{_plural(rng.choice(_NOUNS))}/{self.ident(1)}.py",
                    "line": rng.randint(1, 800),
                    "score": round(rng.random(), 4),
                    "snippet": f"{self.ident(2)}({rng.choice(_NOUNS)}, timeout={rng.randint(1, 60)})",
                    "symbols": [self.ident(2) for _ in range(rng.randint(1, 3))],
                }
                for _ in range(items)
            ],
            "total": items + rng.randint(0, 40),
            "truncated": rng.random() < 0.5,
        }
        return json.dumps(data, indent=2)


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": messages, **extra}


def short_chat(seed: int) -> dict[str, Any]:
    """~300 prompt tokens: system, user, assistant, user."""
    w = Writer(seed)
    return _chat(
        [
            {
                "role": "system",
                "content": "You are a concise senior backend engineer. Answer with concrete steps "
                "and short code when it helps.",
            },
            {"role": "user", "content": f"{w.paragraph((2, 3))} {w.rng.choice(_QUESTIONS)}"},
            {"role": "assistant", "content": f"{w.paragraph((2, 3))}\n\n{w.bullets(3)}"},
            {"role": "user", "content": f"Thanks. {w.sentence()} {w.rng.choice(_QUESTIONS)}"},
        ]
    )


def long_chat(seed: int) -> dict[str, Any]:
    """~9k prompt tokens over several turns: a design doc, a review, a module and its logs."""
    w = Writer(seed)
    return _chat(
        [
            {
                "role": "system",
                "content": "You are a meticulous staff engineer reviewing designs and code. " + w.paragraph((2, 3)),
            },
            {
                "role": "user",
                "content": "Here is the design doc for next quarter. Please review it critically "
                "and list the risks you see.\n\n" + w.markdown(16500),
            },
            {
                "role": "assistant",
                "content": "Overall the direction is sound, but a few things worry me.\n\n" + w.markdown(5000),
            },
            {
                "role": "user",
                "content": "Good points. This is the module that implements the first part, and the "
                "logs from the staging run where it failed:\n\n```python\n"
                + w.module(9)
                + "```\n\n```\n"
                + w.log(22)
                + "\n"
                + w.traceback()
                + "\n```",
            },
            {
                "role": "assistant",
                "content": w.paragraph()
                + "\n\n```python\n"
                + w.function()
                + "\n```\n\n"
                + w.bullets(5)
                + "\n\n"
                + w.paragraph(),
            },
            {"role": "user", "content": f"{w.paragraph((2, 3))} {w.rng.choice(_QUESTIONS)}"},
        ]
    )


# -- the agent scenario: ~15 tools with nested JSON schemas, ~10 assistant turns -------------


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": description, **extra}


def _b(description: str, default: bool = False) -> dict[str, Any]:
    return {"type": "boolean", "description": description, "default": default}


def _arr(items: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "array", "description": description, "items": items, **extra}


def _obj(
    properties: dict[str, Any], required: Sequence[str] = (), description: str | None = None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = properties
    if required:
        out["required"] = list(required)
    out.update(extra)
    return out


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def agent_tools() -> list[dict[str, Any]]:
    """15 tools of a coding/ops agent, with nested object and array schemas (fixed, like a real agent)."""
    range_obj = _obj(
        {
            "start_line": _i("First line, 1-based.", minimum=1),
            "end_line": _i("Last line, inclusive; -1 for the end of the file.", minimum=-1),
        },
        ["start_line"],
        "Optional line range to read.",
    )
    return [
        _tool(
            "search_code",
            "Search the repository for code matching a query. Returns ranked matches with "
            "file paths, line numbers and short snippets. Prefer narrow queries and path globs.",
            _obj(
                {
                    "query": _s("Text or regular expression to search for."),
                    "path_globs": _arr(_s("A glob such as 'src/**/*.py'."), "Only search files matching these."),
                    "options": _obj(
                        {
                            "case_sensitive": _b("Match case exactly."),
                            "regex": _b("Interpret the query as a regular expression."),
                            "max_results": _i("Maximum number of matches.", minimum=1, maximum=200, default=20),
                        },
                        description="Search options.",
                    ),
                    "languages": _arr(
                        _s("Language.", enum=["python", "go", "typescript", "rust", "sql", "yaml"]),
                        "Restrict to these languages.",
                    ),
                },
                ["query"],
            ),
        ),
        _tool(
            "read_file",
            "Read a text file from the workspace, optionally a line range.",
            _obj(
                {
                    "path": _s("Path relative to the repository root."),
                    "range": range_obj,
                    "encoding": _s("Text encoding.", enum=["utf-8", "latin-1"], default="utf-8"),
                },
                ["path"],
            ),
        ),
        _tool(
            "edit_file",
            "Apply exact text replacements to a file. Each edit replaces one occurrence of "
            "old_text with new_text; fails if old_text is not found.",
            _obj(
                {
                    "path": _s("File to edit."),
                    "edits": _arr(
                        _obj(
                            {
                                "old_text": _s("Exact text to replace, including indentation."),
                                "new_text": _s("Replacement text."),
                                "occurrence": _i("Which occurrence (1-based) if several match.", minimum=1, default=1),
                            },
                            ["old_text", "new_text"],
                        ),
                        "Edits, applied in order.",
                        minItems=1,
                    ),
                    "create_if_missing": _b("Create the file if it does not exist."),
                    "dry_run": _b("Only report what would change."),
                },
                ["path", "edits"],
            ),
        ),
        _tool(
            "run_shell",
            "Run a shell command in the sandbox and return its exit code and output.",
            _obj(
                {
                    "command": _s("The command line, run with bash -lc."),
                    "cwd": _s("Working directory."),
                    "env": _obj(
                        {}, description="Extra environment variables.", additionalProperties={"type": "string"}
                    ),
                    "timeout_seconds": _i("Kill the command after this many seconds.", minimum=1, maximum=3600),
                    "capture": _obj(
                        {
                            "stdout": _b("Capture stdout.", True),
                            "stderr": _b("Capture stderr.", True),
                            "max_bytes": _i("Truncate each stream to this size.", default=65536),
                        },
                        description="Output capture settings.",
                    ),
                },
                ["command"],
            ),
        ),
        _tool(
            "run_tests",
            "Run the test suite or a subset of it and report failures with tracebacks.",
            _obj(
                {
                    "targets": _arr(_s("A test file, directory or node id."), "What to run; empty for all."),
                    "markers": _s("A pytest marker expression such as 'not slow'."),
                    "parallelism": _obj(
                        {
                            "workers": _i("Number of worker processes.", minimum=1, maximum=32),
                            "strategy": _s("How tests are distributed.", enum=["load", "loadfile", "loadgroup", "no"]),
                        },
                        description="Parallel execution.",
                    ),
                    "coverage": _obj(
                        {
                            "enabled": _b("Collect coverage."),
                            "fail_under": {"type": "number", "description": "Minimum total coverage %."},
                            "include": _arr(_s("A path pattern."), "Only measure these files."),
                        },
                        description="Coverage settings.",
                    ),
                }
            ),
        ),
        _tool(
            "git_status",
            "Show the working tree status.",
            _obj(
                {
                    "include_untracked": _b("List untracked files too.", True),
                    "paths": _arr(_s("A path."), "Limit to these paths."),
                }
            ),
        ),
        _tool(
            "git_diff",
            "Show changes between commits, the index and the working tree.",
            _obj(
                {
                    "base": _s("Base revision; defaults to the index."),
                    "head": _s("Head revision."),
                    "paths": _arr(_s("A path."), "Limit to these paths."),
                    "context_lines": _i("Lines of context.", minimum=0, default=3),
                    "stat_only": _b("Only print a diffstat."),
                }
            ),
        ),
        _tool(
            "git_commit",
            "Create a commit with the staged changes (or the given paths).",
            _obj(
                {
                    "message": _obj(
                        {
                            "subject": _s("One line, imperative mood, at most 72 characters."),
                            "body": _s("Wrapped explanation of what and why."),
                            "trailers": _arr(
                                _obj(
                                    {"key": _s("Trailer key, e.g. 'Refs'."), "value": _s("Trailer value.")},
                                    ["key", "value"],
                                ),
                                "Git trailers.",
                            ),
                        },
                        ["subject"],
                        "The commit message.",
                    ),
                    "paths": _arr(_s("A path."), "Stage these paths first."),
                    "amend": _b("Amend the previous commit."),
                    "sign_off": _b("Add a Signed-off-by trailer."),
                },
                ["message"],
            ),
        ),
        _tool(
            "create_pull_request",
            "Open a pull request from a branch.",
            _obj(
                {
                    "title": _s("Title."),
                    "body": _s("Markdown description."),
                    "base": _s("Target branch.", default="main"),
                    "head": _s("Source branch."),
                    "reviewers": _arr(_s("A username or team slug."), "Requested reviewers."),
                    "labels": _arr(_s("A label."), "Labels to add."),
                    "draft": _b("Open as a draft."),
                    "metadata": _obj(
                        {
                            "linked_issues": _arr(
                                _obj({"repo": _s("owner/name"), "number": _i("Issue number.", minimum=1)}, ["number"]),
                                "Issues this closes.",
                            ),
                            "milestone": _s("Milestone title."),
                        },
                        description="Extra metadata.",
                    ),
                },
                ["title", "head"],
            ),
        ),
        _tool(
            "query_metrics",
            "Run a PromQL query against the metrics backend.",
            _obj(
                {
                    "query": _s("The PromQL expression."),
                    "range": _obj(
                        {
                            "start": _s("RFC 3339 start time.", format="date-time"),
                            "end": _s("RFC 3339 end time.", format="date-time"),
                            "step": _s("Resolution, e.g. '30s'."),
                        },
                        ["start", "end"],
                        "Time range.",
                    ),
                    "aggregation": _obj(
                        {
                            "op": _s("Aggregation.", enum=["sum", "avg", "max", "min", "p99"]),
                            "by": _arr(_s("A label."), "Group by these labels."),
                        },
                        description="Optional extra aggregation.",
                    ),
                    "output": _s("Result format.", enum=["table", "series", "summary"], default="summary"),
                },
                ["query"],
            ),
        ),
        _tool(
            "fetch_url",
            "Fetch a URL over HTTP(S) and return status, headers and (truncated) body.",
            _obj(
                {
                    "url": _s("Absolute URL.", format="uri"),
                    "method": _s("HTTP method.", enum=["GET", "POST", "PUT", "DELETE", "HEAD"], default="GET"),
                    "headers": _obj({}, description="Request headers.", additionalProperties={"type": "string"}),
                    "body": _s("Request body."),
                    "follow_redirects": _b("Follow redirects.", True),
                    "timeout": {"type": "number", "description": "Timeout in seconds.", "default": 30},
                },
                ["url"],
            ),
        ),
        _tool(
            "query_database",
            "Run a read-only SQL query on an analytics replica.",
            _obj(
                {
                    "sql": _s("The SQL statement, with :name placeholders."),
                    "params": _arr(
                        _obj(
                            {
                                "name": _s("Placeholder name."),
                                "type": _s("Type.", enum=["string", "int", "float", "bool", "timestamp"]),
                                "value": {"description": "The value.", "type": ["string", "number", "boolean", "null"]},
                            },
                            ["name", "value"],
                        ),
                        "Bound parameters.",
                    ),
                    "database": _s("Database name.", enum=["orders", "billing", "events", "users"]),
                    "read_only": _b("Refuse statements that write.", True),
                    "limits": _obj(
                        {
                            "max_rows": _i("Row limit.", default=1000),
                            "timeout_ms": _i("Statement timeout.", default=15000),
                        },
                        description="Resource limits.",
                    ),
                },
                ["sql", "database"],
            ),
        ),
        _tool(
            "create_ticket",
            "Create an issue in the tracker.",
            _obj(
                {
                    "project": _s("Project key, e.g. 'PAY'."),
                    "title": _s("Summary line."),
                    "description": _s("Markdown body."),
                    "priority": _s("Priority.", enum=["P0", "P1", "P2", "P3"], default="P2"),
                    "assignee": _s("Username."),
                    "components": _arr(_s("A component."), "Components."),
                    "custom_fields": _obj(
                        {
                            "sprint": _s("Sprint name."),
                            "story_points": {"type": "number", "description": "Estimate."},
                            "links": _arr(
                                _obj(
                                    {
                                        "type": _s("Link type.", enum=["blocks", "relates", "duplicates"]),
                                        "target": _s("Issue key."),
                                    },
                                    ["type", "target"],
                                ),
                                "Links to other issues.",
                            ),
                        },
                        description="Project-specific fields.",
                    ),
                },
                ["project", "title"],
            ),
        ),
        _tool(
            "send_message",
            "Post a message to a chat channel or thread.",
            _obj(
                {
                    "channel": _s("Channel name or id."),
                    "text": _s("Message text (markdown)."),
                    "thread_ts": _s("Reply in this thread."),
                    "attachments": _arr(
                        _obj(
                            {
                                "title": _s("Title."),
                                "fields": _arr(
                                    _obj(
                                        {
                                            "name": _s("Name."),
                                            "value": _s("Value."),
                                            "short": _b("Render side by side."),
                                        },
                                        ["name", "value"],
                                    ),
                                    "Fields.",
                                ),
                            }
                        ),
                        "Rich attachments.",
                    ),
                    "mentions": _arr(_s("A username."), "Users to notify."),
                },
                ["channel", "text"],
            ),
        ),
        _tool(
            "list_directory",
            "List files and folders under a path.",
            _obj(
                {
                    "path": _s("Directory, relative to the repository root.", default="."),
                    "depth": _i("How many levels to descend.", minimum=1, maximum=8, default=2),
                    "include_hidden": _b("Include dotfiles."),
                    "filters": _obj(
                        {
                            "extensions": _arr(_s("An extension without the dot."), "Keep these."),
                            "min_size": _i("Minimum size in bytes.", minimum=0),
                            "modified_after": _s("Only files modified after this time.", format="date-time"),
                        },
                        description="Filters.",
                    ),
                }
            ),
        ),
    ]


def agent_conversation(seed: int) -> dict[str, Any]:
    """A coding-agent session: ~10 assistant turns with tool calls (one parallel), tool results."""
    w = Writer(seed)
    rng = w.rng
    call_count = 0

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        nonlocal call_count
        call_count += 1
        return {
            "id": f"call_{rng.getrandbits(64):016x}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }

    def assistant(content: str, *calls: dict[str, Any], reasoning: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning"] = reasoning
        if calls:
            message["tool_calls"] = list(calls)
        return message

    def tool(message: dict[str, Any], content: str, index: int = 0) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": message["tool_calls"][index]["id"], "content": content}

    module = f"src/{_plural(rng.choice(_NOUNS))}/{w.ident(1)}.py"
    func = w.ident(2)
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are an autonomous software engineering agent working in a git "
            "repository. Use the tools to inspect code, run tests and make minimal, "
            "well-tested changes. Never push to main directly; open a pull request. " + w.paragraph((3, 4)),
        },
        {
            "role": "user",
            "content": f"The `{func}` path in `{module}` started failing in staging after "
            f"yesterday's deploy. {w.paragraph((2, 4))} Please find the cause, fix it, "
            "add a regression test and open a PR.",
        },
    ]
    m = assistant(
        "I'll start by locating the function and its callers.",
        call(
            "search_code",
            {
                "query": func,
                "path_globs": ["src/**/*.py", "tests/**/*.py"],
                "options": {"case_sensitive": True, "max_results": 20},
            },
        ),
        reasoning=w.paragraph((2, 3)),
    )
    messages += [m, tool(m, w.json_blob(rng.randint(6, 9)))]
    m = assistant("", call("read_file", {"path": module, "range": {"start_line": 1, "end_line": -1}}))
    messages += [m, tool(m, w.module(rng.randint(4, 5)))]
    m = assistant(
        "Let me reproduce the failure with the existing tests first.",
        call(
            "run_tests",
            {
                "targets": [f"tests/test_{w.ident(1)}.py"],
                "markers": "not slow",
                "parallelism": {"workers": 2, "strategy": "load"},
            },
        ),
    )
    messages += [
        m,
        tool(
            m,
            "============ FAILURES ============\n"
            + w.traceback()
            + "\n"
            + w.log(8)
            + f"\n=== 1 failed, {rng.randint(20, 90)} passed in {rng.randint(2, 40)}.{rng.randint(10, 99)}s ===",
        ),
    ]
    m = assistant(
        "The failure points at a timeout in the retry loop. I'll check the caller and the latency "
        "metrics around the deploy in parallel.",
        call(
            "read_file",
            {
                "path": f"src/{_plural(rng.choice(_NOUNS))}/{w.ident(1)}.py",
                "range": {"start_line": rng.randint(1, 100), "end_line": rng.randint(150, 300)},
            },
        ),
        call(
            "query_metrics",
            {
                "query": f"histogram_quantile(0.99, sum by (le) (rate({w.ident(2)}_seconds_bucket[5m])))",
                "range": {"start": "2026-03-13T08:00:00Z", "end": "2026-03-14T10:00:00Z", "step": "5m"},
                "aggregation": {"op": "max", "by": ["region"]},
            },
        ),
        reasoning=w.paragraph((2, 4)),
    )
    messages += [
        m,
        tool(m, "\n\n".join(w.function() for _ in range(2)), 0),
        tool(
            m,
            json.dumps(
                {
                    "series": [
                        {"region": r, "p99_ms": [rng.randint(20, 900) for _ in range(12)]}
                        for r in ("us-east-1", "eu-west-1", "ap-south-1")
                    ]
                }
            ),
            1,
        ),
    ]
    m = assistant(
        "",
        call(
            "edit_file",
            {
                "path": module,
                "edits": [
                    {
                        "old_text": f"    for {rng.choice(_NOUNS)} in {rng.choice(_NOUNS)}s:\n        retry(timeout=30.0)",
                        "new_text": "    deadline = time.monotonic() + budget\n    for attempt in range(max_attempts):\n"
                        "        if time.monotonic() > deadline:\n            break\n        retry(timeout=min(30.0, budget))",
                    },
                    {"old_text": "import logging\n", "new_text": "import logging\nimport time\n"},
                ],
            },
        ),
        reasoning=w.paragraph((2, 3)),
    )
    messages += [m, tool(m, json.dumps({"ok": True, "path": module, "applied": 2, "diff_lines": 9}))]
    m = assistant(
        "",
        call(
            "edit_file",
            {
                "path": f"tests/test_{w.ident(1)}.py",
                "create_if_missing": True,
                "edits": [{"old_text": "", "new_text": w.function()}],
            },
        ),
    )
    messages += [m, tool(m, json.dumps({"ok": True, "applied": 1, "created": True}))]
    m = assistant(
        "", call("run_tests", {"targets": [], "coverage": {"enabled": True, "fail_under": 85, "include": ["src/*"]}})
    )
    messages += [m, tool(m, w.log(5) + f"\n=== {rng.randint(200, 400)} passed in {rng.randint(20, 90)}.2s ===")]
    messages.append(assistant(f"The fix is in place. {w.paragraph((3, 5))}\n\n{w.bullets(4)}"))
    messages.append(
        {
            "role": "user",
            "content": f"Looks good. {w.sentence()} Commit it and open the PR, and "
            "post a short note in #payments-oncall.",
        }
    )
    m = assistant(
        "",
        call(
            "git_commit",
            {
                "message": {
                    "subject": f"Bound retries in {func} by a deadline",
                    "body": w.paragraph((2, 3)),
                    "trailers": [{"key": "Refs", "value": f"PAY-{rng.randint(100, 9999)}"}],
                },
                "paths": [module],
            },
        ),
    )
    messages += [m, tool(m, json.dumps({"ok": True, "commit": f"{rng.getrandbits(40):010x}"}))]
    m = assistant(
        "",
        call(
            "create_pull_request",
            {
                "title": f"Bound retries in {func}",
                "body": w.paragraph(),
                "head": f"fix/{func}",
                "reviewers": ["payments-team"],
                "labels": ["bug", "staging"],
                "metadata": {"linked_issues": [{"number": rng.randint(100, 999)}]},
            },
        ),
        call(
            "send_message",
            {
                "channel": "#payments-oncall",
                "text": w.sentence(),
                "attachments": [{"title": "PR", "fields": [{"name": "risk", "value": "low", "short": True}]}],
            },
        ),
    )
    messages += [
        m,
        tool(m, json.dumps({"number": rng.randint(1000, 9999), "url": "https://git.example/pr"}), 0),
        tool(m, json.dumps({"ok": True, "ts": f"{rng.randint(10**9, 2 * 10**9)}.000100"}), 1),
    ]
    return _chat(messages, tools=agent_tools())


@dataclass
class Scenario:
    name: str
    description: str
    build: Callable[[int], dict[str, Any]]
    sequential: int  # default request counts
    concurrent: int


SCENARIOS: dict[str, Scenario] = {
    "short": Scenario("short", "short chat (~300 tokens)", short_chat, 200, 400),
    "long9k": Scenario("long9k", "~9k-token chat, several turns", long_chat, 60, 120),
    "agent": Scenario("agent", "agent: ~10 turns with tool calls, 15 tools", agent_conversation, 100, 200),
}


@dataclass
class Workload:
    """One scenario's payload variants, serialized once (the load loop only sends bytes)."""

    scenario: Scenario
    payloads: list[dict[str, Any]]
    bodies: list[bytes]
    token_ids: list[list[int]] = field(default_factory=list)  # filled by verification


def build_workload(scenario: Scenario, seed: int, variants: int) -> Workload:
    payloads = [scenario.build(seed * 1000 + i) for i in range(variants)]
    return Workload(scenario, payloads, [orjson.dumps(p) for p in payloads])


# =============================================================================================
# Verification: both targets must return the same token_ids for every payload.
# =============================================================================================


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


async def verify(
    clients: dict[str, httpx.AsyncClient],
    workloads: list[Workload],
    report_only: Sequence[str] = tuple(FLOOR_SERVERS.values()),
) -> tuple[list[str], dict[str, list[str]]]:
    """Fills Workload.token_ids; raises SystemExit if the targets disagree.

    Returns warnings (other differing fields) and, for the `report_only` targets (the floor server,
    which does no parity work), the payloads whose token_ids differ from the reference's: reported,
    not fatal.
    """
    warnings: list[str] = []
    mismatches: dict[str, list[str]] = {name: [] for name in clients if name in report_only}
    for workload in workloads:
        for index, body in enumerate(workload.bodies):
            answers: dict[str, dict[str, Any]] = {}
            for name, client in clients.items():
                response = await client.post(RENDER_PATH, content=body, headers=HEADERS)
                if response.status_code != 200:
                    raise SystemExit(
                        f"{name} answered {response.status_code} on {workload.scenario.name}[{index}]: "
                        f"{response.text[:500]}"
                    )
                answers[name] = orjson.loads(response.content)
            first, reference = next((n, a) for n, a in answers.items() if n not in report_only)
            for name, answer in answers.items():
                if name == first:
                    continue
                a, b = reference["token_ids"], answer["token_ids"]
                if name in report_only:
                    if a != b:
                        mismatches[name].append(
                            f"{workload.scenario.name}[{index}] ({len(a)} vs {len(b)} tokens, "
                            f"first difference at {_first_difference(a, b)})"
                        )
                    continue
                if a != b:
                    raise SystemExit(
                        f"ABORT: {first} and {name} disagree on token_ids for "
                        f"{workload.scenario.name}[{index}] ({len(a)} vs {len(b)} tokens, first "
                        f"difference at {_first_difference(a, b)}): the benchmark would not compare "
                        "the same work"
                    )
                differing = sorted(
                    k for k in set(reference) | set(answer) if k != "request_id" and reference.get(k) != answer.get(k)
                )
                if differing:
                    warnings.append(f"{workload.scenario.name}[{index}]: {first} and {name} differ in {differing}")
            workload.token_ids.append(reference["token_ids"])
    return warnings, mismatches


# =============================================================================================
# Load generation.
# =============================================================================================


@dataclass
class RunResult:
    target: str
    mode: str
    concurrency: int
    requests: int
    wall_s: float
    req_per_s: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    server_cpu_ms_per_req: float | None  # schedstat (ns) of the server's live threads
    client_cpu_ms_per_req: float
    server_cpu_ticks_ms_per_req: float | None = None  # utime+stime+cutime+cstime (10 ms ticks), cross-check
    round_cpu_ms: list[float | None] = field(default_factory=list)  # server CPU ms/req of each round


def merge_rounds(parts: list[RunResult], latencies: list[float]) -> RunResult:
    """One result from the interleaved rounds of one target: totals, and percentiles over all requests."""
    first = parts[0]
    requests = sum(p.requests for p in parts)
    wall = sum(p.wall_s for p in parts)

    def total(attr: str) -> float | None:
        values = [getattr(p, attr) for p in parts]
        return (
            None
            if any(v is None for v in values)
            else sum(v * p.requests for v, p in zip(values, parts, strict=True)) / requests
        )

    return RunResult(
        first.target,
        first.mode,
        first.concurrency,
        requests,
        wall,
        requests / wall,
        percentile(latencies, 50) * 1000,
        percentile(latencies, 99) * 1000,
        sum(latencies) / len(latencies) * 1000,
        total("server_cpu_ms_per_req"),
        total("client_cpu_ms_per_req") or 0.0,
        total("server_cpu_ticks_ms_per_req"),
        [p.server_cpu_ms_per_req for p in parts],
    )


async def run_load(
    client: httpx.AsyncClient,
    server: Server,
    bodies: Sequence[bytes],
    requests: int,
    concurrency: int,
    mode: str,
    latencies_out: list[float] | None = None,
    offset: int = 0,
) -> RunResult:
    latencies = [0.0] * requests
    next_index = 0
    failure: list[str] = []

    async def worker() -> None:
        nonlocal next_index
        perf = time.perf_counter
        count = len(bodies)
        while next_index < requests and not failure:
            index = next_index
            next_index += 1
            started = perf()
            response = await client.post(RENDER_PATH, content=bodies[(offset + index) % count], headers=HEADERS)
            latencies[index] = perf() - started
            if response.status_code != 200:
                failure.append(f"{server.name}: HTTP {response.status_code}: {response.text[:300]}")

    ticks_before, cpu_before = server.cpu_seconds(), server.cpu_seconds_precise()
    client_before = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    cpu_after, ticks_after = server.cpu_seconds_precise(), server.cpu_seconds()
    if failure:
        raise SystemExit(f"ABORT during the timed run: {failure[0]}")
    if latencies_out is not None:
        latencies_out.extend(latencies)

    def per_request(before: float | None, after: float | None) -> float | None:
        return None if before is None or after is None else (after - before) / requests * 1000

    return RunResult(
        server.name,
        mode,
        concurrency,
        requests,
        wall,
        requests / wall,
        percentile(latencies, 50) * 1000,
        percentile(latencies, 99) * 1000,
        sum(latencies) / requests * 1000,
        per_request(cpu_before, cpu_after),
        client_cpu / requests * 1000,
        per_request(ticks_before, ticks_after),
    )


async def warm_up(
    client: httpx.AsyncClient, server: Server, bodies: Sequence[bytes], requests: int, concurrency: int
) -> None:
    if requests > 0:
        await run_load(client, server, bodies, max(requests, len(bodies)), concurrency, "warmup")


# =============================================================================================
# In-process floor: template render (transformers, jinja2) + encode, in this process.
# =============================================================================================


@dataclass
class Floor:
    render_ms: float
    encode_ms: dict[str, float]  # warm (texts seen before, as the servers see them), identical backends only
    cold_encode_ms: dict[str, float]  # first encode of each text by a fresh tokenizer object
    mismatched: list[str]  # backends whose ids differ from the servers'
    best_backend: str | None
    floor_ms: float | None


def _template_conversation(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Messages as the render tier hands them to the template: tool-call arguments as objects."""
    out = []
    for message in payload["messages"]:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def _time_per_call(function: Callable[[int], object], calls_per_round: int, min_seconds: float) -> float:
    """CPU ms per call (time.process_time), over at least `min_seconds` of CPU and 3 rounds."""
    rounds = 0
    spent = 0.0
    while rounds < 3 or spent < min_seconds:
        started = time.process_time()
        for i in range(calls_per_round):
            function(i)
        spent += time.process_time() - started
        rounds += 1
    return spent / (rounds * calls_per_round) * 1000


class FloorKit:
    """The tokenizer objects of the in-process floor, loaded once."""

    def __init__(self, model_dir: str) -> None:
        import transformers

        transformers.logging.set_verbosity_error()
        self.hf = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer_json = str(Path(model_dir) / "tokenizer.json")
        self.encoders = {name: factory() for name, factory in self._factories().items()}

    def _factories(self) -> dict[str, Callable[[], Any]]:
        import fastokens
        import tokenizers

        path = self.tokenizer_json

        def cached() -> Any:
            tokenizer = fastokens.Tokenizer.from_file(path)
            tokenizer.enable_segment_cache(64 << 20)  # as render-service configures it
            return tokenizer

        return {
            "hf-tokenizers": lambda: tokenizers.Tokenizer.from_file(path),
            "fastokens": lambda: fastokens.Tokenizer.from_file(path),
            "fastokens+segment-cache": cached,
        }

    def measure(self, workload: Workload, min_seconds: float) -> Floor:
        conversations = [_template_conversation(p) for p in workload.payloads]
        tools = [p.get("tools") for p in workload.payloads]
        hf = self.hf

        def render(i: int) -> str:
            return hf.apply_chat_template(conversations[i], tools=tools[i], tokenize=False, add_generation_prompt=True)

        texts = [render(i) for i in range(len(conversations))]  # also compiles and caches the template
        render_ms = _time_per_call(render, len(texts), min_seconds)
        encode_ms: dict[str, float] = {}
        cold_ms: dict[str, float] = {}
        mismatched: list[str] = []
        factories = self._factories()
        for name, encoder in self.encoders.items():
            if any(
                encoder.encode(text, add_special_tokens=False).ids != ids
                for text, ids in zip(texts, workload.token_ids, strict=True)
            ):
                mismatched.append(name)
                continue
            encode_ms[name] = _time_per_call(
                lambda i, e=encoder: e.encode(texts[i], add_special_tokens=False), len(texts), min_seconds
            )
            fresh = factories[name]()
            fresh.encode("warm-up: initialise lazily built state", add_special_tokens=False)
            started = time.process_time()
            for text in texts:
                fresh.encode(text, add_special_tokens=False)
            cold_ms[name] = (time.process_time() - started) / len(texts) * 1000
        best = min(encode_ms, key=encode_ms.__getitem__) if encode_ms else None
        return Floor(
            render_ms, encode_ms, cold_ms, mismatched, best, None if best is None else render_ms + encode_ms[best]
        )


# =============================================================================================
# Reporting.
# =============================================================================================


def issue_targets(report: dict[str, Any]) -> list[str]:
    """Issue 2's goals on the ~9k-token chat: ours <= vLLM/10 and <= 1.5x the floor servers, CPU per request."""
    scenario = report["scenarios"].get("long9k")
    if not scenario:
        return []
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in scenario["results"]):
        cpu = {r["target"]: r["server_cpu_ms_per_req"] for r in scenario["results"] if r["mode"] == mode}
        rounds = {r["target"]: r["round_cpu_ms"] for r in scenario["results"] if r["mode"] == mode}
        ours = cpu.get("ours")
        goals = [("vLLM", 10.0, "vLLM/ours >= 10x")] + [(f, 1.5, f"ours/{f} <= 1.5x") for f in FLOOR_SERVERS.values()]
        for other, goal, label in goals:
            value = ratio(cpu.get("vLLM"), ours) if other == "vLLM" else ratio(ours, cpu.get(other))
            if value is None:
                continue
            passed = value >= goal if other == "vLLM" else value <= goal
            pairs = list(zip(rounds.get("ours") or [], rounds.get(other) or [], strict=False))
            per_round = sorted(
                v
                for v in ((b / a if other == "vLLM" else a / b) if a and b else None for a, b in pairs)
                if v is not None
            )
            spread = (
                (f"  (per round: {per_round[0]:.2f}-{per_round[-1]:.2f}x, median {percentile(per_round, 50):.2f}x)")
                if per_round
                else ""
            )
            lines.append(f"long9k {mode:<9} {label:<22} {value:6.2f}x  {'PASS' if passed else 'FAIL'}{spread}")
    return lines


TABLE_HEADERS = ("target", "mode", "req/s", "p50 ms", "p99 ms", "server CPU ms/req", "(ticks)", "client CPU ms/req")


def _row(result: RunResult) -> list[str]:
    return [
        result.target,
        result.mode,
        fmt(result.req_per_s, 1),
        fmt(result.p50_ms),
        fmt(result.p99_ms),
        fmt(result.server_cpu_ms_per_req, 3),
        fmt(result.server_cpu_ticks_ms_per_req, 2),
        fmt(result.client_cpu_ms_per_req, 3),
    ]


def _ratio_row(label: str, mode: str, num: RunResult, den: RunResult) -> list[str]:
    def r(a: float | None, b: float | None) -> str:
        value = ratio(a, b)
        return "-" if value is None else f"{value:.2f}x"

    return [
        label,
        mode,
        r(num.req_per_s, den.req_per_s),
        r(num.p50_ms, den.p50_ms),
        r(num.p99_ms, den.p99_ms),
        r(num.server_cpu_ms_per_req, den.server_cpu_ms_per_req),
        "",
        "",
    ]


def scenario_table(workload: Workload, results: list[RunResult], floor: Floor | None) -> str:
    lengths = [len(ids) for ids in workload.token_ids]
    sizes = [len(b) for b in workload.bodies]
    title = (
        f"== {workload.scenario.name}: {workload.scenario.description}; {len(workload.bodies)} variants, "
        f"{min(lengths)}-{max(lengths)} prompt tokens, bodies {min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KiB =="
    )
    rows: list[list[str]] = []
    modes = list(dict.fromkeys(r.mode for r in results))
    for mode in modes:
        by_target = {r.target: r for r in results if r.mode == mode}
        rows += [_row(r) for r in by_target.values()]
        if "ours" in by_target and "vLLM" in by_target:
            rows.append(_ratio_row("vLLM/ours", mode, by_target["vLLM"], by_target["ours"]))
        for floor_server in FLOOR_SERVERS.values():
            if "ours" in by_target and floor_server in by_target:
                rows.append(_ratio_row(f"ours/{floor_server}", mode, by_target["ours"], by_target[floor_server]))
        rows.append([])
    if floor is not None:
        rows.append(["floor", "in-process", "", "", "", fmt(floor.floor_ms, 3), "", ""])
        for mode in modes:
            ours = next((r for r in results if r.mode == mode and r.target == "ours"), None)
            value = ratio(ours.server_cpu_ms_per_req if ours else None, floor.floor_ms)
            rows.append(["ours/floor", mode, "", "", "", "-" if value is None else f"{value:.2f}x", "", ""])
    while rows and not rows[-1]:
        rows.pop()
    text = format_table(TABLE_HEADERS, rows, title)
    if floor is not None:
        encodes = ", ".join(f"{k} {v:.3f} (cold {floor.cold_encode_ms[k]:.3f})" for k, v in floor.encode_ms.items())
        text += (
            f"\nfloor = template render {floor.render_ms:.3f} ms + encode ({floor.best_backend}) "
            f"{floor.encode_ms.get(floor.best_backend or '', float('nan')):.3f} ms CPU/req\n"
            f"floor encode ms/req by backend, warm (cold = first sight of each text): {encodes}"
        )
        if floor.mismatched:
            text += f"\nfloor: ids differ from the servers' with {', '.join(floor.mismatched)} (excluded)"
    return text


def memory_table(memory: dict[str, Memory | None]) -> str:
    rows = [
        [
            name,
            fmt(m.processes if m else None),
            fmt_bytes(m.rss_bytes if m else None),
            fmt_bytes(m.pss_bytes if m else None),
        ]
        for name, m in memory.items()
    ]
    ours, vllm = memory.get("ours"), memory.get("vLLM")
    if ours and vllm:
        rows.append(
            [
                "vLLM/ours",
                "",
                f"{vllm.rss_bytes / ours.rss_bytes:.2f}x",
                "-" if not (ours.pss_bytes and vllm.pss_bytes) else f"{vllm.pss_bytes / ours.pss_bytes:.2f}x",
            ]
        )
    return format_table(
        ("target", "processes", "RSS (tree sum)", "PSS (tree sum)"), rows, "== server memory after the run =="
    )


# =============================================================================================
# Main.
# =============================================================================================


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="model folder (default: the tiny Qwen3 example model, built into a temp folder)"
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of: " + ", ".join(SCENARIOS)
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="sequential requests per scenario (default per scenario: short 200, long9k 60, agent "
        "100); concurrent runs send twice as many unless --concurrent-requests is given",
    )
    parser.add_argument(
        "--concurrent-requests",
        type=int,
        default=None,
        help="requests per concurrent run (default per scenario: short 400, long9k 120, agent 200)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="in-flight requests in the concurrent mode")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="split each timed run into this many rounds, interleaved across the targets",
    )
    parser.add_argument("--warmup", type=int, default=20, help="warm-up requests per target, scenario and mode")
    parser.add_argument(
        "--variants", type=int, default=8, help="distinct payloads per scenario (requests cycle through them)"
    )
    parser.add_argument("--seed", type=int, default=0, help="payload generator seed")
    parser.add_argument("--skip-vllm", action="store_true", help="benchmark render-service only")
    parser.add_argument("--skip-floor", action="store_true", help="do not measure the in-process floor")
    parser.add_argument(
        "--floor-engines",
        default="jinja2,minijinja",
        help="floor servers to start (benchmarks/floor_server.py), by template engine: comma-separated "
        "subset of jinja2, minijinja; '' for none (default: %(default)s)",
    )
    parser.add_argument("--floor-seconds", type=float, default=1.0, help="min CPU seconds per floor measurement")
    parser.add_argument("--ours-url", help="use a running render-service at this base URL")
    parser.add_argument("--ours-pid", type=int, help="its PID (for CPU and RSS)")
    parser.add_argument("--vllm-url", help="use a running `vllm launch render` at this base URL")
    parser.add_argument("--vllm-pid", type=int, help="its PID (for CPU and RSS)")
    parser.add_argument("--ours-port", type=int, default=0, help="port for the started render-service (0: free)")
    parser.add_argument("--vllm-port", type=int, default=0, help="port for the started vLLM (0: free)")
    parser.add_argument(
        "--server-args", default=DEFAULT_SERVER_ARGS, help="flags given to both started servers (default: %(default)s)"
    )
    parser.add_argument(
        "--oracle-python",
        default=DEFAULT_ORACLE_PYTHON,
        help="python of the vLLM 0.33 env whose render tier is measured (default: $VLLM_ORACLE_PYTHON)",
    )
    parser.add_argument("--json", dest="json_out", help="also write all results as JSON to this file")
    args = parser.parse_args(argv)
    args.model = example_model_dir(args.model)
    if args.floor_engines and any(e not in FLOOR_SERVERS for e in args.floor_engines.split(",")):
        parser.error(f"--floor-engines: choose from {list(FLOOR_SERVERS)}")
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    return args


def _flag(args: Sequence[str], name: str, default: str = "16384") -> str:
    return args[args.index(name) + 1] if name in args[:-1] else default


def _start_servers(args: argparse.Namespace, log_dir: Path) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    server_args = shlex.split(args.server_args)
    try:
        if args.ours_url:
            servers["ours"] = Server("ours", args.ours_url.rstrip("/"), args.ours_pid)
            wait_healthy(servers["ours"].url, 10)
        else:
            port = args.ours_port or free_port()
            print(f"starting render-service on port {port} ...", flush=True)
            servers["ours"] = start_render_service(
                args.model, port, [*server_args, "--workers", "1"], log=log_dir / f"ours-{port}.log"
            )
        if not args.skip_vllm:
            if args.vllm_url:
                servers["vLLM"] = Server("vLLM", args.vllm_url.rstrip("/"), args.vllm_pid)
                wait_healthy(servers["vLLM"].url, 10)
            else:
                port = args.vllm_port or free_port()
                print(f"starting vLLM render on port {port} ...", flush=True)
                servers["vLLM"] = start_vllm_render(args.model, port, server_args, python=args.oracle_python)
        for engine in args.floor_engines.split(",") if args.floor_engines else ():
            name = FLOOR_SERVERS[engine]
            port = free_port()
            print(f"starting the floor server ({engine}) on port {port} ...", flush=True)
            floor_args = [
                "--served-model-name",
                MODEL_NAME,
                "--engine",
                engine,
                "--max-model-len",
                _flag(server_args, "--max-model-len"),
            ]
            servers[name] = start_floor_server(
                args.model, port, floor_args, log=log_dir / f"{name}-{port}.log", name=name
            )
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    for server in servers.values():
        print(f"  {server.name}: {server.url} pid={server.pid}" + ("" if server.owned else " (not started by us)"))
    return servers


async def _benchmark(
    args: argparse.Namespace, servers: dict[str, Server], workloads: list[Workload], report: dict[str, Any]
) -> None:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)

    def new_client(url: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=url, http1=True, http2=False, limits=limits, trust_env=False, timeout=httpx.Timeout(300.0)
        )

    clients = {name: new_client(s.url) for name, s in servers.items()}
    try:
        warnings, mismatches = await verify(clients, workloads)
        checked = [n for n in servers if n not in mismatches]
        print(
            f"verified: identical token_ids from {' and '.join(checked)} for "
            f"{sum(len(w.bodies) for w in workloads)} payloads"
        )
        for name, bad in mismatches.items():
            if bad:
                print(
                    f"  WARNING: {name} token_ids differ from {checked[0]}'s on {len(bad)} payload(s): "
                    f"{'; '.join(bad[:5])} (its figures are not the same work there)"
                )
            else:
                print(f"  {name}: identical token_ids on every payload too")
        for warning in warnings[:5]:
            print(f"  note: {warning}")
        report["verification_notes"] = warnings
        report["floor_server_token_mismatches"] = mismatches

        floors: dict[str, Floor] = {}
        if not args.skip_floor:
            kit = FloorKit(args.model)
            for workload in workloads:
                floors[workload.scenario.name] = kit.measure(workload, args.floor_seconds)

        block = 0
        for workload in workloads:
            scenario = workload.scenario
            sequential = args.requests or scenario.sequential
            concurrent = args.concurrent_requests or (2 * args.requests if args.requests else scenario.concurrent)
            results: list[RunResult] = []
            for mode, concurrency, requests in (
                ("seq c=1", 1, sequential),
                (f"conc c={args.concurrency}", args.concurrency, concurrent),
            ):
                # Alternate which target goes first, so slow drift of the machine hits all alike.
                order = list(servers) if block % 2 == 0 else list(reversed(servers))
                block += 1
                for name in order:
                    await clients[name].aclose()
                    clients[name] = new_client(servers[name].url)
                    await warm_up(clients[name], servers[name], workload.bodies, args.warmup, concurrency)
                # The requests in --rounds interleaved rounds, rotating the order: a burst of load from
                # elsewhere on a shared machine then lands on every target instead of on one.
                rounds = max(1, min(args.rounds, requests // max(concurrency, len(workload.bodies))))
                parts: dict[str, list[RunResult]] = {name: [] for name in order}
                latencies: dict[str, list[float]] = {name: [] for name in order}
                for index in range(rounds):
                    count = requests // rounds + (1 if index < requests % rounds else 0)
                    for name in order[index % len(order) :] + order[: index % len(order)]:
                        # Fresh connections per round, opened before the timed part: a connection left
                        # idle longer than uvicorn's keep-alive timeout (5 s) while other targets ran can be
                        # closed under a request (httpx.ReadError).
                        await clients[name].aclose()
                        clients[name] = new_client(servers[name].url)
                        await run_load(
                            clients[name], servers[name], workload.bodies, concurrency, concurrency, "connect"
                        )
                        parts[name].append(
                            await run_load(
                                clients[name],
                                servers[name],
                                workload.bodies,
                                count,
                                concurrency,
                                mode,
                                latencies[name],
                                index,
                            )
                        )
                for name in order:
                    result = merge_rounds(parts[name], latencies[name])
                    results.append(result)
                    print(
                        f"  {scenario.name:<7} {mode:<9} {name:<9} {result.req_per_s:8.1f} req/s  "
                        f"p50 {result.p50_ms:7.2f} ms  cpu {fmt(result.server_cpu_ms_per_req, 3)} ms/req "
                        f"(rounds: {', '.join(fmt(c, 3) for c in result.round_cpu_ms)})",
                        flush=True,
                    )
            results.sort(key=lambda r: (r.mode != "seq c=1", r.target != "ours"))
            floor = floors.get(scenario.name)
            print("\n" + scenario_table(workload, results, floor) + "\n", flush=True)
            report["scenarios"][scenario.name] = {
                "description": scenario.description,
                "variants": len(workload.bodies),
                "prompt_tokens": [len(ids) for ids in workload.token_ids],
                "body_bytes": [len(b) for b in workload.bodies],
                "results": [asdict(r) for r in results],
                "floor": asdict(floor) if floor else None,
            }
    finally:
        for client in clients.values():
            await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    workloads = [build_workload(SCENARIOS[name], args.seed, args.variants) for name in args.scenarios.split(",")]
    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": os.getloadavg(),
        },
        "options": vars(args),
        "scenarios": {},
    }
    print(
        f"render bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; scenarios "
        f"{args.scenarios}; concurrency {args.concurrency}; {args.variants} payload variants each"
    )
    log_dir = Path(tempfile.mkdtemp(prefix="render-bench-"))
    servers = _start_servers(args, log_dir)
    try:
        report["servers"] = {
            n: {"url": s.url, "pid": s.pid, "started_by_bench": s.owned, **s.info} for n, s in servers.items()
        }
        try:
            import uvloop

            runner: Callable[..., Any] = uvloop.run
        except ImportError:
            runner = asyncio.run
        runner(_benchmark(args, servers, workloads, report))
        memory = {name: server.memory() for name, server in servers.items()}
        print(memory_table(memory))
        targets = issue_targets(report)
        if targets:
            print("\n== issue 2 targets (server CPU per request, ~9k-token chat) ==\n" + "\n".join(targets))
        report["issue_targets"] = targets
        report["memory"] = {name: asdict(m) if m else None for name, m in memory.items()}
    finally:
        for server in servers.values():
            server.stop()
    report["machine"]["loadavg_after"] = os.getloadavg()
    if args.json_out:
        Path(args.json_out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
