"""One process serving a chat model and an embedding model (`serve -m chat=A -m embed=B`):
`/v1/models` lists both, a request's `model` selects one (an unknown one is a 404
`model_not_found`), the official OpenAI client, LangChain's OpenAIEmbeddings and litellm embed
through it unchanged, `/metrics` labels each model's series, and a chat stream keeps its
tokens while embeddings are requested at the same time: the test measures the stream's
inter-token latency with and without that load and reports both (target/test-artifacts/
several-models-itl.json)."""

import json
import os
import threading
import time

import httpx
import openai
import pytest

from conftest import ARTIFACTS, MODEL, Server
from gguf_edit import with_u32_key

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MEAN = 1
WIDTH = 576  # SmolLM2-135M's n_embd


@pytest.fixture(scope="module")
def duo():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pooled = with_u32_key(MODEL, ARTIFACTS / "e2e-duo-embed.gguf", "llama.pooling_type", MEAN)
    s = Server("-m", f"embed={pooled}", model=f"chat={MODEL}")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(duo):
    return openai.OpenAI(base_url=duo.base + "/v1", api_key="x")


def test_models_lists_both_with_their_kinds(client, duo):
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {"chat", "embed"}
    assert listed["chat"].model_extra["kind"] == "generate"
    assert listed["embed"].model_extra["kind"] == "embed"
    assert client.models.retrieve("embed").id == "embed"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found"


def test_the_model_field_selects_the_model(client, duo):
    r = client.completions.create(model="chat", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.model == "chat" and r.usage.completion_tokens > 0
    e = client.embeddings.create(model="embed", input="edge boxes")
    assert len(e.data[0].embedding) == WIDTH
    # An unknown model is a 404 on every endpoint; a model of the wrong kind is a 400 naming `model`.
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/embeddings", {"input": "hi"})]:
        r = httpx.post(duo.base + path, json={**body, "model": "nope"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = httpx.post(duo.base + "/v1/completions", json={"model": "embed", "prompt": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    r = httpx.post(duo.base + "/v1/embeddings", json={"model": "chat", "input": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    # Without a model, each endpoint goes to the first model that serves it.
    r = httpx.post(duo.base + "/v1/embeddings", json={"input": "hi"}, timeout=30)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == WIDTH
    r = httpx.post(duo.base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text
    duo.wait_idle()


def test_openai_langchain_and_litellm_embed_unchanged(client, duo):
    import litellm
    from langchain_openai import OpenAIEmbeddings

    texts = ["The pump overheated at noon.", "La pompe a surchauffé à midi.", "Quarterly revenue rose."]
    ours = [d.embedding for d in client.embeddings.create(model="embed", input=texts).data]
    # LangChain tokenizes with OpenAI's tiktoken unless told the server takes text, as every
    # non-OpenAI server needs.
    lc = OpenAIEmbeddings(model="embed", base_url=duo.base + "/v1", api_key="x", check_embedding_ctx_length=False)
    lc_docs = lc.embed_documents(texts)
    lc_query = lc.embed_query(texts[0])
    ll = litellm.embedding(model="openai/embed", api_base=duo.base + "/v1", api_key="x", input=texts)
    ll_vectors = [d["embedding"] for d in ll.data]
    for vectors in (lc_docs, ll_vectors):
        assert len(vectors) == 3
        for a, b in zip(vectors, ours):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert max(abs(x - y) for x, y in zip(lc_query, ours[0])) < 1e-5
    assert ll.usage.prompt_tokens > 3
    duo.wait_idle()


def test_metrics_and_status_cover_every_model(duo):
    text = httpx.get(duo.base + "/metrics", timeout=5).text
    for model in ("chat", "embed"):
        assert f'edgelm_requests_running{{model="{model}"}}' in text
        assert f'edgelm_kv_pool_bytes{{model="{model}"}}' in text
    assert text.count("# TYPE edgelm_kv_pool_bytes gauge") == 1
    status = httpx.get(duo.base + "/api/status", timeout=5).json()
    assert [(m["id"], m["kind"]) for m in status["models"]] == [("chat", "generate"), ("embed", "embed")]
    # The embedding model's pool is its default share, the chat model holds the rest.
    pools = {m["id"]: m["kv_pool_bytes"] for m in status["models"]}
    assert 0 < pools["embed"] < pools["chat"] and sum(pools.values()) <= 128 << 20


def stream_gaps(duo):
    """A greedy chat stream of 128 tokens: its text and the gaps between its tokens (s)."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 128, "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals, text = [], []
    with httpx.stream("POST", duo.base + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    arrivals.append(time.perf_counter())
                    text.append(delta[0]["delta"]["content"])
    return "".join(text), [b - a for a, b in zip(arrivals, arrivals[1:])]


def embed_steps(duo):
    text = httpx.get(duo.base + "/metrics", timeout=5).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith('edgelm_engine_steps_total{model="embed"}'))


def p99(gaps):
    s = sorted(gaps)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def test_chat_streams_on_while_embeddings_run(duo):
    # 32 texts of about 128 tokens each, as an indexing job sends them.
    passage = ("Edge boxes answer questions about their own manuals, logs and camera events; "
               "each document is split into passages and embedded before it can be found. ") * 4
    batch = [f"{i}: {passage}" for i in range(32)]
    stop, embedded = threading.Event(), []

    def embed_load():
        with httpx.Client(timeout=300) as c:
            while not stop.is_set():
                r = c.post(duo.base + "/v1/embeddings", json={"model": "embed", "input": batch})
                assert r.status_code == 200, r.text
                embedded.append(time.perf_counter())

    quiet_text, quiet = stream_gaps(duo)
    loader = threading.Thread(target=embed_load)
    loader.start()
    time.sleep(0.5)
    try:
        before = embed_steps(duo)
        loaded_text, loaded = stream_gaps(duo)
        during = embed_steps(duo) - before
    finally:
        stop.set()
        loader.join()
    assert embedded, "the embedding load finished no batch"
    # Greedy, and the other model's work never enters the chat model's batch: the same text.
    assert loaded_text == quiet_text
    assert len(loaded) == len(quiet) >= 32
    # The embedding model stepped while the stream ran: the engines took turns.
    assert 0 < during, "the embedding model made no step while the chat streamed"
    figures = {"itl_p99_s_alone": p99(quiet), "itl_p99_s_with_embeddings": p99(loaded),
               "itl_median_s_alone": sorted(quiet)[len(quiet) // 2],
               "itl_median_s_with_embeddings": sorted(loaded)[len(loaded) // 2],
               "embedding_steps_during_stream": during, "chat_tokens": len(loaded) + 1}
    (ARTIFACTS / "several-models-itl.json").write_text(json.dumps(figures, indent=1))
    print("chat inter-token latency with and without a concurrent embedding load:", figures)
    duo.wait_idle()
