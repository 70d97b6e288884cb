"""The derender parity corpus: synthetic engine outputs, the requests built from them, and the helpers
shared by record_derender.py and test_derender_parity.py.

Every case pairs a render-style `chat_request` (or `completion_request`) with one or more synthetic
engine outputs. Output token ids are built deterministically by encoding text segments with the
model's own tokenizer (`tokenizers.Tokenizer` over the example model folder) and splicing explicit
special ids (`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<|im_end|>`, ...). The prompt
token ids are not known here: record_derender.py renders the case's request through the oracle's
`/v1/chat/completions/render` (or `/v1/completions/render`) and passes the resulting ids to
`DerenderCase.build`, which returns the derender calls:

* batch cases: one call (`/v1/chat/completions/derender` or `/v1/completions/derender`);
* stream cases: one call per engine chunk, driven like an llm-d client: the first call of a choice
  index has no `stream_state`, every later call echoes the state returned by the previous call for
  that index (`state_source: "previous"`), and `chat_request` plus the full `prompt_token_ids` go
  with every call. A call whose `stream_state` is part of the case itself (the error cases that send
  a crafted state) has `state_source: "fixed"`.

Goldens live in golden_derender/<case>.json: {case, config, vllm_flags, vllm_version, kind, endpoint,
render: {request, prompt_token_ids}, calls: [{request, state_source, status, response}]}.
"""

from __future__ import annotations

import copy
import json
import random
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .corpus import (
    CONFIGS,
    MAX_MODEL_LEN,
    SEARCH_TOOL,
    VLLM_VERSION,
    WEATHER_TOOL,
    A,
    S,
    U,
    compare_response,
    long_text,
)

PARITY_DIR = Path(__file__).resolve().parent
GOLDEN_DIR = PARITY_DIR / "golden_derender"
DERENDER_CONFIGS = ("parsers", "plain", "deepseek")

CHAT_DERENDER = "/v1/chat/completions/derender"
CMPL_DERENDER = "/v1/completions/derender"
CHAT_RENDER = "/v1/chat/completions/render"
CMPL_RENDER = "/v1/completions/render"

# One-token-per-chunk streams cost O(n^2) bytes (the parser path re-sends every output id on every
# call): such streams are kept at or below this many output tokens; longer outputs are streamed only
# with the random 1-7 chunking.
MAX_ONE_PER_CHUNK_TOKENS = 600
CREATED = 1795949053  # a fixed engine `created` for batch generate responses
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs, also our Settings default


# -- tokens ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    model: str  # served model name
    eos: int
    think: int
    end_think: int
    tool_call: int | None = None
    end_tool_call: int | None = None
    endoftext: int | None = None


QWEN3 = Family(
    "tinyqwen3", eos=151645, think=151667, end_think=151668, tool_call=151657, end_tool_call=151658, endoftext=151643
)
DEEPSEEK = Family("tinydeepseek", eos=1, think=128821, end_think=128822)
FAMILIES = {"qwen3": QWEN3, "deepseek": DEEPSEEK}

# A segment is text (encoded on its own), an explicit token id, or a tuple of texts encoded one by one
# (so that markup such as "<tool_call>" arrives as several ordinary tokens instead of the added token).
Seg = str | int | tuple[str, ...]


def load_tokenizer(model_dir: str | Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


class Encoder:
    """Segment encoding with one tokenizer; also the pools of ids used for synthetic logprobs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self._cache: dict[str, list[int]] = {}
        # single byte-level tokens that decode to U+FFFD on their own (continuation bytes)
        self.byte_ids = [i for i in range(512) if tokenizer.decode([i]) == "\ufffd"][:12]
        self.word_ids = self.text(" the and of to a in is that for it as with on")

    def text(self, s: str) -> list[int]:
        if s not in self._cache:
            self._cache[s] = list(self.tok.encode(s, add_special_tokens=False).ids)
        return list(self._cache[s])

    def ids(self, segs: Sequence[Seg]) -> list[int]:
        out: list[int] = []
        for seg in segs:
            if isinstance(seg, int):
                out.append(seg)
            elif isinstance(seg, tuple):
                for piece in seg:
                    out += self.text(piece)
            else:
                out += self.text(seg)
        return out


# -- engine outputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Out:
    """One engine output (one choice)."""

    segs: tuple[Seg, ...]
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    logprobs: int | None = None  # candidates per position (sampled first); None = no logprobs
    index: int = 0


def synth_logprobs(enc: Encoder, token_ids: Sequence[int], n_candidates: int, seed: int) -> list[dict[str, Any]]:
    """GenerateLogProbs.content: per position the sampled token (with its rank) and `n_candidates`
    candidates, sampled first then the others by rank. The pool mixes ordinary words and lone
    byte-level continuation bytes (U+FFFD on their own); every 7th position ends with a -9999.0
    candidate whose rank is null (how generate sends NaN/-inf)."""
    rng = random.Random(seed)
    pool = enc.byte_ids + enc.word_ids
    content: list[dict[str, Any]] = []
    for pos, tid in enumerate(token_ids):
        values = sorted((-round(rng.uniform(0.001, 6.0), 6) for _ in range(max(n_candidates, 1))), reverse=True)
        sampled_rank = rng.randint(1, min(3, len(values)))
        sampled_lp = values[sampled_rank - 1]
        top: list[dict[str, Any]] = [{"token_id": tid, "logprob": sampled_lp, "rank": sampled_rank}]
        used = {tid}
        for rank, value in enumerate(values, start=1):
            if rank == sampled_rank or len(top) >= n_candidates:
                continue
            alt = rng.choice(pool)
            while alt in used:
                alt = rng.choice(pool)
            used.add(alt)
            top.append({"token_id": alt, "logprob": value, "rank": rank})
        if pos % 7 == 6 and len(top) > 1:
            top[-1] = {"token_id": top[-1]["token_id"], "logprob": -9999.0, "rank": None}
        content.append({"token_id": tid, "logprob": sampled_lp, "rank": sampled_rank, "top_logprobs": top})
    return content


def _seed(*parts: Any) -> int:
    return zlib.crc32(json.dumps(parts).encode())


def chunk_sizes(n: int, chunking: str, seed: int) -> list[int]:
    """`one`: one token per chunk; `random`: seeded sizes of 1-7 tokens."""
    if chunking == "one":
        return [1] * n
    if chunking != "random":
        raise ValueError(chunking)
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(min(rng.randint(1, 7), n - sum(sizes)))
    return sizes


def weight_versions(n: int) -> list[dict[str, Any]]:
    return [{"version": "default", "start": 0, "end": n}]


def gen_choice(
    index: int,
    token_ids: list[int] | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    logprobs: list[dict[str, Any]] | None,
    final_len: int | None,
) -> dict[str, Any]:
    """A generate choice, keys in vLLM's order (`GenerateTokens[Stream]Choice`)."""
    return {
        "index": index,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": weight_versions(final_len) if final_len is not None else None,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
    }


def usage(prompt_tokens: int, completion_tokens: int, details: bool = False) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        u |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    return u


def gen_response(
    request_id: str, model: str, prompt_ids: list[int], choices: list[dict[str, Any]], return_token_ids: bool = False
) -> dict[str, Any]:
    """A non-streaming GenerateTokensResponse as `/inference/v1/generate` serializes it."""
    completion = sum(len(c["token_ids"] or []) for c in choices)
    return {
        "request_id": request_id,
        "model": model,
        "created": CREATED,
        "usage": usage(len(prompt_ids), completion, details=True),
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": list(prompt_ids) if return_token_ids else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": choices,
    }


def gen_chunk(
    request_id: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
    prompt_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One SSE chunk of `/inference/v1/generate` (stream=true): `prompt_token_ids` only when set."""
    chunk: dict[str, Any] = {"request_id": request_id, "usage": usage_}
    if prompt_token_ids is not None:
        chunk["prompt_token_ids"] = list(prompt_token_ids)
    chunk["output_mode"] = "tokens"
    chunk["choices"] = choices
    return chunk


# -- cases ---------------------------------------------------------------------------------------------

CallSpec = dict[str, Any]  # {"request": {method, path, headers, json}, "state_source": none|previous|fixed}
Builder = Callable[[list[list[int]]], list[CallSpec]]
Patch = Callable[[dict[str, Any], int], None]  # (derender body, call index) -> None, edits in place


@dataclass(frozen=True)
class DerenderCase:
    name: str
    config: str
    kind: str  # "batch" | "stream"
    endpoint: str  # "chat" | "completions"
    render_body: dict[str, Any] | None  # rendered to get the prompt token ids (None: no prompt)
    build: Builder = field(compare=False)
    n_outputs: int = 1  # engine outputs (choices) in this case
    error: bool = False  # built to be rejected (an error case of protocol sections 4 and 7)

    @property
    def family(self) -> str:
        return CONFIGS[self.config].family

    def render_request(self) -> dict[str, Any] | None:
        if self.render_body is None:
            return None
        path = CHAT_RENDER if self.endpoint == "chat" else CMPL_RENDER
        return {"method": "POST", "path": path, "headers": {}, "json": self.render_body}


def _http(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"method": "POST", "path": path, "headers": {}, "json": body}


def with_state(body: dict[str, Any], state: Any) -> dict[str, Any]:
    """`body` with `stream_state` placed right after `generate_chunk` (where an llm-d client puts it)."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key == "stream_state":
            continue
        out[key] = value
        if key == "generate_chunk":
            out["stream_state"] = state
    if "stream_state" not in out:
        out["stream_state"] = state
    return out


def stream_lane(body: Any) -> int:
    """The choice index a stream call belongs to (a usage-only chunk continues lane 0)."""
    try:
        choices = body["generate_chunk"]["choices"]
        return int(choices[0]["index"]) if choices else 0
    except (KeyError, IndexError, TypeError, ValueError):
        return 0


def _stream_specs(path: str, bodies: list[dict[str, Any]], patch: Patch | None) -> list[CallSpec]:
    specs: list[CallSpec] = []
    seen: set[int] = set()
    for i, body in enumerate(bodies):
        if patch is not None:
            patch(body, i)
        lane = stream_lane(body)
        if "stream_state" in body:
            source = "fixed"
        elif lane in seen:
            source = "previous"
        else:
            source = "none"
        seen.add(lane)
        specs.append({"request": _http(path, body), "state_source": source})
    return specs


class CorpusBuilder:
    """Builds every case for the tokenizers of the example model folders."""

    def __init__(self, encoders: Mapping[str, Encoder]) -> None:
        self.enc = encoders
        self.cases: list[DerenderCase] = []

    # chat ------------------------------------------------------------------------------------------
    def chat_batch(
        self,
        name: str,
        config: str,
        chat_request: dict[str, Any],
        outs: Sequence[Out],
        *,
        send_chat_request: bool = True,
        send_prompt_ids: bool = True,
        send_prompt_tokens: bool = True,
        gen_prompt_ids: bool = False,
        model: str | None = "default",
        patch: Patch | None = None,
        error: bool = False,
    ) -> None:
        family = FAMILIES[CONFIGS[config].family]
        enc = self.enc[CONFIGS[config].family]
        outputs = [(o, enc.ids(o.segs)) for o in outs]

        def build(prompts: list[list[int]]) -> list[CallSpec]:
            prompt = prompts[0] if prompts else []
            choices = [
                gen_choice(
                    o.index,
                    ids,
                    o.finish_reason,
                    o.stop_reason,
                    synth_logprobs(enc, ids, o.logprobs, _seed(name, o.index)) if o.logprobs else None,
                    len(ids),
                )
                for o, ids in outputs
            ]
            body: dict[str, Any] = {}
            if model is not None:
                body["model"] = family.model if model == "default" else model
            body["generate_response"] = gen_response(
                f"generate-tokens-chatcmpl-{name}", family.model, prompt, choices, return_token_ids=gen_prompt_ids
            )
            if send_prompt_tokens:
                body["prompt_tokens"] = len(prompt)
            if send_prompt_ids:
                body["prompt_token_ids"] = list(prompt)
            if send_chat_request:
                body["chat_request"] = copy.deepcopy(chat_request)
            if patch is not None:
                patch(body, 0)
            return [{"request": _http(CHAT_DERENDER, body), "state_source": "none"}]

        self._add(DerenderCase(name, config, "batch", "chat", chat_request, build, len(outs), error))

    def chat_stream(
        self,
        name: str,
        config: str,
        chat_request: dict[str, Any],
        outs: Sequence[Out],
        chunking: str = "one",
        *,
        usage_chunk: bool = False,
        continuous_usage: bool = False,
        send_chat_request: bool = True,
        send_prompt_ids: bool = True,
        send_prompt_tokens: bool = True,
        gen_prompt_ids: bool = False,
        finish_only_chunk: bool = False,
        model: str | None = "default",
        max_calls: int | None = None,
        patch: Patch | None = None,
        error: bool = False,
    ) -> None:
        """One stream per output (interleaved round-robin by chunk when several), the finish_reason on the
        last token chunk (or on an extra token-less chunk with `finish_only_chunk`), then optionally a
        usage-only chunk (`choices: []`)."""
        cfg = CONFIGS[config]
        family = FAMILIES[cfg.family]
        enc = self.enc[cfg.family]
        outputs = [(o, enc.ids(o.segs)) for o in outs]
        for _o, ids in outputs:
            if chunking == "one":
                assert len(ids) <= MAX_ONE_PER_CHUNK_TOKENS, (name, len(ids))

        def build(prompts: list[list[int]]) -> list[CallSpec]:
            prompt = prompts[0] if prompts else []
            rid = f"generate-tokens-chatcmpl-{name}"
            lanes: list[list[dict[str, Any]]] = []
            total = 0
            for o, ids in outputs:
                lps = synth_logprobs(enc, ids, o.logprobs, _seed(name, o.index)) if o.logprobs else None
                sizes = chunk_sizes(len(ids), chunking, _seed(name, o.index, chunking))
                lane: list[dict[str, Any]] = []
                start = 0
                for k, size in enumerate(sizes):
                    last = k == len(sizes) - 1 and not finish_only_chunk
                    part = ids[start : start + size]
                    lane.append(
                        gen_choice(
                            o.index,
                            part,
                            o.finish_reason if last else None,
                            o.stop_reason if last else None,
                            lps[start : start + size] if lps is not None else None,
                            len(ids) if last else None,
                        )
                    )
                    start += size
                if finish_only_chunk:
                    lane.append(gen_choice(o.index, [], o.finish_reason, o.stop_reason, None, len(ids)))
                lanes.append(lane)
                total += len(ids)
            choices: list[dict[str, Any]] = []
            for k in range(max(len(lane) for lane in lanes)):
                choices += [lane[k] for lane in lanes if k < len(lane)]
            chunks: list[dict[str, Any]] = []
            seen = 0
            for k, choice in enumerate(choices):
                seen += len(choice["token_ids"] or [])
                chunks.append(
                    gen_chunk(
                        rid,
                        [choice],
                        usage(len(prompt), seen) if continuous_usage else None,
                        prompt if gen_prompt_ids and k == 0 else None,
                    )
                )
            if usage_chunk:
                chunks.append(gen_chunk(rid, [], usage(len(prompt), total)))
            bodies = []
            for chunk in chunks[:max_calls]:
                body: dict[str, Any] = {"stream": True}
                if model is not None:
                    body["model"] = family.model if model == "default" else model
                body["generate_chunk"] = chunk
                if send_prompt_tokens:
                    body["prompt_tokens"] = len(prompt)
                if send_prompt_ids:
                    body["prompt_token_ids"] = list(prompt)
                if send_chat_request:
                    body["chat_request"] = copy.deepcopy(chat_request)
                bodies.append(body)
            return _stream_specs(CHAT_DERENDER, bodies, patch)

        self._add(DerenderCase(name, config, "stream", "chat", chat_request, build, len(outs), error))

    # completions -----------------------------------------------------------------------------------
    def cmpl_batch(
        self,
        name: str,
        config: str,
        completion_request: dict[str, Any],
        outs: Sequence[Sequence[Out]],
        *,
        send_completion_request: bool = True,
        send_prompt_ids: bool = True,
        send_prompt_tokens: bool = True,
        model: str | None = "default",
        patch: Patch | None = None,
        error: bool = False,
    ) -> None:
        """One generate response per prompt of `completion_request` (each with its outputs as choices)."""
        cfg = CONFIGS[config]
        family = FAMILIES[cfg.family]
        enc = self.enc[cfg.family]
        per_prompt = [[(o, enc.ids(o.segs)) for o in group] for group in outs]

        def build(prompts: list[list[int]]) -> list[CallSpec]:
            responses = []
            for p, group in enumerate(per_prompt):
                prompt = prompts[p] if p < len(prompts) else []
                choices = [
                    gen_choice(
                        o.index,
                        ids,
                        o.finish_reason,
                        o.stop_reason,
                        synth_logprobs(enc, ids, o.logprobs, _seed(name, p, o.index)) if o.logprobs else None,
                        len(ids),
                    )
                    for o, ids in group
                ]
                responses.append(
                    gen_response(
                        f"generate-tokens-cmpl-{name}-{p}",
                        family.model,
                        prompt,
                        choices,
                        return_token_ids=bool(completion_request.get("return_token_ids")),
                    )
                )
            body: dict[str, Any] = {}
            if model is not None:
                body["model"] = family.model if model == "default" else model
            body["generate_responses"] = responses
            if send_prompt_tokens:
                body["prompt_tokens"] = [len(p) for p in prompts[: len(per_prompt)]]
            if send_prompt_ids:
                body["prompt_token_ids"] = [list(p) for p in prompts[: len(per_prompt)]]
            if send_completion_request:
                body["completion_request"] = copy.deepcopy(completion_request)
            if patch is not None:
                patch(body, 0)
            return [{"request": _http(CMPL_DERENDER, body), "state_source": "none"}]

        n = sum(len(g) for g in outs)
        self._add(DerenderCase(name, config, "batch", "completions", completion_request, build, n, error))

    def cmpl_stream(
        self,
        name: str,
        config: str,
        completion_request: dict[str, Any],
        out: Out,
        chunking: str = "one",
        *,
        usage_chunk: bool = False,
        send_completion_request: bool = True,
        send_prompt_ids: bool = True,
        gen_prompt_ids: bool = False,
        max_calls: int | None = None,
        patch: Patch | None = None,
        error: bool = False,
    ) -> None:
        cfg = CONFIGS[config]
        family = FAMILIES[cfg.family]
        enc = self.enc[cfg.family]
        ids = enc.ids(out.segs)
        if chunking == "one":
            assert len(ids) <= MAX_ONE_PER_CHUNK_TOKENS, (name, len(ids))

        def build(prompts: list[list[int]]) -> list[CallSpec]:
            prompt = prompts[0] if prompts else []
            rid = f"generate-tokens-cmpl-{name}-0"
            lps = synth_logprobs(enc, ids, out.logprobs, _seed(name, 0)) if out.logprobs else None
            sizes = chunk_sizes(len(ids), chunking, _seed(name, 0, chunking))
            chunks = []
            start = 0
            for k, size in enumerate(sizes):
                last = k == len(sizes) - 1
                choice = gen_choice(
                    0,
                    ids[start : start + size],
                    out.finish_reason if last else None,
                    out.stop_reason if last else None,
                    lps[start : start + size] if lps is not None else None,
                    len(ids) if last else None,
                )
                chunks.append(gen_chunk(rid, [choice], None, prompt if gen_prompt_ids and k == 0 else None))
                start += size
            if usage_chunk:
                chunks.append(gen_chunk(rid, [], usage(len(prompt), len(ids))))
            bodies = []
            for chunk in chunks[:max_calls]:
                body: dict[str, Any] = {
                    "stream": True,
                    "model": family.model,
                    "generate_chunk": chunk,
                    "prompt_tokens": len(prompt),
                }
                if send_prompt_ids:
                    body["prompt_token_ids"] = list(prompt)
                if send_completion_request:
                    body["completion_request"] = copy.deepcopy(completion_request)
                bodies.append(body)
            return _stream_specs(CMPL_DERENDER, bodies, patch)

        self._add(DerenderCase(name, config, "stream", "completions", completion_request, build, 1, error))

    # ---------------------------------------------------------------------------------------------
    def chat_all(
        self,
        name: str,
        config: str,
        chat_request: dict[str, Any],
        outs: Sequence[Out],
        variants: str = "b1r",
        *,
        usage_on_random: bool = True,
        **kw: Any,
    ) -> None:
        """Batch (`b`), one-token-per-chunk stream (`1`) and random-chunk stream (`r`) of the same outputs.
        Stream variants carry `stream: true` in the chat_request (and include_usage on the random one)."""
        if "b" in variants:
            self.chat_batch(f"{name}_batch", config, chat_request, outs, **kw)
        if "1" in variants:
            self.chat_stream(f"{name}_stream1", config, streaming(chat_request), outs, "one", **kw)
        if "r" in variants:
            self.chat_stream(
                f"{name}_streamr",
                config,
                streaming(chat_request, usage=usage_on_random),
                outs,
                "random",
                usage_chunk=usage_on_random,
                **kw,
            )

    def _add(self, case: DerenderCase) -> None:
        assert case.config in DERENDER_CONFIGS, case.config
        assert all(c.name != case.name for c in self.cases), case.name
        self.cases.append(case)


def streaming(chat_request: dict[str, Any], usage: bool = False, continuous: bool = False) -> dict[str, Any]:
    """The render body of the same request sent with stream=true (and stream_options when asked)."""
    out = dict(chat_request)
    out["stream"] = True
    if usage or continuous:
        opts: dict[str, Any] = {"include_usage": True}
        if continuous:
            opts["continuous_usage_stats"] = True
        out["stream_options"] = opts
    return out


def chat(messages: list[dict[str, Any]], model: str = "tinyqwen3", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **extra}


def cmpl(prompt: Any, model: str = "tinyqwen3", **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, **extra}


# -- the corpus -------------------------------------------------------------------------------------------

Q = QWEN3
IM_END = Q.eos
THINK, END_THINK = Q.think, Q.end_think
TC, END_TC = Q.tool_call, Q.end_tool_call
TOOLS = [WEATHER_TOOL]
ALL_TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

REASON = "The user greets me and asks how I am. I should answer politely, briefly, and offer help."
CONTENT = "Hello! I'm doing well, thank you. How can I help you today?"
REASON_TOOL = "The user wants the weather in Paris. I will call get_weather with the city and unit."
REASON_UNI = (
    "Der Nutzer schreibt: Grüße aus Köln! 日本語のテキストも含まれています。"
    "Emoji: 👋🏽🎉🧪👩‍👩‍👧‍👦 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 — naïve café ☕."
)
CONTENT_UNI = "こんにちは！🎉 Привет, мир! 안녕하세요 — 東京は晴れです ☀️🌈 e\u0301 (NFD) 🇫🇷🇯🇵"


def think(text: str) -> tuple[Seg, ...]:
    return (THINK, "\n" + text + "\n", END_THINK, "\n\n")


def tool(name: str, arguments: Any, raw: str | None = None) -> tuple[Seg, ...]:
    body = raw if raw is not None else json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return (TC, "\n" + body + "\n", END_TC)


WEATHER_PARIS = tool("get_weather", {"city": "Paris", "unit": "celsius"})
WEATHER_ROME = tool("get_weather", {"city": "Rome"})
SEARCH_SHOES = tool(
    "search_products",
    {
        "query": "red shoes",
        "filters": {"price": {"max": 50, "min": 10.5}, "brands": ["Acme", "Zeta"], "in_stock": True},
        "limit": 5,
    },
)


def _qwen_cases(b: CorpusBuilder) -> None:
    hi = [U("Hi, how are you?")]
    weather = [S("You are a helpful assistant."), U("What's the weather in Paris? Think first.")]
    weather2 = [U("Weather in Paris and Rome, and find me red shoes.")]

    # reasoning then content / one tool call / several / content before a tool call
    b.chat_all("reasoning_content", "parsers", chat(hi), [Out((*think(REASON), CONTENT, IM_END))])
    b.chat_all(
        "reasoning_tool_call",
        "parsers",
        chat(weather, tools=TOOLS),
        [Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END))],
    )
    b.chat_all(
        "multi_tool_calls",
        "parsers",
        chat(weather2, tools=ALL_TOOLS),
        [Out((*think("Three calls are needed."), *WEATHER_PARIS, "\n", *WEATHER_ROME, "\n", *SEARCH_SHOES, IM_END))],
    )
    b.chat_all(
        "content_then_tool_call",
        "parsers",
        chat(weather, tools=TOOLS),
        [Out((*think(REASON_TOOL), "Let me check the weather for you.\n\n", *WEATHER_PARIS, IM_END))],
    )
    b.chat_all(
        "malformed_tool_json",
        "parsers",
        chat(weather, tools=TOOLS),
        [
            Out(
                (
                    *think(REASON_TOOL),
                    *tool("", None, raw='{"name": "get_weather", "arguments": {"city": "Paris", "unit": }'),
                    IM_END,
                )
            )
        ],
    )
    b.chat_all(
        "tool_call_unknown_function",
        "parsers",
        chat(weather, tools=TOOLS),
        [Out((*think("Call a tool."), *tool("get_time", {"tz": "CET"}), IM_END))],
        variants="b1",
    )
    # markup arriving as ordinary tokens, so chunk boundaries fall inside "<think>" / "<tool_call>"
    b.chat_all(
        "split_think_text",
        "parsers",
        chat(hi),
        [Out((("<", "think", ">"), "\nShort thought.\n", ("</", "think", ">"), "\n\n", CONTENT, IM_END))],
    )
    b.chat_all(
        "split_tool_call_text",
        "parsers",
        chat(weather, tools=TOOLS),
        [
            Out(
                (
                    *think(REASON_TOOL),
                    "Checking.",
                    ("<", "tool", "_call", ">"),
                    '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
                    ("</", "tool", "_call", ">"),
                    IM_END,
                )
            )
        ],
    )
    b.chat_all(
        "content_with_lt",
        "parsers",
        chat(hi),
        [Out((*think("Compare numbers."), "Yes: 3 <tool 5 and a <think-tank> < b; done.", IM_END))],
        variants="b1",
    )
    # multi-byte characters split across tokens (and chunks)
    b.chat_all(
        "unicode",
        "parsers",
        chat([U("Grüße! 日本語で天気を教えて 👋🏽")], tools=TOOLS),
        [
            Out(
                (
                    *think(REASON_UNI),
                    CONTENT_UNI,
                    "\n\n",
                    *tool("get_weather", {"city": "東京", "unit": "celsius"}),
                    IM_END,
                )
            )
        ],
    )
    # long reasoning (~1500 tokens): batch and random chunks only
    b.chat_all(
        "long_reasoning", "parsers", chat(hi), [Out((*think(long_text(1000, seed=11)), CONTENT, IM_END))], variants="br"
    )
    # enable_thinking false: reasoning closed in the prompt
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    b.chat_all("thinking_disabled", "parsers", chat(hi, **no_think), [Out((CONTENT, IM_END))], variants="b1")
    b.chat_all(
        "thinking_disabled_tool_call",
        "parsers",
        chat(weather, tools=TOOLS, **no_think),
        [Out(("Sure.\n", *WEATHER_PARIS, IM_END))],
        variants="b1r",
    )
    b.chat_all(
        "thinking_disabled_stray_end_think",
        "parsers",
        chat(hi, **no_think),
        [Out(("Odd: ", END_THINK, " after.", IM_END))],
        variants="b1",
    )
    # no <think> start token: reasoning until </think>; no markers at all
    b.chat_all(
        "no_think_start",
        "parsers",
        chat(hi),
        [Out(("Reasoning without an opening tag.\n", END_THINK, "\n\n", CONTENT, IM_END))],
        variants="b1r",
    )
    b.chat_all("no_think_at_all", "parsers", chat(hi), [Out((CONTENT, IM_END))], variants="b1")
    b.chat_all("think_only_eos", "parsers", chat(hi), [Out((THINK, "\nHmm.\n", END_THINK, IM_END))], variants="b1")
    # finish reasons
    b.chat_all(
        "length_in_reasoning",
        "parsers",
        chat(hi, max_tokens=24),
        [Out((THINK, "\n" + long_text(40, seed=3)), finish_reason="length")],
        variants="b1",
    )
    b.chat_all(
        "length_in_tool_call",
        "parsers",
        chat(weather, tools=TOOLS, max_tokens=60),
        [Out((*think("Call it."), TC, '\n{"name": "get_weather", "arguments": {"city": "Par'), finish_reason="length")],
    )
    b.chat_all(
        "length_after_tool_call",
        "parsers",
        chat(weather, tools=TOOLS),
        [Out((*think("Call it."), *WEATHER_PARIS, "\n"), finish_reason="length")],
        variants="b1",
    )
    b.chat_all(
        "abort_mid_content",
        "parsers",
        chat(hi),
        [Out((*think(REASON), "Hello! I'm"), finish_reason="abort")],
        variants="b1",
    )
    end_id = "END_MARK"
    b.chat_all(
        "stop_reason_int",
        "parsers",
        chat(hi, stop_token_ids=[13]),
        [Out((*think(REASON), "The answer is 42", 13), stop_reason=13)],
        variants="b1",
    )
    b.chat_all(
        "stop_reason_int_unreported",
        "parsers",
        chat(hi, stop_token_ids=[13]),
        [Out((*think(REASON), "The answer is 42", 13), stop_reason=None)],
        variants="b1",
    )
    b.chat_all(
        "stop_reason_endoftext",
        "parsers",
        chat(hi),
        [Out((*think(REASON), CONTENT, Q.endoftext), stop_reason=None)],
        variants="b1",
    )
    b.chat_all(
        "stop_reason_eos_ignore_eos",
        "parsers",
        chat(hi, ignore_eos=True),
        [Out((*think(REASON), CONTENT, IM_END))],
        variants="b1",
    )
    b.chat_stream(
        "stop_reason_string_stream1",
        "parsers",
        streaming(chat(hi)),
        [Out((*think(REASON), "The answer is 42. " + end_id), stop_reason=end_id)],
    )
    # stop strings, include_stop_str_in_output, min_tokens (batch only: streaming derender rejects `stop`)
    stop_out = Out((*think(REASON), "alpha END beta gamma END delta"), stop_reason="END")
    b.chat_batch("stop_string_reported_batch", "parsers", chat(hi, stop=["END"]), [stop_out])
    b.chat_batch(
        "stop_string_unreported_batch", "parsers", chat(hi, stop=["END", "zzz"]), [Out(stop_out.segs, stop_reason=None)]
    )
    b.chat_batch(
        "stop_string_include_batch", "parsers", chat(hi, stop=["END"], include_stop_str_in_output=True), [stop_out]
    )
    head = b.enc["qwen3"].ids((*think(REASON), "alpha END beta"))
    b.chat_batch(
        "stop_string_min_tokens_batch",
        "parsers",
        chat(hi, stop=["END"], min_tokens=len(head)),
        [Out(stop_out.segs, stop_reason=None)],
    )
    b.chat_batch(
        "stop_string_min_tokens_all_batch",
        "parsers",
        chat(hi, stop=["END"], min_tokens=400),
        [Out(stop_out.segs, stop_reason=None)],
    )
    b.chat_batch(
        "stop_string_in_reasoning_batch",
        "parsers",
        chat(hi, stop=["gamma"]),
        [Out((THINK, "\nalpha beta gamma delta"), stop_reason=None)],
    )
    b.chat_batch(
        "stop_token_include_batch",
        "parsers",
        chat(hi, include_stop_str_in_output=True),
        [Out((*think(REASON), CONTENT, IM_END))],
    )
    b.chat_batch(
        "stop_string_finish_length_batch",
        "parsers",
        chat(hi, stop=["END"]),
        [Out(stop_out.segs, finish_reason="length")],
    )
    # logprobs (GenerateLogProbs, byte-fallback tokens among the sampled and the candidates)
    b.chat_all(
        "logprobs_top",
        "parsers",
        chat([U("Emoji please")], logprobs=True, top_logprobs=3),
        [Out((*think("Emoji: 👋🏽🎉"), "Sure: 🧪👩‍👩‍👧‍👦 日本 done", IM_END), logprobs=5)],
    )
    b.chat_all(
        "logprobs_no_top",
        "parsers",
        chat(hi, logprobs=True),
        [Out((*think("ok"), "Fine 👍", IM_END), logprobs=3)],
        variants="b1",
    )
    b.chat_all(
        "logprobs_all_candidates",
        "parsers",
        chat(hi, logprobs=True, top_logprobs=-1),
        [Out((*think("ok"), "Fine 🎉", IM_END), logprobs=4)],
        variants="b1",
    )
    b.chat_all(
        "logprobs_not_requested", "parsers", chat(hi), [Out((*think("ok"), "Fine", IM_END), logprobs=3)], variants="b1"
    )
    b.chat_all(
        "logprobs_tool_call",
        "parsers",
        chat(weather, tools=TOOLS, logprobs=True, top_logprobs=2),
        [Out((*think("Call."), *WEATHER_PARIS, IM_END), logprobs=3)],
        variants="b1r",
    )
    # include_reasoning false (hides logprobs and token ids too)
    b.chat_all(
        "include_reasoning_false",
        "parsers",
        chat(hi, include_reasoning=False, logprobs=True, top_logprobs=2, return_token_ids=True),
        [Out((*think(REASON), CONTENT, IM_END), logprobs=3)],
    )
    b.chat_all(
        "include_reasoning_false_tool_call",
        "parsers",
        chat(weather, tools=TOOLS, include_reasoning=False),
        [Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END))],
        variants="b1",
    )
    # tool_choice variants
    b.chat_all(
        "parallel_tool_calls_false",
        "parsers",
        chat(weather2, tools=TOOLS, parallel_tool_calls=False),
        [Out((*think("Two calls."), *WEATHER_PARIS, "\n", *WEATHER_ROME, IM_END))],
    )
    b.chat_all(
        "tool_choice_none",
        "parsers",
        chat(weather, tools=TOOLS, tool_choice="none"),
        [Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END))],
        variants="b1",
    )
    named = {"type": "function", "function": {"name": "get_weather"}}
    b.chat_all(
        "tool_choice_named",
        "parsers",
        chat(weather, tools=TOOLS, tool_choice=named),
        [Out((*think(REASON_TOOL), '{"city": "Paris", "unit": "celsius"}', IM_END))],
    )
    b.chat_all(
        "tool_choice_named_no_think",
        "parsers",
        chat(weather, tools=TOOLS, tool_choice=named),
        [Out(('{"city": "Rome"}', IM_END))],
        variants="b1",
    )
    b.chat_all(
        "tool_choice_required",
        "parsers",
        chat(weather2, tools=ALL_TOOLS, tool_choice="required"),
        [
            Out(
                (
                    *think("Two calls."),
                    '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                    '{"name": "search_products", "parameters": {"query": "red shoes", "limit": 3}}]',
                    IM_END,
                )
            )
        ],
    )
    b.chat_all(
        "tool_choice_auto_explicit",
        "parsers",
        chat(weather, tools=TOOLS, tool_choice="auto"),
        [Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END))],
        variants="b",
    )
    b.chat_all(
        "tools_with_history",
        "parsers",
        chat(
            [
                U("What's the weather in Paris?"),
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            ],
            tools=TOOLS,
        ),
        [Out((*think("Now Rome."), *WEATHER_ROME, IM_END))],
        variants="b1",
    )
    # return_token_ids (generate then also returns the prompt ids)
    b.chat_all(
        "return_token_ids",
        "parsers",
        chat(hi, return_token_ids=True),
        [Out((*think(REASON), CONTENT, IM_END))],
        variants="b1",
        gen_prompt_ids=True,
    )
    # usage: continuous usage stats on every chunk, and a usage chunk without request prompt_tokens
    b.chat_stream(
        "continuous_usage_stream1",
        "parsers",
        streaming(chat(hi), continuous=True),
        [Out((*think("ok"), CONTENT, IM_END))],
        "one",
        usage_chunk=True,
        continuous_usage=True,
    )
    b.chat_stream(
        "usage_no_prompt_tokens_streamr",
        "parsers",
        streaming(chat(hi), usage=True),
        [Out((*think("ok"), CONTENT, IM_END))],
        "random",
        usage_chunk=True,
        send_prompt_tokens=False,
    )
    # a finish-only chunk (no tokens) after the tool call: the parser must flush on it
    b.chat_stream(
        "finish_only_chunk_stream1",
        "parsers",
        streaming(chat(weather, tools=TOOLS)),
        [Out((*think("Call."), *WEATHER_PARIS))],
        "one",
        finish_only_chunk=True,
    )
    b.chat_stream(
        "finish_only_chunk_content_streamr",
        "parsers",
        streaming(chat(hi)),
        [Out((*think("ok"), CONTENT), finish_reason="abort")],
        "random",
        finish_only_chunk=True,
    )
    # n=2: two choices interleaved, one stream_state per choice index
    b.chat_stream(
        "n2_interleaved_stream1",
        "parsers",
        streaming(chat(weather, tools=TOOLS, n=2), usage=True),
        [
            Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END), index=0),
            Out((*think("Just answer."), "It is sunny in Paris.", IM_END), index=1),
        ],
        "one",
        usage_chunk=True,
    )
    b.chat_batch(
        "n2_batch",
        "parsers",
        chat(weather, tools=TOOLS, n=2),
        [
            Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END), index=0),
            Out((*think("Just answer."), "It is sunny in Paris.", IM_END), index=1),
        ],
    )
    # model omitted from the derender body (defaults to the served name); no prompt ids in batch
    b.chat_batch("model_omitted_batch", "parsers", chat(hi), [Out((*think(REASON), CONTENT, IM_END))], model=None)
    b.chat_batch(
        "no_prompt_ids_batch",
        "parsers",
        chat(hi),
        [Out((*think(REASON), CONTENT, IM_END))],
        send_prompt_ids=False,
        send_prompt_tokens=False,
    )
    b.chat_batch(
        "gen_prompt_ids_only_batch",
        "parsers",
        chat(hi),
        [Out((*think(REASON), CONTENT, IM_END))],
        send_prompt_ids=False,
        gen_prompt_ids=True,
    )

    # -- plain: no parsers
    plain_out = [Out((*think(REASON), CONTENT, IM_END))]
    b.chat_all("plain_reasoning_content", "plain", chat(hi), plain_out)
    # a plain server cannot render tools with auto tool choice: the request has none
    b.chat_all(
        "plain_tool_call", "plain", chat(weather), [Out((*think(REASON_TOOL), *WEATHER_PARIS, IM_END))], variants="b1"
    )
    b.chat_all(
        "plain_no_chat_request",
        "plain",
        chat(hi),
        plain_out,
        variants="b1",
        send_chat_request=False,
        send_prompt_ids=False,
    )
    b.chat_all(
        "plain_skip_special_false",
        "plain",
        chat(hi, skip_special_tokens=False, include_stop_str_in_output=True),
        [Out((*think(REASON), CONTENT, Q.endoftext, " tail", IM_END))],
        variants="b1",
    )
    b.chat_all(
        "plain_spaces_between_special_false",
        "plain",
        chat(hi, skip_special_tokens=False, spaces_between_special_tokens=False),
        [Out((THINK, "a", Q.endoftext, "b", 151644, "c", IM_END))],
        variants="b1",
    )
    b.chat_all(
        "plain_unicode_logprobs",
        "plain",
        chat([U("Emoji")], logprobs=True, top_logprobs=4),
        [Out(("Grüße 👋🏽🎉 日本語 ", CONTENT_UNI, IM_END), logprobs=6)],
    )
    b.chat_batch(
        "plain_stop_string_batch",
        "plain",
        chat(hi, stop=["gamma"]),
        [Out(("alpha beta gamma delta",), stop_reason="gamma")],
    )
    b.chat_stream(
        "plain_return_token_ids_stream1",
        "plain",
        streaming(chat(hi, return_token_ids=True), usage=True),
        plain_out,
        "one",
        usage_chunk=True,
        gen_prompt_ids=True,
    )
    b.chat_stream(
        "plain_length_streamr",
        "plain",
        streaming(chat(hi, max_tokens=30)),
        [Out((CONTENT_UNI,), finish_reason="length")],
        "random",
    )
    b.chat_stream(
        "plain_stop_token_id_stream1",
        "plain",
        streaming(chat(hi, stop_token_ids=[13])),
        [Out((CONTENT, 13), stop_reason=13)],
    )


def _completion_cases(b: CorpusBuilder) -> None:
    text = "There was a quiet river that ran through the valley"
    b.cmpl_batch(
        "cmpl_three_prompts_batch",
        "plain",
        cmpl(
            ["Once upon a time", "The capital of France is", "日本語の"],
            logprobs=2,
            return_token_ids=True,
            max_tokens=40,
        ),
        [
            [Out((" " + text + ".",), finish_reason="length", logprobs=4)],
            [Out((" Paris.", Q.endoftext), logprobs=4)],
            [Out(("テキスト 👋🏽 です", Q.endoftext), logprobs=4)],
        ],
    )
    b.cmpl_batch(
        "cmpl_stop_string_batch",
        "plain",
        cmpl("Count:", stop=["five"], include_stop_str_in_output=False),
        [[Out((" one two three four five six",), stop_reason="five")]],
    )
    b.cmpl_batch(
        "cmpl_stop_string_include_batch",
        "plain",
        cmpl("Count:", stop=["five"], include_stop_str_in_output=True),
        [[Out((" one two three four five six",), stop_reason=None)]],
    )
    b.cmpl_batch(
        "cmpl_n2_batch",
        "plain",
        cmpl("Hello", n=2, logprobs=0),
        [
            [
                Out((" world!", Q.endoftext), index=0, logprobs=2),
                Out((" there, friend", Q.endoftext), index=1, logprobs=2),
            ]
        ],
    )
    b.cmpl_batch(
        "cmpl_skip_special_false_batch",
        "plain",
        cmpl("Hi", skip_special_tokens=False),
        [
            [
                Out(
                    (" <", THINK, " x ", IM_END, " y", Q.endoftext),
                )
            ]
        ],
    )
    b.cmpl_batch(
        "cmpl_parsers_config_batch",
        "parsers",
        cmpl("Think:"),
        [
            [
                Out(
                    (THINK, " reasoning ", END_THINK, " answer", Q.endoftext),
                )
            ]
        ],
    )
    b.cmpl_batch(
        "cmpl_no_request_batch",
        "plain",
        cmpl(["A", "B"]),
        [
            [
                Out(
                    (" alpha", Q.endoftext),
                )
            ],
            [Out((" beta gamma",), finish_reason="length")],
        ],
        send_completion_request=False,
        send_prompt_ids=False,
        send_prompt_tokens=False,
    )
    b.cmpl_batch(
        "cmpl_logprobs_all_batch", "plain", cmpl("Hi", logprobs=-1), [[Out((" hello 🎉", Q.endoftext), logprobs=3)]]
    )
    b.cmpl_stream(
        "cmpl_logprobs_stream1",
        "plain",
        cmpl("Emoji:", stream=True, logprobs=2),
        Out((" 👋🏽🎉 日本語 and more", Q.endoftext), logprobs=4),
    )
    b.cmpl_stream(
        "cmpl_logprobs_streamr",
        "plain",
        cmpl("Story:", stream=True, logprobs=1, stream_options={"include_usage": True}),
        Out((" " + long_text(120, seed=5) + " 👋🏽", Q.endoftext), logprobs=3),
        "random",
        usage_chunk=True,
    )
    b.cmpl_stream(
        "cmpl_plain_stream1",
        "plain",
        cmpl("Hello", stream=True),
        Out(
            (" world, this is a test.", Q.endoftext),
        ),
        send_completion_request=False,
        send_prompt_ids=False,
    )
    b.cmpl_stream(
        "cmpl_return_token_ids_stream1",
        "plain",
        cmpl("Hello", stream=True, return_token_ids=True),
        Out((" world", IM_END), stop_reason=IM_END),
        gen_prompt_ids=True,
    )
    b.cmpl_stream(
        "cmpl_parsers_config_streamr",
        "parsers",
        cmpl("Think:", stream=True),
        Out(
            (THINK, " reasoning ", END_THINK, " answer 日本", Q.endoftext),
        ),
        "random",
    )


def _deepseek_cases(b: CorpusBuilder) -> None:
    d = DEEPSEEK
    hi = [U("Hi, how are you?")]

    def dchat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return chat(messages, model="tinydeepseek", **extra)

    # the deepseek template pre-opens "<think>\n" in the prompt
    b.chat_all(
        "deepseek_reasoning_content",
        "deepseek",
        dchat(hi),
        [Out((REASON + "\n", d.end_think, "\n\n" + CONTENT, d.eos))],
    )
    b.chat_all(
        "deepseek_think_in_output",
        "deepseek",
        dchat(hi),
        [Out((d.think, "\n" + REASON + "\n", d.end_think, "\n\n" + CONTENT, d.eos))],
        variants="b1",
    )
    b.chat_all(
        "deepseek_thinking_disabled",
        "deepseek",
        dchat(hi, chat_template_kwargs={"enable_thinking": False}),
        [Out((CONTENT, d.eos))],
        variants="b1",
    )
    b.chat_all(
        "deepseek_length_in_reasoning",
        "deepseek",
        dchat(hi, max_tokens=20),
        [Out((long_text(30, seed=9),), finish_reason="length")],
        variants="b1",
    )
    b.chat_all(
        "deepseek_unicode_logprobs",
        "deepseek",
        dchat([U("Emoji")], logprobs=True, top_logprobs=2),
        [Out((REASON_UNI, d.end_think, CONTENT_UNI, d.eos), logprobs=3)],
        variants="b1r",
    )
    b.chat_all(
        "deepseek_include_reasoning_false",
        "deepseek",
        dchat(hi, include_reasoning=False),
        [Out((REASON, d.end_think, CONTENT, d.eos))],
        variants="b1",
    )
    b.chat_all(
        "deepseek_multi_turn",
        "deepseek",
        dchat([S("Be nice."), U("Hi"), A("Hello!"), U("Bye")]),
        [Out(("They leave.", d.end_think, "Goodbye!", d.eos))],
        variants="b1",
    )


def _error_cases(b: CorpusBuilder) -> None:
    hi = [U("Hi")]
    req = chat(hi)
    out = [Out((*think("ok"), CONTENT, IM_END))]

    def delete(*keys: str) -> Patch:
        def patch(body: dict[str, Any], i: int) -> None:
            for k in keys:
                body.pop(k, None)

        return patch

    def state(**fields: Any) -> Patch:
        def patch(body: dict[str, Any], i: int) -> None:
            body["stream_state"] = fields

        return patch

    def gen(fn: Callable[[dict[str, Any]], None], key: str = "generate_response") -> Patch:
        def patch(body: dict[str, Any], i: int) -> None:
            fn(body[key])

        return patch

    def choice0(fn: Callable[[dict[str, Any]], None], key: str = "generate_response") -> Patch:
        return gen(lambda g: fn(g["choices"][0]), key)

    first = {"max_calls": 1}
    # missing chat_request / prompt_token_ids with a parser configured
    b.chat_batch("err_batch_missing_chat_request", "parsers", req, out, send_chat_request=False, error=True)
    b.chat_stream(
        "err_stream_missing_chat_request", "parsers", streaming(req), out, send_chat_request=False, error=True, **first
    )
    b.chat_stream(
        "err_stream_missing_prompt_token_ids",
        "parsers",
        streaming(req),
        out,
        send_prompt_ids=False,
        gen_prompt_ids=True,
        error=True,
        **first,
    )
    b.chat_stream(
        "err_stream_missing_both",
        "parsers",
        streaming(req),
        out,
        send_prompt_ids=False,
        send_chat_request=False,
        error=True,
        **first,
    )

    # more than one choice in a stream chunk
    def two_choices(body: dict[str, Any], i: int) -> None:
        choices = body["generate_chunk"]["choices"]
        choices.append({**copy.deepcopy(choices[0]), "index": 1})

    b.chat_stream("err_stream_two_choices", "parsers", streaming(req), out, patch=two_choices, error=True, **first)
    b.chat_stream("err_stream_two_choices_plain", "plain", streaming(req), out, patch=two_choices, error=True, **first)
    b.cmpl_stream(
        "err_cmpl_stream_two_choices",
        "plain",
        cmpl("Hi", stream=True),
        Out((" a b c", IM_END)),
        patch=two_choices,
        error=True,
        max_calls=1,
    )
    # stop strings in streaming
    b.chat_stream("err_stream_stop_strings", "parsers", streaming(chat(hi, stop=["END"])), out, error=True, **first)
    b.chat_stream("err_stream_stop_string_plain", "plain", streaming(chat(hi, stop="END")), out, error=True, **first)
    b.cmpl_stream(
        "err_cmpl_stream_stop_strings",
        "plain",
        cmpl("Hi", stream=True, stop=["x"]),
        Out((" a b c", IM_END)),
        error=True,
        max_calls=1,
    )
    # stream_state validation
    ids3 = b.enc["qwen3"].ids((THINK, "\nok"))[:3]
    b.chat_stream(
        "err_stream_chunk_lens_mismatch",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(output_token_ids=ids3, output_chunk_lens=[1, 1], role_sent=True),
    )
    b.chat_stream(
        "err_stream_chunk_lens_zero",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(output_token_ids=ids3, output_chunk_lens=[3, 0], role_sent=True),
    )
    b.chat_stream(
        "err_stream_prev_tokens_too_many",
        "plain",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(prev_tokens=["a"] * 1025, role_sent=True),
    )
    b.chat_stream(
        "err_stream_logprob_context_too_long",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(logprob_context_token_ids=[1, 2, 3, 4, 5]),
    )
    b.chat_stream(
        "err_stream_negative_prefix_offset",
        "plain",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(prev_tokens=["a", "b"], prefix_offset=-1, read_offset=1),
    )
    b.chat_stream(
        "err_stream_negative_offsets",
        "plain",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(read_offset=-2, logprob_text_offset=-5),
    )
    b.cmpl_stream(
        "err_cmpl_stream_negative_text_offset",
        "plain",
        cmpl("Hi", stream=True),
        Out((" a b c", IM_END)),
        error=True,
        max_calls=1,
        patch=state(logprob_text_offset=-1),
    )
    b.chat_stream(
        "err_stream_state_wrong_types",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=state(output_token_ids="abc", role_sent="maybe"),
    )

    # output_mode text, empty / null token_ids, negative token ids
    def text_mode(g: dict[str, Any]) -> None:
        g["output_mode"] = "text"
        for c in g["choices"]:
            c["text"] = "hello"

    b.chat_batch("err_batch_output_mode_text", "parsers", req, out, patch=gen(text_mode), error=True)
    b.chat_stream(
        "err_stream_output_mode_text",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=gen(text_mode, "generate_chunk"),
    )
    b.chat_batch(
        "err_batch_empty_token_ids", "parsers", req, out, error=True, patch=choice0(lambda c: c.update(token_ids=[]))
    )
    b.chat_batch(
        "err_batch_null_token_ids", "plain", req, out, error=True, patch=choice0(lambda c: c.update(token_ids=None))
    )
    b.chat_batch(
        "err_batch_negative_token_id",
        "parsers",
        req,
        out,
        error=True,
        patch=choice0(lambda c: c["token_ids"].__setitem__(1, -3)),
    )
    b.cmpl_batch(
        "err_cmpl_batch_empty_token_ids",
        "plain",
        cmpl(["a", "b"]),
        [
            [
                Out(
                    (" x", IM_END),
                )
            ],
            [
                Out(
                    (" y", IM_END),
                )
            ],
        ],
        error=True,
        patch=lambda body, i: body["generate_responses"][1]["choices"][0].update(token_ids=[]),
    )
    # bounds: tokens vs max_model_len, top_logprobs vs max_logprobs
    b.chat_batch(
        "err_batch_too_many_tokens",
        "parsers",
        req,
        out,
        error=True,
        patch=choice0(lambda c: c.update(token_ids=[1234] * (MAX_MODEL_LEN + 1))),
    )
    b.chat_batch(
        "err_batch_prompt_token_ids_too_long",
        "plain",
        req,
        out,
        error=True,
        patch=lambda body, i: body.update(prompt_token_ids=[1234] * (MAX_MODEL_LEN + 1)),
    )
    b.chat_batch(
        "err_batch_top_logprobs_above_max",
        "parsers",
        chat(hi, logprobs=True, top_logprobs=5),
        [Out((*think("ok"), "Fine", IM_END), logprobs=MAX_LOGPROBS + 1)],
        error=True,
    )
    b.chat_batch(
        "batch_top_logprobs_at_max",
        "parsers",
        chat(hi, logprobs=True, top_logprobs=20),
        [Out((*think("ok"), "Fine", IM_END), logprobs=MAX_LOGPROBS)],
    )
    b.cmpl_batch(
        "err_cmpl_top_logprobs_above_max",
        "plain",
        cmpl("Hi", logprobs=3),
        [[Out((" x y", IM_END), logprobs=MAX_LOGPROBS + 1)]],
        error=True,
    )

    def too_long_state(body: dict[str, Any], i: int) -> None:
        n = MAX_MODEL_LEN - len(body["prompt_token_ids"])
        body["stream_state"] = {"role_sent": True, "output_token_ids": [1234] * n, "output_chunk_lens": [n]}

    b.chat_stream(
        "err_stream_too_many_tokens", "parsers", streaming(req), out, error=True, patch=too_long_state, **first
    )
    b.cmpl_stream(
        "err_cmpl_stream_prompt_too_long",
        "plain",
        cmpl("Hi", stream=True),
        Out((" a", IM_END)),
        error=True,
        max_calls=1,
        patch=lambda body, i: body.update(prompt_token_ids=[1234] * (MAX_MODEL_LEN + 1)),
    )
    # unknown model
    b.chat_batch("err_batch_unknown_model", "parsers", req, out, model="gpt-4o", error=True)
    b.chat_stream("err_stream_unknown_model", "parsers", streaming(req), out, model="gpt-4o", error=True, **first)
    b.cmpl_batch(
        "err_cmpl_unknown_model",
        "plain",
        cmpl("Hi"),
        [
            [
                Out(
                    (" x", IM_END),
                )
            ]
        ],
        model="nope",
        error=True,
    )
    # completions batch: empty list, length mismatches
    b.cmpl_batch(
        "err_cmpl_empty_generate_responses",
        "plain",
        cmpl("Hi"),
        [
            [
                Out(
                    (" x", IM_END),
                )
            ]
        ],
        error=True,
        patch=lambda body, i: body.update(generate_responses=[], prompt_tokens=None, prompt_token_ids=None),
    )
    b.cmpl_batch(
        "err_cmpl_prompt_tokens_length_mismatch",
        "plain",
        cmpl(["a", "b"]),
        [
            [
                Out(
                    (" x", IM_END),
                )
            ],
            [
                Out(
                    (" y", IM_END),
                )
            ],
        ],
        error=True,
        patch=lambda body, i: body.update(prompt_tokens=body["prompt_tokens"][:1]),
    )
    b.cmpl_batch(
        "err_cmpl_prompt_token_ids_length_mismatch",
        "plain",
        cmpl(["a", "b"]),
        [
            [
                Out(
                    (" x", IM_END),
                )
            ],
            [
                Out(
                    (" y", IM_END),
                )
            ],
        ],
        error=True,
        patch=lambda body, i: body["prompt_token_ids"].append([1, 2]),
    )
    # a stream chunk without "stream": true validates as a batch body
    b.chat_stream(
        "err_stream_flag_missing",
        "parsers",
        streaming(req),
        out,
        error=True,
        **first,
        patch=lambda body, i: body.pop("stream"),
    )
    b.chat_batch(
        "err_batch_stream_true", "parsers", req, out, error=True, patch=lambda body, i: body.update(stream=True)
    )
    # out-of-vocabulary ids in the replay buffer / in a plain-path delta
    b.chat_stream(
        "stream_state_out_of_vocab",
        "parsers",
        streaming(req),
        out,
        **first,
        patch=state(role_sent=True, output_token_ids=[999999], output_chunk_lens=[1]),
    )
    b.cmpl_stream(
        "cmpl_stream_out_of_vocab_delta",
        "plain",
        cmpl("Hi", stream=True),
        Out((" a", IM_END)),
        max_calls=1,
        patch=lambda body, i: body["generate_chunk"]["choices"][0].update(token_ids=[999999]),
    )
    # plain path: prompt ids and chat_request are optional; a stale state from another stream is accepted
    b.chat_stream(
        "plain_crafted_state_stream",
        "plain",
        streaming(req),
        out,
        max_calls=3,
        patch=lambda body, i: (
            body.update(
                stream_state={
                    "prev_tokens": ["Hello", "Ġworld"],
                    "prefix_offset": 0,
                    "read_offset": 2,
                    "role_sent": True,
                    "logprob_context_token_ids": [9707],
                }
            )
            if i == 1
            else None
        ),
    )


def build_corpus(encoders: Mapping[str, Encoder]) -> list[DerenderCase]:
    b = CorpusBuilder(encoders)
    _qwen_cases(b)
    _completion_cases(b)
    _deepseek_cases(b)
    _error_cases(b)
    return b.cases


def build_corpus_from_dirs(model_dirs: Mapping[str, str | Path]) -> dict[str, DerenderCase]:
    """`{family: model folder}` -> `{case name: case}`."""
    encoders = {family: Encoder(load_tokenizer(path)) for family, path in model_dirs.items()}
    return {c.name: c for c in build_corpus(encoders)}


# -- driving a stream like an llm-d client ---------------------------------------------------------------

Sender = Callable[[dict[str, Any]], tuple[int, Any]]


def drive(case: DerenderCase, prompts: list[list[int]], send: Sender) -> list[dict[str, Any]]:
    """Send every call of `case`, echoing each lane's returned `stream_state` into the next call of that
    lane. Returns [{request, state_source, status, response}] with the requests exactly as sent."""
    calls: list[dict[str, Any]] = []
    states: dict[int, Any] = {}
    for spec in case.build(prompts):
        request = copy.deepcopy(spec["request"])
        lane = stream_lane(request["json"])
        if spec["state_source"] == "previous":
            request["json"] = with_state(request["json"], copy.deepcopy(states.get(lane)))
        status, response = send(request)
        if case.kind == "stream" and status == 200 and isinstance(response, dict) and "stream_state" in response:
            states[lane] = response["stream_state"]
        calls.append({"request": request, "state_source": spec["state_source"], "status": status, "response": response})
    return calls


def prompt_ids_from_render(endpoint: str, status: int, body: Any) -> list[list[int]]:
    if status != 200:
        raise RuntimeError(f"render failed: {status} {body}")
    if endpoint == "chat":
        return [list(body["token_ids"])]
    return [list(r["token_ids"]) for r in body]


# -- golden files ------------------------------------------------------------------------------------


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def golden_record(case: DerenderCase, prompts: list[list[int]], calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "case": case.name,
        "config": case.config,
        "vllm_flags": CONFIGS[case.config].vllm_flags(),
        "vllm_version": VLLM_VERSION,
        "kind": case.kind,
        "endpoint": case.endpoint,
        "render": {"request": case.render_request(), "prompt_token_ids": prompts},
        "calls": calls,
    }


def dump_golden(record: dict[str, Any]) -> str:
    """Compact JSON with one line per call (goldens of long streams stay diffable and small)."""
    head = {k: v for k, v in record.items() if k != "calls"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "calls": [']
    calls = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in record["calls"]]
    lines.append(",\n".join(calls))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def iter_goldens() -> Iterator[dict[str, Any]]:
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


# -- comparison ----------------------------------------------------------------------------------------------

TOOL_ID = re.compile(r"^chatcmpl-tool-[0-9a-f]{16}$")
TOOL_ID_PLACEHOLDER = "<tool-call-id>"
OUR_STATE_PREFIX = "rs_"


def vllm_state_keys(state: Any) -> Any:
    """Our stream_state without our own `rs_*` keys (the state vLLM would send)."""
    if not isinstance(state, dict):
        return state
    return {k: v for k, v in state.items() if not k.startswith(OUR_STATE_PREFIX)}


def _tool_calls(body: Any) -> Iterator[dict[str, Any]]:
    """Every tool call object (batch message.tool_calls or stream delta.tool_calls) in a response."""
    if not isinstance(body, dict):
        return
    chunk = body.get("chunk", body)
    for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
        if not isinstance(choice, dict):
            continue
        holder = choice.get("message") or choice.get("delta") or {}
        if isinstance(holder, dict):
            for tc in holder.get("tool_calls") or []:
                if isinstance(tc, dict):
                    yield tc


def mask_tool_ids(body: Any) -> Any:
    """A copy with every tool-call id string (and stream_state.last_tool_call_ids entry) masked."""
    body = copy.deepcopy(body)
    for tc in _tool_calls(body):
        if isinstance(tc.get("id"), str):
            tc["id"] = TOOL_ID_PLACEHOLDER
    state = body.get("stream_state") if isinstance(body, dict) else None
    if isinstance(state, dict) and isinstance(state.get("last_tool_call_ids"), list):
        state["last_tool_call_ids"] = [
            TOOL_ID_PLACEHOLDER if isinstance(x, str) else x for x in state["last_tool_call_ids"]
        ]
    return body


class ToolIdTracker:
    """Checks our tool-call ids: `chatcmpl-tool-<16 hex>`, one id per tool-call index for the whole stream
    (per choice index), and stream_state.last_tool_call_ids agreeing with the ids we emitted."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, int], str] = {}

    def check(self, body: Any, lane: int = 0) -> list[str]:
        problems: list[str] = []
        if not isinstance(body, dict):
            return problems
        chunk = body.get("chunk", body)
        for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
            holder = choice.get("message") or choice.get("delta") or {}
            for pos, tc in enumerate(holder.get("tool_calls") or []):
                tid = tc.get("id")
                if tid is None:
                    continue
                if not isinstance(tid, str) or not TOOL_ID.match(tid):
                    problems.append(f"tool call id {tid!r} is not chatcmpl-tool-<16 hex>")
                    continue
                key = (choice.get("index", lane), tc.get("index", pos))
                if "delta" in choice:
                    first = self.ids.setdefault(key, tid)
                    if first != tid:
                        problems.append(f"tool call {key} changed id: {first} -> {tid}")
        state = body.get("stream_state")
        if isinstance(state, dict):
            for idx, tid in enumerate(state.get("last_tool_call_ids") or []):
                if not isinstance(tid, str) or not TOOL_ID.match(tid):
                    problems.append(f"stream_state.last_tool_call_ids[{idx}] {tid!r} is not chatcmpl-tool-<16 hex>")
                elif (lane, idx) in self.ids and self.ids[(lane, idx)] != tid:
                    problems.append(f"stream_state.last_tool_call_ids[{idx}] {tid} != emitted {self.ids[(lane, idx)]}")
        return problems


def compare_call(
    request: dict[str, Any],
    expected_status: int,
    expected: Any,
    actual_status: int,
    actual: Any,
    *,
    mask_ids: bool = True,
) -> list[str]:
    """vLLM's (`expected`) vs our (`actual`) derender response: every field exactly except `created`,
    tool-call ids (masked when `mask_ids`) and our `rs_*` stream_state keys; errors as in the render suite."""
    if isinstance(actual, dict) and isinstance(actual.get("stream_state"), dict):
        actual = {**actual, "stream_state": vllm_state_keys(actual["stream_state"])}
    if mask_ids and 200 <= expected_status < 300:
        expected, actual = mask_tool_ids(expected), mask_tool_ids(actual)
    return compare_response(request, expected_status, expected, actual_status, actual)
