"""Property tests (hypothesis) over every POST endpoint: arbitrary bytes, arbitrary JSON, and
request-shaped bodies with hostile values. The property: an answer within a bounded time, never a
500, and every 4xx in vLLM's error shape.

The CI run is derandomized and bounded (~150-300 examples per test), and reproducible under the
locked `hypothesis` (requirements/constraints.txt); for a long random fuzzing session:
`python -m tests.faults.fuzz_long --minutes 10` (fresh seeds round after round; or
`RENDER_FUZZ_EXAMPLES=20000 python3 -m pytest tests/faults/test_fuzz.py`).
These strategies are written from vLLM's request models; test_schemathesis.py fuzzes the running
service from its /openapi.json as well.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

EXAMPLES = int(os.environ.get("RENDER_FUZZ_EXAMPLES", "0"))
PER_REQUEST_LIMIT = 10.0  # seconds; a hang (or unbounded work) fails the property


def fuzz_settings(ci_examples: int) -> Any:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        deadline=None,
        derandomize=not EXAMPLES,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


@pytest.fixture(scope="module")
def app_and_client(qwen3_model_dir: Path):
    settings_ = Settings(
        model=str(qwen3_model_dir),
        served_model_name=["m"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=2048,
        max_request_body_bytes=1 << 20,
    ).validate()
    app = create_app(settings_)
    with TestClient(app, raise_server_exceptions=True) as client:
        yield app, client


@pytest.fixture(scope="module")
def client(app_and_client: Any) -> TestClient:
    return app_and_client[1]


@pytest.fixture(scope="module")
def post_paths(app_and_client: Any) -> list[str]:
    """Every POST route the app serves (routes added later are fuzzed too)."""
    app = app_and_client[0]
    return sorted(r.path for r in app.routes if isinstance(r, Route) and "POST" in (r.methods or ()))


def check(client: TestClient, path: str, body: bytes) -> None:
    start = time.perf_counter()
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - start
    assert elapsed < PER_REQUEST_LIMIT, f"{path} took {elapsed:.1f}s"
    assert response.status_code < 500, f"{path} -> {response.status_code}: {response.text[:500]}\nbody: {body[:500]!r}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        # 409s carry a machine-readable code (fingerprint_mismatch, stream_state_expired).
        assert error["code"] == response.status_code or (response.status_code == 409 and isinstance(error["code"], str))


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass")


# -- strategies ---------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
token_id = st.integers(min_value=-3, max_value=151_700) | st.integers(min_value=-(2**40), max_value=2**40)
token_ids = st.lists(token_id, max_size=12)
small_int = st.integers(min_value=-3, max_value=40) | st.integers(min_value=-(2**63), max_value=2**64)


def maybe(strategy: Any) -> Any:
    """A plausible value, or anything at all."""
    return strategy | json_values


part = st.fixed_dictionaries(
    {
        # every part type vLLM's chat schema admits, and a few it does not
        "type": st.sampled_from(
            [
                "text",
                "input_text",
                "output_text",
                "refusal",
                "thinking",
                "image_url",
                "input_image",
                "image_embeds",
                "audio_embeds",
                "video_embeds",
                "prompt_embeds",
                "image_pil",
                "audio_url",
                "input_audio",
                "video_url",
                "file",
                "input_file",
                "tool_reference",
                "video",
                "x",
            ]
        )
    },
    optional={
        "text": maybe(st.text(max_size=30)),
        "refusal": maybe(st.text(max_size=10)),
        "thinking": maybe(st.text(max_size=10)),
        "name": maybe(st.text(max_size=10)),
        "image_url": maybe(st.fixed_dictionaries({}, optional={"url": maybe(st.text(max_size=10))})),
        "input_audio": maybe(st.fixed_dictionaries({}, optional={"data": maybe(st.text(max_size=8))})),
        "data": maybe(st.text(max_size=8)),
        "uuid": maybe(st.text(max_size=5)),
    },
)
tool_call = st.fixed_dictionaries(
    {
        "id": maybe(st.text(max_size=8)),
        "type": maybe(st.just("function")),
        "function": maybe(
            st.fixed_dictionaries(
                {
                    "name": maybe(st.text(max_size=8)),
                    "arguments": maybe(st.sampled_from(['{"q": 1}', "{", "", "[]", "null"])),
                }
            )
        ),
    }
)
message = st.fixed_dictionaries(
    {"role": maybe(st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "x"]))},
    optional={
        "content": maybe(st.text(max_size=40) | st.lists(part | st.text(max_size=8), max_size=3)),
        "tool_calls": maybe(st.lists(tool_call, max_size=2)),
        "name": maybe(st.text(max_size=8)),
        "reasoning": maybe(st.text(max_size=20)),
        "reasoning_content": st.text(max_size=8),
        "tool_call_id": maybe(st.text(max_size=8)),
    },
)
schema = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "bogus"])}),
    lambda children: (
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), children, max_size=3)},
            optional={"required": st.lists(st.text(max_size=6), max_size=2)},
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": children})
    ),
    max_leaves=6,
)
tool = st.fixed_dictionaries(
    {
        "type": maybe(st.just("function")),
        "function": maybe(
            st.fixed_dictionaries(
                {"name": maybe(st.text(max_size=8))},
                optional={
                    "description": maybe(st.text(max_size=20)),
                    "parameters": maybe(schema),
                    "strict": maybe(st.booleans()),
                },
            )
        ),
    }
)
sampling = {
    "model": maybe(st.sampled_from(["m", "nope", ""])),
    "n": maybe(small_int),
    "temperature": maybe(st.floats()),
    "top_p": maybe(st.floats()),
    "top_k": maybe(small_int),
    "max_tokens": maybe(small_int),
    "min_tokens": maybe(small_int),
    "seed": maybe(small_int),
    "stop": maybe(st.lists(st.text(max_size=4), max_size=5)),
    "stop_token_ids": maybe(token_ids),
    "logprobs": maybe(st.booleans() | small_int),
    "top_logprobs": maybe(small_int),
    "prompt_logprobs": maybe(small_int),
    "stream": maybe(st.booleans()),
    "stream_options": maybe(st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})),
    "logit_bias": maybe(st.dictionaries(st.text(max_size=6), st.floats(-100, 100), max_size=3)),
    "truncate_prompt_tokens": maybe(small_int),
    "cache_salt": maybe(st.text(max_size=10)),
    "priority": maybe(small_int),
    "request_id": maybe(st.text(max_size=10)),
    "kv_transfer_params": maybe(st.fixed_dictionaries({}, optional={"prompt_token_ids": maybe(token_ids)})),
    "structured_outputs": maybe(
        st.fixed_dictionaries(
            {},
            optional={
                "json": maybe(schema),
                "regex": st.text(max_size=10),
                "choice": st.lists(st.text(max_size=4), max_size=3),
                "grammar": st.text(max_size=10),
            },
        )
    ),
    "response_format": maybe(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema", "structural_tag", "x"])},
            optional={
                "json_schema": maybe(st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={"schema": schema}))
            },
        )
    ),
}
chat_body = st.fixed_dictionaries(
    {"messages": maybe(st.lists(message, max_size=4))},
    optional={
        **sampling,
        "tools": maybe(st.lists(tool, max_size=3)),
        "tool_choice": maybe(
            st.sampled_from(["auto", "none", "required"])
            | st.fixed_dictionaries(
                {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(max_size=8)})}
            )
        ),
        "parallel_tool_calls": maybe(st.booleans()),
        "add_generation_prompt": maybe(st.booleans()),
        "continue_final_message": maybe(st.booleans()),
        "include_reasoning": maybe(st.booleans()),
        "chat_template_kwargs": maybe(st.fixed_dictionaries({}, optional={"enable_thinking": maybe(st.booleans())})),
        "max_completion_tokens": maybe(small_int),
        "documents": maybe(st.lists(json_values, max_size=2)),
        "return_token_ids": maybe(st.booleans()),
        "add_special_tokens": maybe(st.booleans()),
        "reasoning_effort": maybe(st.sampled_from(["low", "high", "x"])),
    },
)
completion_body = st.fixed_dictionaries(
    {
        "prompt": maybe(
            st.text(max_size=40)
            | token_ids
            | st.lists(token_ids, max_size=3)
            | st.lists(st.text(max_size=10), max_size=3)
        )
    },
    optional={
        **sampling,
        "echo": maybe(st.booleans()),
        "suffix": maybe(st.text(max_size=5)),
        "add_special_tokens": maybe(st.booleans()),
    },
)
logprob_entry = st.fixed_dictionaries(
    {"token_id": maybe(token_id), "logprob": maybe(st.floats(-50, 0))},
    optional={
        "top_logprobs": maybe(
            st.lists(st.fixed_dictionaries({"token_id": maybe(token_id), "logprob": st.floats(-50, 0)}), max_size=4)
        )
    },
)
choice = st.fixed_dictionaries(
    {"index": maybe(st.integers(0, 3)), "token_ids": maybe(token_ids)},
    optional={
        "finish_reason": maybe(st.sampled_from(["stop", "length", "abort", None])),
        "stop_reason": maybe(token_id),
        "logprobs": maybe(st.fixed_dictionaries({"content": maybe(st.lists(logprob_entry, max_size=4))})),
    },
)
generate = st.fixed_dictionaries(
    {"request_id": maybe(st.text(max_size=10)), "choices": maybe(st.lists(choice, max_size=2))},
    optional={
        "prompt_token_ids": maybe(token_ids),
        "usage": maybe(st.fixed_dictionaries({"prompt_tokens": small_int, "completion_tokens": small_int})),
        "output_mode": maybe(st.just("tokens")),
        "kv_transfer_params": json_values,
        "metrics": json_values,
        "prompt_logprobs": maybe(st.lists(json_values, max_size=2)),
    },
)
stream_state = st.fixed_dictionaries(
    {},
    optional={
        "prev_tokens": maybe(st.lists(st.text(max_size=4), max_size=6)),
        "prefix_offset": maybe(small_int),
        "read_offset": maybe(small_int),
        "role_sent": maybe(st.booleans()),
        "logprob_context_token_ids": maybe(token_ids),
        "logprob_text_offset": maybe(small_int),
        "output_token_ids": maybe(token_ids),
        "output_chunk_lens": maybe(st.lists(small_int, max_size=4)),
        "tools_streamed": maybe(st.booleans()),
        "last_tool_call_ids": maybe(st.lists(st.text(max_size=8), max_size=3)),
        "rs_sid": maybe(st.text(max_size=40)),
        "rs_pos": maybe(small_int),
        "rs_fp": maybe(st.text(max_size=32)),
    },
)
chat_derender = st.fixed_dictionaries(
    {},
    optional={
        "model": maybe(st.just("m")),
        "stream": maybe(st.booleans()),
        "generate_response": maybe(generate),
        "generate_chunk": maybe(generate),
        "chat_request": maybe(chat_body),
        "prompt_token_ids": maybe(token_ids),
        "prompt_tokens": maybe(small_int),
        "stream_state": maybe(stream_state),
    },
)
completion_derender = st.fixed_dictionaries(
    {},
    optional={
        "model": maybe(st.just("m")),
        "stream": maybe(st.booleans()),
        "generate_responses": maybe(st.lists(generate, max_size=2)),
        "generate_chunk": maybe(generate),
        "completion_request": maybe(completion_body),
        "prompt_token_ids": maybe(token_ids | st.lists(token_ids, max_size=2)),
        "prompt_tokens": maybe(small_int | st.lists(small_int, max_size=2)),
        "stream_state": maybe(stream_state),
    },
)
tokenize_body = st.fixed_dictionaries(
    {},
    optional={
        "prompt": maybe(st.text(max_size=40)),
        "messages": maybe(st.lists(message, max_size=3)),
        "tools": maybe(st.lists(tool, max_size=2)),
        "add_special_tokens": maybe(st.booleans()),
        "return_token_strs": maybe(st.booleans()),
        "add_generation_prompt": maybe(st.booleans()),
        "tokens": maybe(token_ids),
        "model": maybe(st.just("m")),
    },
)

block = st.fixed_dictionaries(
    {
        "type": maybe(
            st.sampled_from(
                [
                    "text",
                    "image",
                    "tool_use",
                    "tool_result",
                    "tool_reference",
                    "thinking",
                    "redacted_thinking",
                    "tool_addition",
                    "tool_removal",
                    "x",
                ]
            )
        )
    },
    optional={
        "text": maybe(st.text(max_size=20)),
        "thinking": maybe(st.text(max_size=10)),
        "id": maybe(st.text(max_size=6)),
        "name": maybe(st.text(max_size=6)),
        "input": maybe(json_values),
        "tool_use_id": maybe(st.text(max_size=6)),
        "content": maybe(st.text(max_size=10) | st.lists(json_values, max_size=3)),
        "source": maybe(json_values),
        "tool": maybe(json_values),
        "is_error": maybe(st.booleans()),
    },
)
anthropic_message = st.fixed_dictionaries(
    {"role": maybe(st.sampled_from(["user", "assistant", "system", "tool"]))},
    optional={"content": maybe(st.text(max_size=30) | st.lists(block, max_size=3))},
)
anthropic_tool = st.fixed_dictionaries(
    {"name": maybe(st.text(max_size=8))},
    optional={
        "input_schema": maybe(schema | json_values),
        "description": maybe(st.text(max_size=10)),
        "strict": maybe(st.booleans()),
        "defer_loading": maybe(st.booleans()),
    },
)
messages_body = st.fixed_dictionaries(
    {"messages": maybe(st.lists(anthropic_message, max_size=4))},
    optional={
        "model": maybe(st.sampled_from(["m", "nope", ""])),
        "max_tokens": maybe(small_int),
        "system": maybe(st.text(max_size=20) | st.lists(block, max_size=2)),
        "tools": maybe(st.lists(anthropic_tool, max_size=3)),
        "tool_choice": maybe(
            st.fixed_dictionaries(
                {"type": maybe(st.sampled_from(["auto", "any", "tool", "none", "x"]))},
                optional={"name": maybe(st.text(max_size=6)), "disable_parallel_tool_use": maybe(st.booleans())},
            )
        ),
        "thinking": maybe(
            json_values
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["enabled", "disabled", "adaptive"])}, optional={"budget_tokens": small_int}
            )
        ),
        "output_config": maybe(json_values),
        "stop_sequences": maybe(st.lists(st.text(max_size=4), max_size=5)),
        "stream": maybe(st.booleans()),
        "temperature": maybe(st.floats()),
        "top_k": maybe(small_int),
        "kv_transfer_params": maybe(json_values),
        "return_mm_kwargs": maybe(st.booleans()),
    },
)
response_item = st.fixed_dictionaries(
    {},
    optional={
        "type": maybe(
            st.sampled_from(
                [
                    "message",
                    "function_call",
                    "function_call_output",
                    "reasoning",
                    "custom_tool_call",
                    "custom_tool_call_output",
                    "web_search_call",
                ]
            )
        ),
        "role": maybe(st.sampled_from(["user", "assistant", "system", "developer", "x"])),
        "content": maybe(st.text(max_size=20) | st.lists(json_values, max_size=3)),
        "call_id": maybe(st.text(max_size=6)),
        "name": maybe(st.text(max_size=6)),
        "arguments": maybe(st.text(max_size=10)),
        "output": maybe(json_values),
        "input": maybe(st.text(max_size=6)),
        "summary": maybe(st.lists(json_values, max_size=2)),
        "status": maybe(st.sampled_from(["in_progress", "completed"])),
        "encrypted_content": maybe(st.text(max_size=4)),
    },
)
responses_body = st.fixed_dictionaries(
    {"input": maybe(st.text(max_size=30) | st.lists(response_item, max_size=4))},
    optional={
        "model": maybe(st.sampled_from(["m", "nope", ""])),
        "instructions": maybe(st.text(max_size=10)),
        "max_output_tokens": maybe(small_int),
        "tools": maybe(
            st.lists(
                json_values
                | st.fixed_dictionaries(
                    {"type": st.just("function"), "name": st.text(max_size=6)}, optional={"parameters": schema}
                ),
                max_size=2,
            )
        ),
        "tool_choice": maybe(st.sampled_from(["auto", "none", "required", "x"]) | json_values),
        "text": maybe(json_values),
        "reasoning": maybe(json_values),
        "truncation": maybe(st.sampled_from(["auto", "x"])),
        "include": maybe(st.lists(st.text(max_size=6), max_size=2)),
        "top_logprobs": maybe(small_int),
        "previous_response_id": maybe(st.text(max_size=4)),
        "temperature": maybe(st.floats()),
        "stop": maybe(st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3)),
        "logit_bias": maybe(json_values),
        "structured_outputs": maybe(json_values),
    },
)

SHAPED = {
    "/v1/messages/render": messages_body,
    "/v1/responses/render": responses_body,
    "/v1/chat/completions/render": chat_body,
    "/v1/completions/render": completion_body,
    "/v1/chat/completions/derender": chat_derender,
    "/v1/completions/derender": completion_derender,
    "/tokenize": tokenize_body,
    "/detokenize": tokenize_body,
}


# -- properties ---------------------------------------------------------------------------------


@fuzz_settings(300)
@given(data=st.data(), body=st.binary(max_size=256) | st.text(max_size=128).map(str.encode))
def test_arbitrary_bytes(client: TestClient, post_paths: list[str], data: Any, body: bytes) -> None:
    check(client, data.draw(st.sampled_from(post_paths)), body)


@fuzz_settings(300)
@given(data=st.data(), body=json_values)
def test_arbitrary_json(client: TestClient, post_paths: list[str], data: Any, body: Any) -> None:
    check(client, data.draw(st.sampled_from(post_paths)), encode(body))


@pytest.mark.parametrize("path", list(SHAPED))
@fuzz_settings(150)
@given(data=st.data())
def test_request_shaped_bodies(client: TestClient, path: str, data: Any) -> None:
    body = data.draw(SHAPED[path])
    check(client, path, encode(body))


@fuzz_settings(150)
@given(body=chat_derender.filter(lambda b: isinstance(b, dict)), stream=st.booleans())
def test_derender_streams_with_a_real_prompt(client: TestClient, body: dict[str, Any], stream: bool) -> None:
    """Derender bodies that pass the first checks: a rendered prompt, a valid chat request."""
    body = {
        **body,
        "stream": stream,
        "model": "m",
        "chat_request": {"messages": [{"role": "user", "content": "hi"}]},
        "prompt_token_ids": [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
    }
    check(client, "/v1/chat/completions/derender", encode(body))
