"""The clients people point at a local OpenAI-compatible server, as their users run them,
against the real binary: the OpenAI Agents SDK (its default model speaks the Responses API),
LangChain's ChatOpenAI on the Responses API, litellm.responses(), pydantic-ai on both APIs,
and Simon Willison's `llm` CLI with a logit bias."""

import asyncio
import json
import os
import subprocess
import sys

import httpx
import pytest
from pydantic import BaseModel

# litellm looks for its price list on the internet at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class Person(BaseModel):
    name: str
    age: int


def weather_agent(server, cities):
    """An agent on the SDK's default model (the Responses API) with one function tool; its
    client is made for the event loop that runs it."""
    from agents import Agent, ModelSettings, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=server.base + "/v1", api_key="unused"), use_for_tracing=False)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return f"Sunny, 24 C in {city}"

    return Agent(name="Weather", instructions="Answer with the weather tool.", tools=[get_weather], model="m",
                 model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64))


def test_the_agents_sdk_default_model_runs_a_function_tool(server):
    from agents import Runner

    cities = []
    result = Runner.run_sync(weather_agent(server, cities), "What is the weather in Paris?", max_turns=4)
    assert cities and all(isinstance(c, str) and c for c in cities)
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert isinstance(result.final_output, str) and result.final_output


def test_the_agents_sdk_streams_a_run_with_a_tool(server):
    from agents import Runner

    cities = []

    async def streamed():
        run = Runner.run_streamed(weather_agent(server, cities), "What is the weather in Paris?", max_turns=4)
        kinds = [e.type async for e in run.stream_events()]
        return run, kinds

    run, kinds = asyncio.run(streamed())
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert cities and isinstance(run.final_output, str) and run.final_output


@pytest.fixture(scope="module")
def langchain_model(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="m", base_url=server.base + "/v1", api_key="unused", use_responses_api=True,
                      temperature=0, max_tokens=64)


def test_langchain_on_the_responses_api_answers_and_streams(langchain_model):
    r = langchain_model.invoke("What is 2+2?")
    assert "4" in r.text and r.usage_metadata["output_tokens"] > 0
    streamed = "".join(c.text for c in langchain_model.stream("What is 2+2?"))
    assert streamed == r.text


def test_langchain_bind_tools_gives_tool_calls(langchain_model):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "Sunny"

    r = langchain_model.bind_tools([get_weather], tool_choice="required").invoke("Weather in Paris?")
    assert r.tool_calls and r.tool_calls[0]["name"] == "get_weather"
    assert isinstance(r.tool_calls[0]["args"]["city"], str)


def test_langchain_with_structured_output_gives_the_model(langchain_model):
    p = langchain_model.with_structured_output(Person).invoke("Make up a person with a name and an age.")
    assert isinstance(p, Person) and p.name


def test_litellm_responses_plain_and_streamed(server):
    import litellm

    kw = dict(model="openai/m", input="What is 2+2?", api_base=server.base + "/v1", api_key="unused",
              temperature=0, max_output_tokens=64)
    r = litellm.responses(**kw)
    text = "".join(p.text for o in r.output if o.type == "message" for p in o.content)
    assert r.status == "completed" and "4" in text
    deltas = [e.delta for e in litellm.responses(**kw, stream=True) if e.type == "response.output_text.delta"]
    assert "".join(deltas) == text


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_pydantic_ai_answers_with_a_tool_offered_on_either_api(server, api):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=server.base + "/v1", api_key="unused")
    model = (OpenAIResponsesModel if api == "responses" else OpenAIChatModel)("m", provider=provider)
    agent = Agent(model, instructions="Be brief.", model_settings={"temperature": 0, "max_tokens": 64})

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "Sunny"

    result = agent.run_sync("What is 2+2?")
    assert "4" in result.output and result.usage.output_tokens > 0


def test_llm_cli_logit_bias_keeps_a_token_out(server, tmp_path):
    """`llm -o logit_bias '{"ID": -100}'`: the greedy answer's first token is banned, so the
    answer no longer starts with it."""
    ask = dict(model="m", temperature=0, max_tokens=12, logprobs=True,
               messages=[{"role": "user", "content": "Name a color."}])
    first = httpx.post(server.base + "/v1/chat/completions", json=ask, timeout=60).json()
    token = first["choices"][0]["logprobs"]["content"][0]["token"]
    token_id = httpx.post(server.base + "/tokenize", json={"prompt": token, "add_special_tokens": False}).json()["tokens"]
    assert len(token_id) == 1, token
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: edgelm\n  model_name: m\n  api_base: \"{server.base}/v1\"\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path)}
    llm = [sys.executable, "-m", "llm", "-m", "edgelm", "-o", "temperature", "0", "-o", "max_tokens", "12",
           "--no-log"]

    def run(*extra):
        out = subprocess.run([*llm, *extra, "Name a color."], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    plain = run()
    assert plain.startswith(token.strip()), (plain, token)
    biased = run("-o", "logit_bias", json.dumps({str(token_id[0]): -100}))
    assert not biased.startswith(token.strip()) and biased != plain, (biased, token)
