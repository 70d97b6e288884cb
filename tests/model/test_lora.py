"""`--lora-modules` in vLLM 0.33's forms, and the adapter set: vLLM's checks and messages, the
folder check, and one set shared by the worker processes of a replica."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from render_service.cli import _parser
from render_service.exceptions import BadRequestError, NotFoundError
from render_service.model.lora import (
    AdapterRegistry,
    LoRAModuleError,
    LoRAModulePath,
    parse_lora_modules,
    runtime_updating_allowed,
)
from render_service.settings import Settings, SettingsError, apply_environment, settings_from_args
from tests.parity.lora_corpus import write_adapter


@pytest.fixture()
def adapter(tmp_path: Path) -> Path:
    return write_adapter(tmp_path / "adapter")


# -- the flag ----------------------------------------------------------------------------------------


def test_both_forms() -> None:
    modules = parse_lora_modules(
        [
            "sql=/adapters/sql",
            '{"name": "chat", "path": "/adapters/chat", "base_model_name": "base"}',
            "",
            "eq=/a=b",  # split at the first "="
        ]
    )
    assert modules == [
        LoRAModulePath("sql", "/adapters/sql"),
        LoRAModulePath("chat", "/adapters/chat", "base"),
        LoRAModulePath("eq", "/a=b"),
    ]


def test_a_comma_makes_it_json_as_in_vllm() -> None:
    with pytest.raises(LoRAModuleError, match=r"^Invalid JSON format for --lora-modules: a=/x,y$"):
        parse_lora_modules(["a=/x,y"])


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ('{"name": "a"}', "missing 1 required positional argument: 'path'"),
        ('{"name": "a", "path": "p", "rank": 8}', "got an unexpected keyword argument 'rank'"),
        ('[{"name": "a", "path": "p"}]', "argument after ** must be a mapping, not list"),
    ],
)
def test_invalid_fields(item: str, reason: str) -> None:
    with pytest.raises(LoRAModuleError, match=r"^Invalid fields for --lora-modules: ") as info:
        parse_lora_modules([item])
    assert str(info.value).startswith(f"Invalid fields for --lora-modules: {item} - ")
    assert reason in str(info.value)


def test_cli_flag_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["serve", "m", "--lora-modules", "a=/x", '{"name":"b","path":"/y"}'])
    assert settings_from_args(args).lora_modules == [LoRAModulePath("a", "/x"), LoRAModulePath("b", "/y")]
    # A repeated flag replaces, as vLLM's action does.
    args = _parser().parse_args(["serve", "m", "--lora-modules", "a=/x", "--lora-modules", "c=/z"])
    assert args.lora_modules == [LoRAModulePath("c", "/z")]
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["serve", "m", "--lora-modules", "{oops"])
    assert exit_info.value.code == 2
    assert "Invalid JSON format for --lora-modules: {oops" in capsys.readouterr().err


def test_environment_form() -> None:
    from render_service.cli import _parser as fresh

    parser = fresh()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    apply_environment(serve, {"RENDER_LORA_MODULES": 'a=/x {"name":"b","path":"/y","base_model_name":"m"}'})
    settings = settings_from_args(parser.parse_args(["serve", "m"]))
    assert settings.lora_modules == [LoRAModulePath("a", "/x"), LoRAModulePath("b", "/y", "m")]


@pytest.mark.parametrize(
    ("modules", "message"),
    [
        (["m=/x"], "The lora adapter 'm' conflicts with a served base model."),
        (["a=/x", "a=/y"], "The lora adapter 'a' has already been loaded."),
        (["=/x"], "both a name and a path are needed"),
        (['{"name": "a", "path": 3, "x": 1}'], "Invalid fields for --lora-modules"),
    ],
)
def test_settings_refuse_what_vllm_refuses_at_start(modules: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Settings(model="m", lora_modules=list(modules)).validate()


def test_runtime_updating_env() -> None:
    assert runtime_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": " TRUE "})
    assert runtime_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    assert not runtime_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"})  # vLLM: "1" or "true" only
    assert not runtime_updating_allowed({})


# -- the set -------------------------------------------------------------------------------------------


def test_start_loads_the_flag_set_and_checks_paths(adapter: Path, tmp_path: Path) -> None:
    registry = AdapterRegistry.start(
        ["base", "alias"],
        [LoRAModulePath("sql", str(adapter)), LoRAModulePath("chat", str(adapter), "alias")],
        shared=False,
    )
    assert [(a.name, a.parent) for a in registry.current().values()] == [("sql", "base"), ("chat", "alias")]
    # A base_model_name that is not served is ignored, as in vLLM: the first served name is the parent.
    assert registry.load("x", str(adapter), base_model_name="other").parent == "base"
    with pytest.raises(NotFoundError, match=r"^Loading lora bad failed: No adapter found for .*missing$"):
        AdapterRegistry.start(["base"], [LoRAModulePath("bad", str(tmp_path / "missing"))], shared=False)


def test_folder_checks(tmp_path: Path) -> None:
    registry = AdapterRegistry.start(["base"], [], shared=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFoundError, match="No adapter found"):
        registry.load("a", str(empty))  # a folder without adapter_config.json
    (empty / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(BadRequestError, match="is not a JSON object"):
        registry.load("a", str(empty))
    (empty / "adapter_config.json").write_text("{broken")
    with pytest.raises(BadRequestError, match="is not readable JSON"):
        registry.load("a", str(empty))
    assert registry.current() == {}


def test_hub_ids_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A repo id is looked up in the HF cache; offline and not cached, it is not found."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    registry = AdapterRegistry.start(["base"], [], shared=False)
    with pytest.raises(NotFoundError, match=r"^Loading lora a failed: No adapter found for org/not-cached$"):
        registry.load("a", "org/not-cached")


def test_vllm_checks_in_order(adapter: Path) -> None:
    registry = AdapterRegistry.start(["base"], [LoRAModulePath("sql", str(adapter))], shared=False)
    with pytest.raises(BadRequestError, match=r"^Both 'lora_name' and 'lora_path' must be provided\.$") as info:
        registry.load("", "")
    assert info.value.error_type == "InvalidUserInput"
    with pytest.raises(BadRequestError, match="conflicts with a served base model"):
        registry.load("base", "/nowhere")
    with pytest.raises(BadRequestError, match="has already been loaded"):
        registry.load("sql", "/nowhere")  # the duplicate is reported before the path
    reloaded = registry.load("sql", str(adapter), load_inplace=True)
    assert registry.get("sql") == reloaded
    with pytest.raises(NotFoundError, match=r"^The lora adapter 'x' cannot be found\.$"):
        registry.unload("x")
    with pytest.raises(BadRequestError, match="'lora_name' needs to be provided"):
        registry.unload("")
    registry.unload("sql")
    assert registry.get("sql") is None


def test_shared_set_across_processes(adapter: Path, tmp_path: Path) -> None:
    """Two registries on one file (two workers): each sees the other's changes, in load order."""
    first = AdapterRegistry.start(["base"], [LoRAModulePath("a", str(adapter))], shared=True)
    second = AdapterRegistry(["base"], first.state_file)
    assert list(second.current()) == ["a"]
    generation = second.current_generation()
    first.load("b", str(adapter))
    assert list(second.current()) == ["a", "b"] and second.current_generation() != generation
    with pytest.raises(BadRequestError, match="already been loaded"):
        second.load("b", str(adapter))  # the check reads the shared set under the lock
    second.unload("a")
    assert list(first.current()) == ["b"]
    assert json.loads(first.state_file.read_text())[0]["name"] == "b"  # type: ignore[union-attr]
    folder = first.state_file.parent  # type: ignore[union-attr]
    first.close()
    assert not folder.exists()
