"""The official OpenAI Python client against edgelm: completions and chat, streaming and not,
n, stop, logprobs, seed reproducibility, echo scoring."""

import json
import subprocess

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused")


def test_models_lists_the_model(client):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].id.endswith(".gguf")


def test_a_model_is_retrieved_by_id_with_its_file_time(client):
    from conftest import MODEL

    listed = client.models.list().data[0]
    one = client.models.retrieve(listed.id)
    assert one.id == listed.id and one.object == "model"
    assert one.created == listed.created == int(MODEL.stat().st_mtime)
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found" and "no-such-model" in e.value.body["message"]


def test_completion_greedy_matches_the_peer(client, confident_case):
    case = confident_case
    r = client.completions.create(model="m", prompt=case["prompt"], max_tokens=48, temperature=0)
    assert r.choices[0].text == case["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(case["prompt_ids"]) and r.usage.completion_tokens == 48


def test_completion_stream_concatenates_to_the_same_text(client, reference):
    case = reference["greedy"][1]
    whole = client.completions.create(model="m", prompt=case["prompt"], max_tokens=48, temperature=0)
    parts, finish = [], None
    for chunk in client.completions.create(model="m", prompt=case["prompt"], max_tokens=48, temperature=0, stream=True):
        for c in chunk.choices:
            parts.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(parts) == whole.choices[0].text and finish == "length"


def test_chat_non_stream_and_stream_agree(client):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=32, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "stop" and "4" in r.choices[0].message.content
    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=32, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == r.choices[0].message.content and finish == "stop"
    assert usage.completion_tokens == r.usage.completion_tokens


def test_n_completions_and_seed_reproducibility(client):
    kw = dict(model="m", prompt="Once upon a time", max_tokens=16, temperature=1.0, n=4, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2, 3]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    c = client.completions.create(**{**kw, "seed": 99})
    assert [x.text for x in c.choices] != [x.text for x in a.choices]


def test_stop_strings_cut_the_text_and_never_leak(client, reference):
    case = reference["greedy"][0]
    full = client.completions.create(model="m", prompt=case["prompt"], max_tokens=48, temperature=0).choices[0].text
    # A stop string taken from the server's own greedy text (a word a few tokens in), and a
    # prefix of it for the streamed run, where it may span two tokens.
    stop = next(w for w in full.split()[2:] if len(w) >= 4 and w.isalpha())
    r = client.completions.create(model="m", prompt=case["prompt"], max_tokens=48, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt=case["prompt"], max_tokens=48, temperature=0, stop=[stop[:-1], "zzz"], stream=True) if c.choices)
    assert text == full[: full.index(stop[:-1])]


def test_logprobs_on_completions_and_chat(client, reference):
    case = reference["greedy"][0]
    r = client.completions.create(model="m", prompt=case["prompt"], max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and len(lp.top_logprobs[0]) == 3
    # The peer's logprob, to within what another summation order moves it (docs/numerics.md).
    assert abs(lp.token_logprobs[0] - case["top5"][0][0][1]) < 0.05
    c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    entries = c.choices[0].logprobs.content
    assert entries and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def test_echo_scoring_agrees_with_the_peer(client, reference):
    """Teacher forcing through the API: token-id prompts, echo + logprobs, max_tokens 0."""
    agree = total = 0
    for case in reference["greedy"]:
        ids = case["prompt_ids"] + case["ids"]
        r = client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=1)
        lp = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
        for k in range(len(case["ids"])):
            top = lp.top_logprobs[len(case["prompt_ids"]) + k]
            best = max(top, key=top.get)
            total += 1
            agree += best == lp.tokens[len(case["prompt_ids"]) + k]
    assert agree / total >= 0.96, f"{agree}/{total}"  # tests/reference.rs says why 96%


def test_batch_of_prompts(client):
    r = client.completions.create(model="m", prompt=["Water boils at", "1, 2, 3,"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.text for c in r.choices)


def test_tokenize_and_detokenize(server, reference):
    case = reference["tokenize"][1]
    r = httpx.post(server.base + "/tokenize", json={"prompt": case["text"]}).json()
    assert r["tokens"] == case["ids"] and r["count"] == len(case["ids"])
    back = httpx.post(server.base + "/detokenize", json={"tokens": case["ids"]}).json()
    assert back["prompt"] == case["text"]


def test_tokenize_with_tools_counts_the_prompt_chat_renders(client, server):
    """A template that shows no tools gets them as instructions in its system message: the
    count /tokenize gives is the prompt chat runs, tool text included."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    count = httpx.post(server.base + "/tokenize", json={"messages": msgs, "tools": tools}).json()["count"]
    plain = httpx.post(server.base + "/tokenize", json={"messages": msgs}).json()["count"]
    r = client.chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=1)
    assert count == r.usage.prompt_tokens and count > plain + 20
    none = httpx.post(server.base + "/tokenize", json={"messages": msgs, "tools": tools, "tool_choice": "none"})
    assert none.json()["count"] == plain


def test_legacy_functions_get_a_function_call(client):
    """The pre-tools form, which older clients still send: `functions` and `function_call`
    in, `message.function_call` and finish_reason `function_call` out, whole and streamed;
    the call and its `role: function` result render as a call and its result."""
    functions = [{"name": "get_weather", "description": "Current weather",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    kw = dict(model="m", messages=msgs, temperature=0, max_tokens=64,
              extra_body={"functions": functions, "function_call": {"name": "get_weather"}})
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "function_call" and not c.message.tool_calls and c.message.content is None
    assert c.message.function_call.name == "get_weather"
    assert json.loads(c.message.function_call.arguments)["city"]
    name, args, finish = None, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        d = chunk.choices[0].delta
        if d.function_call:
            name = d.function_call.name or name
            args += d.function_call.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, args, finish) == ("get_weather", c.message.function_call.arguments, "function_call")
    follow = client.chat.completions.create(model="m", temperature=0, max_tokens=16, extra_body={"functions": functions},
                                            messages=[*msgs, {"role": "assistant", "content": None,
                                                              "function_call": {"name": "get_weather", "arguments": args}},
                                                      {"role": "function", "name": "get_weather", "content": "Sunny"}])
    assert follow.choices[0].finish_reason in ("stop", "length", "function_call")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=msgs, extra_body={"function_call": "auto"})
    assert e.value.body["param"] == "function_call"


def test_curl_sees_sse_framing(server):
    out = subprocess.run(["curl", "-sN", server.base + "/v1/completions", "-H", "Content-Type: application/json",
                          "-d", '{"prompt":"Hello","max_tokens":4,"temperature":0,"stream":true}'],
                         capture_output=True, text=True, timeout=60).stdout
    events = [e for e in out.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), out
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3


def test_logit_bias_bans_a_token_and_is_checked(client, server):
    prompt = "The capital of France is"
    first = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0).choices[0].text
    ids = httpx.post(server.base + "/tokenize", json={"prompt": first, "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1, ids
    banned = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(ids[0]): -100}).choices[0].text
    assert banned != first
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello"}],
                                          max_tokens=4, temperature=0, logit_bias={ids[0]: -100})
    assert chat.choices[0].message.content is not None
    for bad in ({"999999999": 5}, {str(ids[0]): 300}, {"abc": 1}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=prompt, max_tokens=1, logit_bias=bad)
        assert e.value.body["param"] == "logit_bias"


def test_openai_bookkeeping_fields_are_accepted_and_typos_are_not(client):
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, store=False,
        metadata={"run": "7"}, service_tier="auto", prompt_cache_key="k", safety_identifier="u1",
        user="someone")
    assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"temprature": 0.5})
    assert "temprature" in e.value.body["message"]
