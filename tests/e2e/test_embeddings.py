"""`/v1/embeddings` through the official OpenAI client, on the reference model with
`llama.pooling_type` set (mean): float and base64 vectors, `dimensions`, batches of strings
and of token ids; bad input is a 400 naming its field; and a model without a pooling type
refuses embeddings while it keeps generating."""

import base64
import math
import struct

import httpx
import openai
import pytest

from conftest import ARTIFACTS, MODEL, Server
from gguf_edit import with_u32_key

E = "/v1/embeddings"
WIDTH = 576  # SmolLM2-135M's n_embd
MEAN = 1


@pytest.fixture(scope="module")
def pooled():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = with_u32_key(MODEL, ARTIFACTS / "e2e-pooling-mean.gguf", "llama.pooling_type", MEAN)
    s = Server(model=path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(pooled):
    return openai.OpenAI(base_url=pooled.base + "/v1", api_key="x")


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def test_float_vectors_are_unit_length_in_input_order(client, pooled):
    texts = ["The cat sat on the mat.", "Le chat est assis sur le tapis.", "Quarterly revenue rose 4%."]
    r = client.embeddings.create(model="anything", input=texts)
    assert r.object == "list" and r.model == "anything"
    assert [d.index for d in r.data] == [0, 1, 2]
    for d in r.data:
        assert d.object == "embedding" and len(d.embedding) == WIDTH
        assert abs(norm(d.embedding) - 1) < 1e-4
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    # Each input alone gives the vector it got in the batch (batching changes nothing).
    alone = client.embeddings.create(model="anything", input=texts[1]).data[0].embedding
    assert cosine(alone, r.data[1].embedding) > 0.9999
    pooled.wait_idle()


def test_base64_is_little_endian_f32_of_the_float_vector(client, pooled):
    text = "edge boxes answer questions about their own manuals"
    floats = client.embeddings.create(model="m", input=text, encoding_format="float").data[0].embedding
    body = {"input": text, "encoding_format": "base64"}
    raw = httpx.post(pooled.base + E, json=body, timeout=60).json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{WIDTH}f", base64.b64decode(raw))
    assert max(abs(a - b) for a, b in zip(decoded, floats)) < 1e-6
    # The client's own base64 path (its default when numpy is absent or not) decodes the same.
    via_client = client.embeddings.create(model="m", input=text, encoding_format="base64").data[0].embedding
    if isinstance(via_client, str):
        via_client = struct.unpack(f"<{WIDTH}f", base64.b64decode(via_client))
    assert max(abs(a - b) for a, b in zip(via_client, floats)) < 1e-6


def test_dimensions_truncate_then_renormalise(client):
    text = "truncated embeddings keep their leading dimensions"
    full = client.embeddings.create(model="m", input=text).data[0].embedding
    short = client.embeddings.create(model="m", input=text, dimensions=64).data[0].embedding
    assert len(short) == 64 and abs(norm(short) - 1) < 1e-4
    head = full[:64]
    assert cosine(short, head) > 0.9999


def test_token_id_inputs(client):
    ids = client.embeddings.create(model="m", input=[[1, 2, 3, 4], [5, 6]])
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 6
    one = client.embeddings.create(model="m", input=[1, 2, 3, 4]).data[0].embedding
    assert cosine(one, ids.data[0].embedding) > 0.9999


BAD = [
    # (name, body, the field the 400 names)
    ("input missing", {"model": "m"}, "input"),
    ("empty input list", {"input": []}, "input"),
    ("empty string", {"input": ""}, "input"),
    ("an empty string in a list", {"input": ["ok", ""]}, "input"),
    ("an empty token list", {"input": [[]]}, "input"),
    ("too many inputs", {"input": ["x"] * 2049}, "input"),
    ("a text over the context", {"input": [1] * 9000}, "input"),
    ("token id past vocab", {"input": [49152]}, "input"),
    ("input wrong type", {"input": 42}, "input"),
    ("dimensions over the width", {"input": "hi", "dimensions": WIDTH + 1}, "dimensions"),
    ("dimensions zero", {"input": "hi", "dimensions": 0}, "dimensions"),
    ("unknown encoding", {"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ("unknown field", {"input": "hi", "temperature": 0.5}, "temperature"),
]


@pytest.mark.parametrize("name,body,field", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_400_naming_the_field(pooled, name, body, field):
    r = httpx.post(pooled.base + E, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field, err
    pooled.wait_idle()


def test_a_model_without_pooling_refuses_embeddings_and_still_generates():
    s = Server()
    try:
        r = httpx.post(s.base + E, json={"input": "hi"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        assert "pooling" in r.json()["error"]["message"]
        c = httpx.post(s.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert c.status_code == 200
        models = httpx.get(s.base + "/v1/models", timeout=5).json()
        assert len(models["data"]) == 1
    finally:
        s.stop()
