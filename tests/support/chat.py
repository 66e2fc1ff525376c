"""What many tests send: one greedy chat turn, an agent's turn, the tiers of its usage, the weather
tool's schema, and an Agents SDK agent with one tool."""

from __future__ import annotations

from typing import Literal

import openai

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


def chat(client: openai.OpenAI, content: str, max_tokens: int = 24, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("model", "tiny")
    return client.chat.completions.create(messages=[{"role": "user", "content": content}], max_tokens=max_tokens, **kw)


def ask(client, messages, agent, max_tokens=12):
    """One greedy chat turn of `agent` (None: anonymous)."""
    extra = {"prompt_cache_key": agent} if agent else {}
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra
    )


def tiers(response) -> tuple[int, int]:
    """(hot_tokens, warm_tokens) of a response's usage."""
    d = response.usage.prompt_tokens_details
    return d.model_extra["hot_tokens"], d.model_extra["warm_tokens"]


def weather_agent(model, max_tokens: int, **agent_kw):
    """An OpenAI Agents SDK agent with one function tool and a required first call (the tests
    of both the chat-completions and the Responses model run it); returns it and the cities
    its tool was called with."""
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The forecast for a city."""
        seen.append(city)
        return f"Sunny in {city}."

    agent = Agent(
        name="forecaster",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0),
        **agent_kw,
    )
    return agent, seen
