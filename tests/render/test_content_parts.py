"""Content parts with missing or null fields, on every route that renders chat content.

Every part type vLLM 0.33's chat schema admits (and a few it does not) x {missing, null} field x
{chat render, /tokenize, Messages render, Responses render}: never a 500, every 4xx in vLLM's error
shape, and the same status and answer as vLLM's render tier (goldens recorded from it by
record_content_parts.py: the error message byte for byte, or the same token ids).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.render import content_parts
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.render.content_parts_matrix import TOKENIZE, cases

GOLDEN = json.loads((Path(__file__).resolve().parent / "golden" / "content_parts.json").read_text(encoding="utf-8"))
ANSWERS = {(c["case"], c["config"]): c for c in GOLDEN["cases"]}
CASES = list(cases())


def _settings(model_dir: Path, content_format: str) -> Settings:
    return Settings(
        model=str(model_dir),
        served_model_name=["m"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=2048,
        chat_template_content_format=content_format,
    ).validate()


@pytest.fixture(scope="module")
def clients(qwen3_model_dir: Path):
    with (
        TestClient(create_app(_settings(qwen3_model_dir, "auto")), raise_server_exceptions=False) as string_client,
        TestClient(create_app(_settings(qwen3_model_dir, "openai")), raise_server_exceptions=False) as openai_client,
    ):
        yield {"string": string_client, "openai": openai_client}


def _answer(response: Any, path: str) -> dict[str, Any]:
    body = response.json()
    if response.status_code != 200:
        return {"error": body["error"]}
    return {"tokens": body["tokens"]} if path == TOKENIZE else {"token_ids": body["token_ids"]}


def test_golden_covers_the_matrix() -> None:
    assert GOLDEN["vllm_version"] == "0.33.0"
    assert {name for name, _, _ in CASES} == {c["case"] for c in GOLDEN["cases"]}


@pytest.mark.parametrize("config", ["string", "openai"])
@pytest.mark.parametrize(("name", "path", "body"), CASES, ids=[name for name, _, _ in CASES])
def test_content_part(clients: dict[str, TestClient], config: str, name: str, path: str, body: dict[str, Any]) -> None:
    response = clients[config].post(path, json=body)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert list(error) == ["message", "type", "param", "code"]
        assert error["code"] == response.status_code
    expected = ANSWERS.get((name, config)) or ANSWERS[(name, "string")]
    assert response.status_code == expected["status"], response.text
    answer = _answer(response, path)
    assert answer == {k: v for k, v in expected.items() if k in answer}


def test_a_tool_reference_without_a_name_is_dropped_as_vllm_drops_it(clients: dict[str, TestClient]) -> None:
    """The issue's 500: vLLM's renderer skips the empty part (its `if parse_res`), so both answer 200."""
    messages = [{"role": "system", "content": [{"type": "tool_reference"}]}, {"role": "user", "content": "hi"}]
    plain = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    for path in ("/v1/chat/completions/render", "/tokenize"):
        got, want = (clients["string"].post(path, json={"messages": m}) for m in (messages, plain))
        assert got.status_code == 200, got.text
        key = "tokens" if path == "/tokenize" else "token_ids"
        assert got.json()[key] == want.json()[key]


@pytest.mark.parametrize(
    ("message", "lazy"),
    [
        ({"role": "user", "content": [{"type": "text", "text": None}]}, True),
        ({"role": "user", "content": [{"type": "tool_reference"}]}, False),  # vLLM's own member keeps `type`
        ({"role": "tool", "content": [{"type": "text", "text": None}]}, False),  # OpenAI's tool member needs an id
        ({"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": None}]}, True),
        ({"role": "user", "name": 5, "content": [{"type": "text", "text": None}]}, False),
        ({"role": "user", "name": "n", "content": ["s", {"foo": 1}]}, True),
    ],
)
def test_which_schema_member_validates_the_parts(message: dict[str, Any], lazy: bool) -> None:
    assert content_parts.lazily_validated(message) is lazy


LIVE_CORPUS_SIZE = 400


@pytest.mark.live
def test_live_part_checks_agree_with_pydantic(tmp_path: Path) -> None:
    """Random messages validated by vLLM 0.33's own request model (its pydantic schema, in the oracle
    environment) and by `content_parts`: the same verdict and, for refusals, the same message."""
    import random
    import subprocess

    from tests.parity.corpus import oracle_python

    python = oracle_python()
    if python is None:
        pytest.skip("no vLLM 0.33 environment")
    rng = random.Random(5)
    values: list[Any] = ["x", None, 5, {"url": "x"}, {"url": None}, {"data": "x", "format": "ogg"}, {"a": [1, True]}]
    types = [
        "text",
        "refusal",
        "thinking",
        "image_url",
        "input_image",
        "image_embeds",
        "audio_url",
        "tool_reference",
        None,
    ]
    fields = ["text", "refusal", "thinking", "image_url", "image_embeds", "audio_url", "name", "uuid", "detail"]
    messages = []
    for _ in range(LIVE_CORPUS_SIZE):
        parts: list[Any] = []
        for _ in range(rng.randint(1, 3)):
            part: dict[str, Any] = {} if (kind := rng.choice(types)) is None else {"type": kind}
            for field in rng.sample(fields, rng.randint(0, 3)):
                part[field] = rng.choice(values)
            parts.append(rng.choice([part, part, "s"]))
        message: dict[str, Any] = {
            "role": rng.choice(["user", "system", "assistant", "tool", "developer"]),
            "content": parts,
        }
        if message["role"] == "tool" and rng.random() < 0.7:
            message["tool_call_id"] = "c"
        messages.append(message)
    script = (
        "import json, sys, warnings\n"
        "warnings.filterwarnings('ignore')\n"
        "from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    content = ChatCompletionRequest.model_validate({'model': 'm', 'messages': [msg]}).messages[0]['content']\n"
        "    try:\n"
        "        list(content)\n"
        "        print(json.dumps(None))\n"
        "    except Exception as exc:\n"
        "        print(json.dumps(str(exc)))\n"
    )
    out = subprocess.run(
        [python, "-c", script],
        input="\n".join(json.dumps(m) for m in messages),
        capture_output=True,
        text=True,
        check=True,
    )
    verdicts = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(verdicts) == len(messages)
    for message, expected in zip(messages, verdicts, strict=True):
        got = None
        if content_parts.lazily_validated(message):
            for index, part in enumerate(message["content"]):
                try:
                    content_parts.check_part(message["role"], index, part)
                except Exception as exc:
                    got = str(exc)
                    break
        assert got == expected, json.dumps(message)
