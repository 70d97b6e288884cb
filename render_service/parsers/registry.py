"""The one registry of parser families, under vLLM 0.33's names and aliases.

    @register_tool_parser("hermes", aliases=("qwen3_json",))
    class HermesToolParser(ToolParser): ...

Every module of the `render_service.parsers` package is imported the first time the registry
is asked anything, so adding a family is adding its module: nothing else lists it.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from render_service.parsers.protocols import ReasoningParser, ToolParser

R = TypeVar("R", bound=type[ReasoningParser])
T = TypeVar("T", bound=type[ToolParser])

_reasoning: dict[str, type[ReasoningParser]] = {}
_tool: dict[str, type[ToolParser]] = {}
_loaded = False
_lock = threading.Lock()


def _add(table: dict[str, Any], kind: str, names: tuple[str, ...], cls: type) -> None:
    for name in names:
        if table.get(name, cls) is not cls:
            raise ValueError(
                f"{kind} parser name {name!r} is registered twice ({table[name].__name__}, {cls.__name__})"
            )
    for name in names:
        table[name] = cls


def register_reasoning_parser(name: str, aliases: tuple[str, ...] = ()) -> Callable[[R], R]:
    """Register a reasoning parser class under vLLM's `--reasoning-parser` name(s)."""

    def decorator(cls: R) -> R:
        if not cls.name:
            cls.name = name
        _add(_reasoning, "reasoning", (name, *aliases), cls)
        return cls

    return decorator


def register_tool_parser(name: str, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register a tool parser class under vLLM's `--tool-call-parser` name(s)."""

    def decorator(cls: T) -> T:
        if not cls.name:
            cls.name = name
        _add(_tool, "tool", (name, *aliases), cls)
        return cls

    return decorator


def _load_families() -> None:
    """Import every module of this package once (the families register themselves)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        package = importlib.import_module(__package__ or "render_service.parsers")
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{module.name}")
        _loaded = True


def reasoning_parser_names() -> tuple[str, ...]:
    _load_families()
    return tuple(sorted(_reasoning))


def tool_parser_names() -> tuple[str, ...]:
    _load_families()
    return tuple(sorted(_tool))


def reasoning_parser_class(name: str) -> type[ReasoningParser]:
    _load_families()
    try:
        return _reasoning[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}") from None


def tool_parser_class(name: str) -> type[ToolParser]:
    _load_families()
    try:
        return _tool[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}") from None


class _View(Mapping[str, Any]):
    """A read-only name -> class view that loads the families on first use."""

    def __init__(self, table: dict[str, Any]) -> None:
        self._table = table

    def __getitem__(self, name: str) -> Any:
        _load_families()
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        _load_families()
        return iter(sorted(self._table))

    def __len__(self) -> int:
        _load_families()
        return len(self._table)


REASONING_PARSERS: Mapping[str, type[ReasoningParser]] = _View(_reasoning)
TOOL_PARSERS: Mapping[str, type[ToolParser]] = _View(_tool)
