"""Prompt-lookup speculative decoding through the official OpenAI client: opt-in per request
(`extra_body={"prompt_lookup": True}`) on a server started with `--prompt-lookup N`. Greedy
output is the same as without it; the drafts verified and accepted are counted in /metrics."""


import pytest
from openai import OpenAI

from conftest import ROOT, Server

TASK = (ROOT / "tests" / "data" / "lookup-extraction.txt").read_text()


@pytest.fixture(scope="module")
def lookup_server():
    s = Server("--prompt-lookup", "8")
    yield s
    s.stop()


def chat(client: OpenAI, text: str, lookup: bool, stream: bool = False) -> str:
    args = dict(model="m", messages=[{"role": "user", "content": text}], temperature=0,
                max_tokens=160, extra_body={"prompt_lookup": lookup})
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **args) if c.choices)
    return client.chat.completions.create(**args).choices[0].message.content


def test_drafts_change_no_greedy_output_and_are_counted(lookup_server):
    client = OpenAI(base_url=lookup_server.base + "/v1", api_key="x")
    # The first request fills the prefix cache, which changes how the next ones prefill: the
    # plain answer compared with is the second, in the same state as the drafted ones.
    chat(client, TASK, lookup=False)
    plain = chat(client, TASK, lookup=False)
    m0 = lookup_server.metrics()
    assert m0["edgelm_spec_decode_num_draft_tokens_total"] == 0, "nobody asked for drafts"
    drafted = chat(client, TASK, lookup=True)
    streamed = chat(client, TASK, lookup=True, stream=True)
    assert drafted == plain and streamed == plain
    m = lookup_server.metrics()
    drafts = m["edgelm_spec_decode_num_draft_tokens_total"]
    accepted = m["edgelm_spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= drafts, (drafts, accepted)
    # The answer copies fields from the report: a good share of the drafts hold.
    assert accepted >= 0.3 * drafts, (drafts, accepted)


def test_a_sampled_request_may_ask_and_is_simply_not_speculated(lookup_server):
    client = OpenAI(base_url=lookup_server.base + "/v1", api_key="x")
    before = lookup_server.metrics()["edgelm_spec_decode_num_draft_tokens_total"]
    out = client.completions.create(model="m", prompt="Once upon a time", max_tokens=16,
                                    temperature=0.9, seed=3, extra_body={"prompt_lookup": True})
    assert out.choices[0].text
    assert lookup_server.metrics()["edgelm_spec_decode_num_draft_tokens_total"] == before


def test_the_field_must_be_a_boolean(lookup_server):
    import httpx
    r = httpx.post(lookup_server.base + "/v1/completions", timeout=30,
                   json={"prompt": "hi", "max_tokens": 2, "prompt_lookup": "yes"})
    assert r.status_code == 400 and r.json()["error"]["message"], r.text
