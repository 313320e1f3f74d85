"""The Responses API (`/v1/responses`) with the official OpenAI client against the real
binary: plain and streamed answers, a function tool and its output fed back, a Pydantic
schema through `responses.parse`, `previous_response_id` across turns, the kept responses'
`GET`/`DELETE`, and the refusals that name what is not served."""

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused")


def test_a_plain_response_matches_the_chat_answer(client):
    r = client.responses.create(model="m", input="What is 2+2?", instructions="Answer briefly.",
                                temperature=0, max_output_tokens=32)
    chat = client.chat.completions.create(model="m", temperature=0, max_tokens=32, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == ("completed" if chat.choices[0].finish_reason == "stop" else "incomplete")
    assert r.output_text == chat.choices[0].message.content and "4" in r.output_text
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Answer briefly." and r.max_output_tokens == 32


def test_a_cut_response_is_incomplete_with_its_reason(client):
    r = client.responses.create(model="m", input="Tell me a long story.", max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output_text


def test_a_streamed_response_has_the_typed_events_and_the_same_text(client):
    kw = dict(model="m", input="Name three colors.", temperature=0, max_output_tokens=40)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == whole.status and types[-1] in ("response.completed", "response.incomplete") \
        or types[-1] == f"response.{whole.status}"
    for t in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert t in types, t
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == whole.usage.output_tokens


def test_the_sdk_stream_helper_accumulates_the_response(client):
    with client.responses.stream(model="m", input="What is 2+2?", temperature=0, max_output_tokens=64) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.output_text == "".join(deltas) and final.output_text


def test_a_function_call_and_its_output_fed_back(client):
    r = client.responses.create(model="m", input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="required", temperature=0, max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1 and r.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id
    assert isinstance(json.loads(call.arguments)["city"], str)
    follow = client.responses.create(
        model="m", tools=[WEATHER], temperature=0, max_output_tokens=48,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, *[c.model_dump() for c in calls],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 24 C"} for c in calls]])
    assert follow.status in ("completed", "incomplete")
    # The tool's result is in the prompt the model answered.
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_a_streamed_call_sends_its_name_then_its_arguments(client):
    events = list(client.responses.create(model="m", input="Weather in Rome?", tools=[WEATHER],
                                          tool_choice="required", temperature=0, max_output_tokens=64, stream=True))
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert added and added[0].item.name == "get_weather" and added[0].item.arguments == ""
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert done.arguments == deltas and json.loads(deltas)["city"]
    assert events[-1].type == "response.completed"


def test_a_forced_call_cut_short_is_an_incomplete_call_not_text(client):
    kw = dict(model="m", input="Weather in Oslo?", tools=[WEATHER], tool_choice="required", temperature=0,
              max_output_tokens=8)
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["function_call"], r.output
    assert r.output[0].name == "get_weather" and r.output[0].status == "incomplete"
    events = list(client.responses.create(**kw, stream=True))
    assert events[-1].type == "response.incomplete"
    assert not [e for e in events if e.type == "response.output_text.delta"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == r.output[0].arguments


class Person(BaseModel):
    name: str
    age: int


def test_parse_with_a_pydantic_schema(client):
    r = client.responses.parse(model="m", input="Make up a person with a name and an age.", text_format=Person,
                               temperature=0, max_output_tokens=64)
    assert isinstance(r.output_parsed, Person) and r.output_parsed.name
    assert r.text.format.type == "json_schema"


def test_json_object_format_gives_json(client):
    r = client.responses.create(model="m", input="Give a JSON object with a key 'a'.", temperature=0,
                                max_output_tokens=48, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="m", input="My name is Zorblax. Remember it.", temperature=0,
                                    max_output_tokens=16)
    second = client.responses.create(model="m", input="What is my name?", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=16)
    assert second.previous_response_id == first.id
    # The first turn, its answer and the new question are all in the prompt.
    alone = client.responses.create(model="m", input="What is my name?", temperature=0, max_output_tokens=16)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    items = client.responses.input_items.list(second.id)
    texts = json.dumps([i.model_dump() for i in items.data])
    assert "Zorblax" in texts and "What is my name?" in texts


def test_kept_responses_are_retrieved_and_deleted(client):
    r = client.responses.create(model="m", input="Hi", max_output_tokens=4, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="x", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id" and r.id in e.value.body["message"]


def test_store_false_is_not_kept(client):
    r = client.responses.create(model="m", input="Hi", max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_what_is_not_served_is_refused_by_name(client):
    cases = [
        (dict(tools=[{"type": "web_search"}]), "tools", "web_search"),
        (dict(background=True), "background", "background"),
        (dict(temprature=0.5), "temprature", "temprature"),
    ]
    for extra, param, word in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", input="x", extra_body=extra)
        assert e.value.body["param"] == param and word in e.value.body["message"], e.value.body
    # A model served without a projector file reads no image (test_vision.py: one that is).
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}])
    assert "projector" in e.value.body["message"]


def test_errors_name_the_responses_fields(client):
    cases = [(dict(input=[]), "input"), (dict(input="x", max_output_tokens=-1), "max_output_tokens"),
             (dict(input="x", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}),
              "text.format")]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", extra_body=body)
        assert e.value.body["param"] == param, e.value.body


def test_bookkeeping_fields_are_accepted(client):
    r = client.responses.create(model="m", input="Hi", max_output_tokens=4, user="u1", service_tier="auto",
                                prompt_cache_key="k", safety_identifier="s", truncation="disabled",
                                include=["reasoning.encrypted_content"], reasoning={"effort": "low"},
                                parallel_tool_calls=False, text={"verbosity": "low"})
    assert r.status in ("completed", "incomplete")


def test_a_bad_body_on_a_kept_id_path_is_a_clear_error(server):
    r = httpx.post(server.base + "/v1/responses/resp_x", json={})
    assert r.status_code == 405 and r.json()["error"]
