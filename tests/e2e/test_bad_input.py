"""Hostile and careless input: every case gets its documented 4xx as an OpenAI-style error,
and afterwards the server still answers with no KV block in use."""

import json
import socket

import httpx
import pytest

C, CH, R = "/v1/completions", "/v1/chat/completions", "/v1/responses"
HUGE = 10**30

CASES = [
    # (name, method, path, body (bytes | dict | None), expected status)
    ("malformed json", "POST", C, b'{"prompt": "x",', 400),
    ("truncated json", "POST", C, b'{"prompt": "hel', 400),
    ("not an object", "POST", C, b'[1, 2, 3]', 400),
    ("empty body", "POST", C, b"", 400),
    ("invalid utf-8", "POST", C, b'{"prompt": "\xff\xfe"}', 400),
    ("prompt wrong type", "POST", C, {"prompt": 42}, 400),
    ("prompt missing", "POST", C, {"max_tokens": 4}, 400),
    ("empty prompt", "POST", C, {"prompt": ""}, 400),
    ("empty token prompt", "POST", C, {"prompt": []}, 400),
    ("negative token id", "POST", C, {"prompt": [1, -5]}, 400),
    ("token id past vocab", "POST", C, {"prompt": [49152]}, 400),
    ("prompt over the context", "POST", C, {"prompt": [1] * 9000, "max_tokens": 1}, 400),
    ("prompt + max_tokens over the context", "POST", C, {"prompt": "hi", "max_tokens": 9000}, 400),
    ("negative max_tokens", "POST", C, {"prompt": "hi", "max_tokens": -1}, 400),
    ("huge max_tokens", "POST", C, {"prompt": "hi", "max_tokens": HUGE}, 400),
    ("max_tokens as string", "POST", C, {"prompt": "hi", "max_tokens": "ten"}, 400),
    ("temperature negative", "POST", C, {"prompt": "hi", "temperature": -1}, 400),
    ("temperature huge", "POST", C, {"prompt": "hi", "temperature": 1e300}, 400),
    ("top_p above 1", "POST", C, {"prompt": "hi", "top_p": 1.5}, 400),
    ("top_p zero", "POST", C, {"prompt": "hi", "top_p": 0}, 400),
    ("top_k negative", "POST", C, {"prompt": "hi", "top_k": -7}, 400),
    ("min_p above 1", "POST", C, {"prompt": "hi", "min_p": 3}, 400),
    ("presence_penalty out of range", "POST", C, {"prompt": "hi", "presence_penalty": 5}, 400),
    ("frequency_penalty nan-ish", "POST", C, b'{"prompt": "hi", "frequency_penalty": NaN}', 400),
    ("repetition_penalty zero", "POST", C, {"prompt": "hi", "repetition_penalty": 0}, 400),
    ("n zero", "POST", C, {"prompt": "hi", "n": 0}, 400),
    ("absurd n", "POST", C, {"prompt": "hi", "n": 100000}, 400),
    ("logprobs too many", "POST", C, {"prompt": "hi", "logprobs": 500}, 400),
    ("huge stop list", "POST", C, {"prompt": "hi", "stop": ["x"] * 1000}, 400),
    ("empty stop string", "POST", C, {"prompt": "hi", "stop": [""]}, 400),
    ("stop wrong type", "POST", C, {"prompt": "hi", "stop": 5}, 400),
    ("unknown field", "POST", C, {"prompt": "hi", "frobnicate": True}, 400),
    ("stream_options without stream", "POST", C, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400),
    ("stream wrong type", "POST", C, {"prompt": "hi", "stream": "yes"}, 400),
    ("seed as float string", "POST", C, {"prompt": "hi", "seed": "abc"}, 400),
    ("chat messages missing", "POST", CH, {"max_tokens": 4}, 400),
    ("chat messages empty", "POST", CH, {"messages": []}, 400),
    ("chat unknown role", "POST", CH, {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("chat content wrong type", "POST", CH, {"messages": [{"role": "user", "content": 12}]}, 400),
    ("chat image part", "POST", CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, 400),
    ("chat top_logprobs without logprobs", "POST", CH, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400),
    ("chat unknown field", "POST", CH, {"messages": [{"role": "user", "content": "hi"}], "bogus_field": 1}, 400),
    ("responses input missing", "POST", R, {"instructions": "x"}, 400),
    ("responses input wrong type", "POST", R, {"input": 5}, 400),
    ("responses item without type", "POST", R, {"input": [{"content": "x"}]}, 400),
    ("responses unknown item", "POST", R, {"input": [{"type": "computer_call", "id": "x"}]}, 400),
    ("responses call without name", "POST", R, {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, 400),
    ("responses built-in tool", "POST", R, {"input": "x", "tools": [{"type": "code_interpreter"}]}, 400),
    ("responses bad format", "POST", R, {"input": "x", "text": {"format": {"type": "xml"}}}, 400),
    ("responses bad effort", "POST", R, {"input": "x", "reasoning": {"effort": 3}}, 400),
    ("responses unknown previous id", "POST", R, {"input": "x", "previous_response_id": "resp_none"}, 404),
    ("responses previous id wrong type", "POST", R, {"input": "x", "previous_response_id": 7}, 400),
    ("responses unknown field", "POST", R, {"input": "x", "max_tokens": 5}, 400),
    ("kept response unknown", "GET", R + "/resp_none", None, 404),
    ("kept response delete unknown", "DELETE", R + "/resp_none", None, 404),
    ("kept response wrong method", "PUT", R + "/resp_none", {}, 405),
    ("tokenize nothing", "POST", "/tokenize", {}, 400),
    ("detokenize bad ids", "POST", "/detokenize", {"tokens": [-1]}, 400),
    ("wrong method on completions", "GET", C, None, 405),
    ("wrong method on health", "POST", "/health", {}, 405),
    ("unknown path", "GET", "/v2/everything", None, 404),
    ("path traversal", "GET", "/../../etc/passwd", None, 404),
    ("oversized body", "POST", C, {"prompt": "x" * (2 * 1024 * 1024)}, 413),
]


@pytest.mark.parametrize("name,method,path,body,status", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error(server, name, method, path, body, status):
    content = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    r = httpx.request(method, server.base + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, f"{name}: {r.status_code} {r.text[:200]}"
    err = r.json()["error"]
    assert err["message"] and err["type"], err


def test_at_least_forty_cases():
    assert len(CASES) >= 40


def test_garbage_on_the_socket_does_not_hurt(server):
    for payload in [b"\x00\xff" * 100, b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999\r\n\r\n{"]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    assert httpx.get(server.base + "/health").status_code == 200


def test_errors_are_counted_and_the_server_still_serves(server):
    m = httpx.get(server.base + "/metrics").text
    assert 'edgelm_request_errors_total{reason="invalid_request"}' in m
    r = httpx.post(server.base + C, json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
