"""Locust load tests for render-service, or vLLM's `vllm launch render` (same payloads, --host).

One user class per scenario, plus a mixed profile:

    ShortChatUser         chat render, ~300-token conversation
    LongChatUser          chat render, ~9k-token multi-turn conversation
    AgentUser             multi-turn agent session: every turn re-renders the whole conversation
                          with a tools block that grows by one tool per turn (15 -> ~25 tools)
    BatchDerenderUser     batch derender of a ~500-token output (reasoning, content, a tool call)
    StreamingDerenderUser streaming derender, one token per chunk, echoing `stream_state` like an
                          llm-d client, one HTTP session (keep-alive connection) per stream
    MixedUser             all of the above, weighted like a chat + agent fleet

Bounded and loopback only: the host must be 127.0.0.1/localhost/::1, a headless run needs
`-t/--run-time`, and each user is paced (RENDER_LOAD_USER_RPS requests/s per user, default 2;
streams are paced per chunk), so the offered load is at most users x that rate.

    locust -f loadtests/locustfile.py --headless -u 8 -r 4 -t 20s --host http://127.0.0.1:8000 MixedUser

For capacity numbers use `python -m loadtests.size` instead: on a 2-core machine locust's own
CPU competes with the server and hides its scaling.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from locust import HttpUser, constant, constant_throughput, events, task
from locust.clients import HttpSession
from locust.env import Environment

from loadtests import payloads

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
USER_RPS = float(os.environ.get("RENDER_LOAD_USER_RPS", "2"))
STREAM_CHUNK_RPS = float(os.environ.get("RENDER_LOAD_STREAM_CHUNK_RPS", "50"))  # per streaming user
STREAM_WORDS = int(os.environ.get("RENDER_LOAD_STREAM_WORDS", "150"))  # ~300-token streamed outputs
_user_ids = itertools.count()


@events.test_start.add_listener
def _guard(environment: Environment, **_: Any) -> None:
    """Refuse anything but loopback, and unbounded headless runs."""
    host = environment.host or ""
    if urlsplit(host).hostname not in LOOPBACK:
        raise SystemExit(f"loadtests only target loopback hosts (got --host {host!r})")
    options = environment.parsed_options
    if options is not None and getattr(options, "headless", False) and not getattr(options, "run_time", None):
        raise SystemExit("headless runs must be bounded: pass -t/--run-time")


def _post(
    user: HttpUser, client: HttpSession, path: str, body: bytes | dict[str, Any], name: str, expect: str
) -> dict[str, Any] | None:
    """POST, check status 200 and that the answer has `expect`; returns the parsed JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with client.post(path, data=data, headers=payloads.HEADERS, name=name, catch_response=True) as response:
        if response.status_code != 200:
            response.failure(f"{response.status_code}: {response.text[:200]}")
            return None
        try:
            answer = response.json()
        except ValueError:
            response.failure("not JSON")
            return None
        if expect not in answer:
            response.failure(f"no {expect!r} in the answer")
            return None
        response.success()
        return answer


class _RenderUser(HttpUser):
    abstract = True
    wait_time = constant_throughput(USER_RPS)

    def on_start(self) -> None:
        self.index = next(_user_ids)
        self.rotation = itertools.count(self.index)

    def _chat(self, scenario: str) -> None:
        bodies = payloads.chat_bodies(scenario)
        body = bodies[next(self.rotation) % len(bodies)]
        _post(self, self.client, payloads.RENDER_PATH, body, f"render {scenario}", "token_ids")

    def _agent_turn(self) -> None:
        if not hasattr(self, "session"):
            self.session = payloads.AgentSession(seed=100 + self.index)
        body = self.session.next_body()
        _post(self, self.client, payloads.RENDER_PATH, body, "render agent turn", "token_ids")

    def _batch_derender(self) -> None:
        case = payloads.derender_case(self.host, seed=next(self.rotation) % payloads.VARIANTS)
        body = case.batch_body(f"generate-tokens-chatcmpl-{uuid.uuid4().hex[:16]}")
        _post(self, self.client, payloads.DERENDER_PATH, body, "derender batch", "choices")

    def _stream(self) -> None:
        """One stream, one HTTP session (connection), chunk by chunk, echoing stream_state."""
        case = payloads.derender_case(self.host, seed=50 + next(self.rotation) % payloads.VARIANTS, words=STREAM_WORDS)
        request_id = f"generate-tokens-chatcmpl-{uuid.uuid4().hex[:16]}"
        started = time.perf_counter()
        chunks, ok = 0, True
        state: Any = None
        pace = 1.0 / STREAM_CHUNK_RPS if STREAM_CHUNK_RPS > 0 else 0.0
        with HttpSession(base_url=self.host, request_event=self.environment.events.request, user=self) as http:
            for build in case.stream_bodies(request_id):
                t0 = time.perf_counter()
                answer = _post(
                    self, http, payloads.DERENDER_PATH, build(state), "derender stream chunk", "stream_state"
                )
                if answer is None:
                    ok = False
                    break
                state = answer["stream_state"]
                chunks += 1
                if pace:  # an engine emits chunks at a bounded rate, not back to back
                    time.sleep(max(0.0, pace - (time.perf_counter() - t0)))
        self.environment.events.request.fire(
            request_type="STREAM",
            name="derender whole stream",
            response_time=(time.perf_counter() - started) * 1000,
            response_length=chunks,
            exception=None if ok else RuntimeError("stream aborted"),
            context={},
        )


class ShortChatUser(_RenderUser):
    @task
    def short(self) -> None:
        self._chat("short")


class LongChatUser(_RenderUser):
    @task
    def long9k(self) -> None:
        self._chat("long9k")


class AgentUser(_RenderUser):
    @task
    def agent_turn(self) -> None:
        self._agent_turn()


class BatchDerenderUser(_RenderUser):
    @task
    def batch_derender(self) -> None:
        self._batch_derender()


class StreamingDerenderUser(_RenderUser):
    wait_time = constant(0)  # streams are paced per chunk

    @task
    def stream(self) -> None:
        self._stream()


class MixedUser(_RenderUser):
    """A chat + agent fleet: mostly short chats and agent turns, some long prompts, derender."""

    @task(40)
    def short(self) -> None:
        self._chat("short")

    @task(10)
    def long9k(self) -> None:
        self._chat("long9k")

    @task(25)
    def agent_turn(self) -> None:
        self._agent_turn()

    @task(20)
    def batch_derender(self) -> None:
        self._batch_derender()

    @task(5)
    def stream(self) -> None:
        self._stream()
