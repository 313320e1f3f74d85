"""Tool calls as they are generated, through the official OpenAI client on the reference model:
a streamed call sends its id and name first, then its arguments in fragments; a forced call
cut by max_tokens comes back as a call with partial arguments and finish_reason "length",
never as content."""

import json

import openai
import pytest

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_lamp", "description": "Switch a lamp",
                                      "parameters": {"type": "object", "properties": {"room": {"type": "string", "maxLength": 12}, "on": {"type": "boolean"}}, "required": ["room", "on"], "additionalProperties": False}}},
]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


def stream(client, **kw):
    """The streamed answer: (tool_calls deltas in order, content text, finish_reason)."""
    deltas, content, finish = [], "", None
    for chunk in client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            deltas.extend(ch.delta.tool_calls or [])
    return deltas, content, finish


def joined(deltas):
    """The streamed calls by index: id, name and the arguments' fragments joined."""
    calls = {}
    for d in deltas:
        e = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        e["id"] = d.id or e["id"]
        if d.function:
            e["name"] += d.function.name or ""
            e["arguments"] += d.function.arguments or ""
    return calls


@pytest.mark.parametrize("choice", [NAMED, "required"])
def test_a_forced_call_cut_by_max_tokens_is_a_partial_call_not_content(client, choice):
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=8)
    c = r.choices[0]
    assert c.finish_reason == "length", c
    assert c.message.content is None, c
    names = {t["function"]["name"] for t in TOOLS}
    for call in c.message.tool_calls or []:
        assert call.id and call.function.name in names, c
    if choice == NAMED:
        # One tool to call: its name is known before the cut, whatever the cut leaves of it.
        assert [t.function.name for t in c.message.tool_calls] == ["get_weather"], c
    deltas, content, finish = stream(client, tool_choice=choice, temperature=0, max_tokens=8)
    assert finish == "length" and content == ""
    streamed = joined(deltas)
    whole = {i: {"name": t.function.name, "arguments": t.function.arguments} for i, t in enumerate(c.message.tool_calls or [])}
    assert {i: {"name": e["name"], "arguments": e["arguments"]} for i, e in streamed.items()} == whole


def test_a_streamed_call_sends_its_name_first_then_argument_fragments(client):
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
    deltas, content, finish = stream(client, tool_choice="required", temperature=0, max_tokens=200)
    assert finish == "tool_calls" and content == ""
    first = deltas[0]
    assert first.id and first.function.name in {t["function"]["name"] for t in TOOLS}
    assert not first.function.arguments
    fragments = [d for d in deltas[1:] if d.index == 0 and d.function and d.function.arguments]
    assert len(fragments) >= 3, deltas
    assert all(d.id is None and not d.function.name for d in fragments)
    streamed = joined(deltas)
    assert len(streamed) == len(c.message.tool_calls)
    for i, call in enumerate(c.message.tool_calls):
        assert streamed[i]["name"] == call.function.name
        assert json.loads(streamed[i]["arguments"]) == json.loads(call.function.arguments)
