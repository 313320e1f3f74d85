"""Every kind of answer edgelm writes, validated strictly against the official openai SDK's
types (pydantic's strict mode, through `TypeAdapter`): chat completions whole and streamed
(text, logprobs, usage chunks, several choices, forced and streamed tool calls, the legacy
`function_call`, JSON mode), completions whole and streamed (echo, logprobs), the Responses
API's object and every one of its stream events, a kept response, its input items and its
deletion, embeddings (floats and base64), and the models. The SDK itself builds its objects
without validating them, so a field of the wrong type or a missing required one would pass
its client unnoticed: these tests read the raw bodies over HTTP instead.

Two fields are sent as OpenAI's own API sends them, where the SDK's types have no null: a
streamed completion's `finish_reason` is null until its choice's last chunk (the SDK reuses the
whole answer's type for chunks), and an echoed prompt's first token has null logprobs (nothing
comes before it). Those answers are checked against the SDK's types with just that field made
nullable (`CompletionChunk`, `Echoed`); every other field is the SDK's own."""

import base64
import json
import struct
from typing import Dict, List, Literal, Optional

import httpx
import pytest
from openai.types import Completion, CompletionChoice, CreateEmbeddingResponse, Model
from openai.types.completion_choice import Logprobs
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import ARTIFACTS, MODEL, Server
from gguf_edit import with_u32_key

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


class ChunkChoice(CompletionChoice):
    finish_reason: Optional[Literal["stop", "length", "content_filter"]] = None


class CompletionChunk(Completion):
    choices: List[ChunkChoice]


class EchoedLogprobs(Logprobs):
    token_logprobs: Optional[List[Optional[float]]] = None
    top_logprobs: Optional[List[Optional[Dict[str, float]]]] = None


class EchoedChoice(CompletionChoice):
    logprobs: Optional[EchoedLogprobs] = None


class Echoed(Completion):
    choices: List[EchoedChoice]


def strict(kind, data):
    """`data` as the SDK's `kind`, validated strictly (no coercion of types); returns it."""
    return TypeAdapter(kind).validate_python(data, strict=True)


def post(server, path, body):
    r = httpx.post(server.base + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, path, body):
    """The `data:` payloads of a streamed answer (`[DONE]` left out), each parsed."""
    with httpx.stream("POST", server.base + path, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" or path == "/v1/responses", lines[-1]
    return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]


@pytest.mark.parametrize("extra", [
    {},
    {"n": 2, "temperature": 1.0, "seed": 1},
    {"logprobs": True, "top_logprobs": 2},
    {"response_format": {"type": "json_object"}},
    {"tools": [WEATHER], "tool_choice": "required"},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
     "max_tokens": 3},
], ids=["text", "n2", "logprobs", "json", "forced-call", "cut-call"])
def test_chat_completions_whole_and_streamed(server, extra):
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 24, "temperature": 0, **extra}
    whole = strict(ChatCompletion, post(server, "/v1/chat/completions", body))
    assert whole.service_tier == "default" and whole.usage.prompt_tokens_details.cached_tokens >= 0
    chunks = sse(server, "/v1/chat/completions",
                 {**body, "stream": True, "stream_options": {"include_usage": True}})
    for c in chunks:
        strict(ChatCompletionChunk, c)
    assert chunks[-1]["usage"]["completion_tokens"] == whole.usage.completion_tokens
    if "tools" in extra:
        assert whole.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_legacy_function_calls(server):
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 40, "temperature": 0,
            "functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}}
    whole = strict(ChatCompletion, post(server, "/v1/chat/completions", body))
    assert whole.choices[0].message.function_call.name == "get_weather"
    assert whole.choices[0].finish_reason == "function_call"
    for c in sse(server, "/v1/chat/completions", {**body, "stream": True}):
        strict(ChatCompletionChunk, c)


@pytest.mark.parametrize("extra", [{}, {"logprobs": 2}, {"n": 2, "seed": 3}, {"prompt": ["One", "Two"]}],
                         ids=["text", "logprobs", "n2", "batch"])
def test_completions_whole_and_streamed(server, extra):
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, **extra}
    strict(Completion, post(server, "/v1/completions", body))
    chunks = sse(server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    for c in chunks:
        strict(CompletionChunk, c)
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    ends = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(ends) == len(strict(Completion, post(server, "/v1/completions", body)).choices)


def test_echoed_completion_logprobs(server):
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
            "echo": True, "logprobs": 1}
    lp = strict(Echoed, post(server, "/v1/completions", body)).choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert None not in lp.token_logprobs[1:] and None not in lp.top_logprobs[1:]


@pytest.mark.parametrize("extra", [
    {},
    {"instructions": "Answer in one word.", "max_output_tokens": 4},
    {"tools": [{"type": "function", **WEATHER["function"]}], "tool_choice": "required"},
    {"text": {"format": {"type": "json_schema", "name": "w", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}},
], ids=["text", "cut", "forced-call", "json-schema"])
def test_responses_object_events_and_kept_items(server, extra):
    body = {"model": "m", "input": "What is the weather in Paris?", "max_output_tokens": 24,
            "temperature": 0, "service_tier": "auto", **extra}
    whole = strict(Response, post(server, "/v1/responses", body))
    assert whole.service_tier == "default" and whole.usage.input_tokens_details.cache_write_tokens >= 0
    events = sse(server, "/v1/responses", {**body, "stream": True})
    for e in events:
        strict(ResponseStreamEvent, e)
    assert events[-1]["type"] == f"response.{whole.status}"
    kept = httpx.get(f"{server.base}/v1/responses/{whole.id}", timeout=10).json()
    assert strict(Response, kept).id == whole.id
    items = strict(ResponseItemList, httpx.get(f"{server.base}/v1/responses/{whole.id}/input_items",
                                               timeout=10).json())
    message = items.data[0]
    assert message.type == "message" and message.role == "user" and message.status == "completed"
    assert message.content[0].type == "input_text" and message.content[0].text == body["input"]
    follow = strict(Response, post(server, "/v1/responses", {
        "model": "m", "input": [{"role": "user", "content": "And in Rome?"}],
        "previous_response_id": whole.id, "max_output_tokens": 8}))
    listed = httpx.get(f"{server.base}/v1/responses/{follow.id}/input_items", timeout=10).json()
    strict(ResponseItemList, listed)
    assert len(listed["data"]) == 2 + len(whole.output)
    deleted = httpx.delete(f"{server.base}/v1/responses/{follow.id}", timeout=10).json()
    assert deleted == {"id": follow.id, "object": "response", "deleted": True}


@pytest.fixture(scope="module")
def embedder():
    """The reference model with a pooling type (mean), so that it serves embeddings."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = with_u32_key(MODEL, ARTIFACTS / "e2e-shapes-pooling-mean.gguf", "llama.pooling_type", 1)
    s = Server(model=path)
    yield s
    s.stop()


def test_embeddings_floats_and_base64(embedder):
    body = {"model": "m", "input": ["hello", "edge boxes"]}
    floats = strict(CreateEmbeddingResponse, post(embedder, "/v1/embeddings", body))
    assert len(floats.data) == 2 and floats.usage.prompt_tokens > 0
    b64 = post(embedder, "/v1/embeddings", {**body, "encoding_format": "base64", "dimensions": 16})
    for d in b64["data"]:
        raw = base64.b64decode(d["embedding"])
        d["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert len(d["embedding"]) == 16
    strict(CreateEmbeddingResponse, b64)


def test_models(server):
    listed = httpx.get(server.base + "/v1/models", timeout=10).json()
    assert listed["object"] == "list"
    for m in listed["data"]:
        strict(Model, m)
    one = httpx.get(f"{server.base}/v1/models/{listed['data'][0]['id']}", timeout=10).json()
    assert strict(Model, one).id == listed["data"][0]["id"]
