"""LoRA adapters by name: vLLM 0.33's `--lora-modules` forms and the adapter set a replica serves.

A render tier holds no weights, and in vLLM 0.33 an adapter changes no token of a render or a
derender (no per-adapter tokenizer, template or context length). What an adapter is here: a name
clients put in `model`, the path `/v1/models` reports as the card's `root`, and a parent base
model. Render passes the name through as the `GenerateRequest`'s `model`, which is how vLLM's
engine picks the adapter (`_maybe_get_adapters`: `request.model in lora_requests`).

"Loading" an adapter therefore checks what can be checked without weights: the name (not empty,
not a base model's, not already loaded) and that the path holds an adapter
(`adapter_config.json`, a JSON object), so a typo fails here as it would on the engine.

With `VLLM_ALLOW_RUNTIME_LORA_UPDATING` the set changes at run time. Every worker process of a
replica must see the same set (a load lands on one worker; the next request on any), so the set
then lives in one JSON file that writers update under a lock and readers re-read when it changes.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from render_service.exceptions import BadRequestError, NotFoundError, RenderServiceError

RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
ADAPTER_CONFIG = "adapter_config.json"


def runtime_updating_allowed(environ: dict[str, str] | None = None) -> bool:
    """vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING: "1" or "true", any case."""
    value = (os.environ if environ is None else environ).get(RUNTIME_UPDATING_ENV, "0")
    return value.strip().lower() in ("1", "true")


# -- the flag ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry, with vLLM's field names (the JSON form's keys)."""

    name: str
    path: str
    base_model_name: str | None = None
    is_3d_lora_weight: bool = False


class LoRAModuleError(ValueError):
    """A `--lora-modules` entry vLLM's argument parser rejects (the message is vLLM's)."""


def parse_lora_modules(values: Iterable[str]) -> list[LoRAModulePath]:
    """vLLM's `LoRAParserAction`: `name=path` when the item has `=` and no `,`, else one JSON object
    with `name`, `path` and optionally `base_model_name` / `is_3d_lora_weight`; empty items skipped."""
    modules: list[LoRAModulePath] = []
    for item in values:
        if not item:
            continue
        if "=" in item and "," not in item:
            name, path = item.split("=", 1)
            modules.append(LoRAModulePath(name, path))
            continue
        try:
            fields = json.loads(item)
        except ValueError:
            raise LoRAModuleError(f"Invalid JSON format for --lora-modules: {item}") from None
        try:
            if not isinstance(fields, dict):
                raise TypeError(f"LoRAModulePath() argument after ** must be a mapping, not {type(fields).__name__}")
            modules.append(LoRAModulePath(**fields))
        except TypeError as exc:
            raise LoRAModuleError(f"Invalid fields for --lora-modules: {item} - {exc}") from None
    return modules


# -- one adapter ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """A served adapter: what `/v1/models` lists and the fingerprint covers."""

    name: str
    path: str
    parent: str  # the base model's served name
    created: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "parent": self.parent, "created": self.created}

    @staticmethod
    def from_json(value: dict[str, Any]) -> Adapter:
        return Adapter(str(value["name"]), str(value["path"]), str(value["parent"]), int(value["created"]))


def not_found_message(name: str, path: str) -> str:
    """vLLM's LoRAAdapterNotFoundError, answered with 404 by /v1/load_lora_adapter."""
    return f"Loading lora {name} failed: No adapter found for {path}"


def check_adapter_files(name: str, path: str) -> None:
    """The adapter exists where the engine will look: a local folder with adapter_config.json, or a
    Hugging Face repo id whose adapter_config.json is in the local HF cache (or downloadable, when
    the hub is reachable and HF_HUB_OFFLINE is unset). 404 (vLLM's message) when it is not there;
    400 when the file is there but is not a JSON object (vLLM would fail later, with a 500)."""
    config = _adapter_config_file(path)
    if config is None:
        raise NotFoundError(not_found_message(name, path))
    try:
        value = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadRequestError(f"Loading lora {name} failed: {config} is not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadRequestError(f"Loading lora {name} failed: {config} is not a JSON object")


def _adapter_config_file(path: str) -> Path | None:
    local = Path(path).expanduser()
    if local.exists():
        candidate = local / ADAPTER_CONFIG
        return candidate if candidate.is_file() else None
    if path.count("/") > 1 or path.startswith(("/", ".", "~")):
        return None  # a local path that does not exist, not a repo id
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - a dependency of transformers
        return None
    try:
        cached = try_to_load_from_cache(path, ADAPTER_CONFIG)
        if isinstance(cached, str):
            return Path(cached)
        if os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on"):
            return None
        return Path(hf_hub_download(path, ADAPTER_CONFIG))
    except (HFValidationError, OSError, ValueError):
        return None
    except Exception:  # the hub's HTTP errors (not found, gated, unreachable): no adapter
        return None


# -- the set ------------------------------------------------------------------------------------


class AdapterRegistry:
    """The adapters one replica serves, by name.

    Static (only `--lora-modules`): a dict built at start. Shared (runtime updating allowed): the
    same dict backed by a JSON file that every worker of the replica reads; `current()` re-reads it
    when another worker changed it (one `stat` per call), and `load`/`unload` change it under an
    exclusive lock, so the name checks and the write are atomic across workers.
    """

    def __init__(self, base_names: Sequence[str], state_file: Path | None = None) -> None:
        self.base_names = tuple(base_names)
        self.state_file = state_file
        self._adapters: dict[str, Adapter] = {}
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) of the file read
        self.generation = 0  # bumped on every change this process makes or sees
        self._owns_folder = False  # `start` made the shared file's folder (removed by `close`)

    # construction

    @classmethod
    def start(
        cls,
        base_names: Sequence[str],
        modules: Sequence[LoRAModulePath],
        *,
        shared: bool,
        directory: Path | None = None,
    ) -> AdapterRegistry:
        """The registry at start-up, with `--lora-modules` loaded (checked as a runtime load is;
        the first failure raises, as vLLM's `init_static_loras` fails the server)."""
        state_file = None
        if shared:
            state_file = Path(tempfile.mkdtemp(prefix="render-lora-")) / "adapters.json"
        registry = cls(base_names, state_file)
        registry._owns_folder = shared
        registry._write({})
        for module in modules:
            registry.load(module.name, module.path, base_model_name=module.base_model_name)
        return registry

    # reading

    def current(self) -> dict[str, Adapter]:
        """Name -> adapter, as of now (another worker's load or unload included)."""
        if self.state_file is not None:
            self._refresh()
        return self._adapters

    def current_generation(self) -> int:
        """A number that changes whenever the set does (cheap: what callers poll per request)."""
        if self.state_file is not None:
            self._refresh()
        return self.generation

    def get(self, name: str) -> Adapter | None:
        return self.current().get(name)

    def parent_of(self, base_model_name: str | None) -> str:
        """vLLM keeps `base_model_name` only when it is a served base model; the card's parent is
        then that name, else the first served name."""
        if base_model_name is not None and base_model_name in self.base_names:
            return base_model_name
        return self.base_names[0]

    def fingerprint_value(self) -> dict[str, dict[str, str]]:
        """What must agree across replicas: each adapter's path and parent (its load time need not)."""
        return {a.name: {"path": a.path, "parent": a.parent} for a in sorted(self.current().values(), key=_by_name)}

    # changing (vLLM's checks, in vLLM's order, with its messages)

    def load(self, name: str, path: str, *, base_model_name: str | None = None, load_inplace: bool = False) -> Adapter:
        if not name or not path:
            raise invalid_input("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.base_names:
            raise invalid_input(f"The lora adapter '{name}' conflicts with a served base model.")
        with self._locked() as adapters:
            if not load_inplace and name in adapters:
                raise invalid_input(
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                    "place, set 'load_inplace' to True."
                )
            check_adapter_files(name, path)
            # An in-place reload is a new adapter in vLLM too: its parent comes from this call.
            adapter = Adapter(name, path, self.parent_of(base_model_name), int(time.time()))
            adapters[name] = adapter
            self._write(adapters)
        return adapter

    def unload(self, name: str) -> None:
        if not name:
            raise invalid_input("'lora_name' needs to be provided to unload a LoRA adapter.")
        with self._locked() as adapters:
            if name not in adapters:
                raise NotFoundError(f"The lora adapter '{name}' cannot be found.")
            del adapters[name]
            self._write(adapters)

    # the shared file

    def _locked(self) -> _Locked:
        return _Locked(self)

    def _refresh(self) -> None:
        assert self.state_file is not None
        try:
            info = os.stat(self.state_file)
        except FileNotFoundError:
            return  # removed at shutdown: keep the last set
        seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        if seen == self._seen:
            return
        try:
            entries = json.loads(self.state_file.read_bytes())
        except (OSError, ValueError):
            return  # never half-written (written whole, then renamed); keep the last set on a read error
        self._adapters = {entry["name"]: Adapter.from_json(entry) for entry in entries}
        self._seen = seen
        self.generation += 1

    def _write(self, adapters: dict[str, Adapter]) -> None:
        self._adapters = dict(adapters)
        self.generation += 1
        if self.state_file is None:
            return
        data = json.dumps([a.to_json() for a in adapters.values()]).encode()  # load order: /v1/models' order
        fd, temporary = tempfile.mkstemp(dir=self.state_file.parent, prefix=".adapters-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temporary, self.state_file)
        info = os.stat(self.state_file)
        self._seen = (info.st_ino, info.st_mtime_ns, info.st_size)

    def close(self) -> None:
        """Remove the shared file and its lock (the parent process, at exit), and the folder when
        `start` made it."""
        if self.state_file is None:
            return
        folder = self.state_file.parent
        for leftover in [self.state_file, folder / "lock", *folder.glob(".adapters-*")]:
            leftover.unlink(missing_ok=True)
        if self._owns_folder:
            try:
                folder.rmdir()
            except OSError:
                pass


class _Locked:
    """`with registry._locked() as adapters:` the current set, under the file lock when shared."""

    def __init__(self, registry: AdapterRegistry) -> None:
        self.registry = registry
        self.lock_fd: int | None = None

    def __enter__(self) -> dict[str, Adapter]:
        registry = self.registry
        if registry.state_file is not None:
            self.lock_fd = os.open(registry.state_file.parent / "lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        return dict(registry.current())

    def __exit__(self, *exc_info: object) -> None:
        if self.lock_fd is not None:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            os.close(self.lock_fd)


def _by_name(adapter: Adapter) -> str:
    return adapter.name


def invalid_input(message: str) -> RenderServiceError:
    """vLLM's `InvalidUserInput` 400 (its error type names the check, not the status)."""
    return BadRequestError(message, error_type="InvalidUserInput")
