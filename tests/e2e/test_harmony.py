"""The harmony chat format (gpt-oss) through the official OpenAI client: the reference model with
its chat template replaced by gpt-oss's. Its vocabulary spells the harmony markers out as text,
which the server parses the same as gpt-oss's special tokens. A forced call comes back as
`tool_calls` with arguments that validate, and `reasoning_effort` reaches the template."""

import json
import struct

import httpx
import jsonschema
import openai
import pytest

from conftest import MODEL, ROOT, Server

TEMPLATE = ROOT / "tests" / "data" / "gpt-oss-chat-template.jinja"

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "set_lamp", "description": "Switch a lamp",
                                      "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# GGUF value types: fixed sizes, 8 = string, 9 = array.
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(buf: bytes, at: int, kind: int) -> int:
    if kind in FIXED:
        return at + FIXED[kind]
    if kind == 8:
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + n
    item, count = struct.unpack_from("<IQ", buf, at)
    at += 12
    for _ in range(count):
        at = skip_value(buf, at, item)
    return at


def with_template(src, dst, template: str) -> None:
    """Copies the GGUF at SRC to DST with `tokenizer.chat_template` replaced: the header is
    rewritten and the tensor data moved to the next alignment boundary (offsets are relative to it)."""
    buf = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version == 3
    at, out, alignment = 24, bytearray(buf[:24]), 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", buf, at)
        key = buf[at + 8:at + 8 + klen].decode()
        (kind,) = struct.unpack_from("<I", buf, at + 8 + klen)
        end = skip_value(buf, at + 12 + klen, kind)
        if key == "tokenizer.chat_template":
            text = template.encode()
            out += buf[at:at + 12 + klen] + struct.pack("<Q", len(text)) + text
        else:
            out += buf[at:end]
            if key == "general.alignment":
                (alignment,) = struct.unpack_from("<I", buf, end - 4)
        at = end
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, at)
        (dims,) = struct.unpack_from("<I", buf, at + 8 + nlen)
        end = at + 8 + nlen + 4 + 8 * dims + 4 + 8
        out += buf[at:end]
        at = end
    pad = lambda n: (n + alignment - 1) // alignment * alignment
    out += bytes(pad(len(out)) - len(out))
    out += buf[pad(at):]
    open(dst, "wb").write(out)


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    model = tmp_path_factory.mktemp("harmony") / "gpt-oss-templated.gguf"
    with_template(MODEL, model, TEMPLATE.read_text())
    s = Server(model=model)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(harmony_server):
    return openai.OpenAI(base_url=harmony_server.base + "/v1", api_key="unused", max_retries=0)


def test_a_named_tool_choice_comes_back_as_a_call(client):
    r = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, "nothing of the call message leaks into content"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_a_required_call_streams_as_a_call(client):
    stream = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=120, tool_choice="required", stream=True)
    names, args, content, finish = [], "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            if tc.function.name:
                names.append(tc.function.name)
            args += tc.function.arguments or ""
        finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert "<|" not in content
    assert len(names) == 1 and names[0] in ("get_weather", "set_lamp")
    schema = WEATHER if names[0] == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(args), schema)


def test_reasoning_effort_is_accepted_checked_and_rendered(client, harmony_server):
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=4, reasoning_effort="high")
    assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, reasoning_effort="extreme")
    assert e.value.body["param"] == "reasoning_effort"

    def prompt(**extra):
        ids = httpx.post(harmony_server.base + "/tokenize", json={"messages": ASK, **extra}, timeout=10).json()["tokens"]
        return httpx.post(harmony_server.base + "/detokenize", json={"tokens": ids}, timeout=10).json()["prompt"]
    assert "Reasoning: high\n" in prompt(reasoning_effort="high")
    assert "Reasoning: medium\n" in prompt()
    assert prompt().endswith("<|start|>assistant")
