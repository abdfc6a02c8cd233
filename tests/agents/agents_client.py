"""An agent on the OpenAI Agents SDK calling an MCP server through the SDK's own MCP client
(`MCPServerStreamableHttp`), traced as such agents are: OpenInference's instrumentation of
the Agents SDK (its agent and tool spans) and the MCP SDK's own CLIENT spans of each request,
which name no server. No HTTP instrumentation: the calls' only spans that name the server are
the server's own, which come later.

    python agents_client.py STORY BASE_URL

There is no model to be had here, so the agent's model is a script (the SDK's `Model`
interface, as its own tests script one): it asks for the story's tool calls, in order, then
answers. Everything else is the SDK's: the run, the MCP client, its tool listing and calls.

careful:   the agent calls get_weather for Oslo, once.
assistant: the agent calls get_weather with an empty city, three times (a tool error each time;
           without the city the SDK itself refuses the arguments, and sends nothing).
unknown:   the client lists the server's tools, then calls `get_forecast`, which the server
           does not have, three times (through the MCP client's own `call_tool`: the SDK's
           runner would not let a model call a tool the list lacks).

The service is `agents-STORY`; spans go over OTLP/HTTP (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
and, with RECORD=FILE, to FILE as OTLP/JSON lines too.
"""

import asyncio
import json
import os
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

story, base = sys.argv[1], sys.argv[2]
provider = TracerProvider(resource=Resource.create({"service.name": f"agents-{story}"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
if os.environ.get("RECORD"):
    from otlp_file import JsonLinesExporter

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["RECORD"])))
trace.set_tracer_provider(provider)
OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)

from agents import Agent, Runner, RunConfig, trace as agents_trace  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.mcp import MCPServerStreamableHttp  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


class Script(Model):
    """A model that asks for `calls` (tool name, arguments), one a turn, then answers."""

    def __init__(self, calls):
        self.calls = list(calls)

    async def get_response(self, *args, **kwargs):
        if self.calls:
            name, arguments = self.calls.pop(0)
            n = len(self.calls)
            item = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{n}",
                name=name,
                arguments=json.dumps(arguments),
                id=f"fc_{n}",
                status="completed",
            )
        else:
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            item = ResponseOutputMessage(
                type="message", id="msg", role="assistant", status="completed", content=[text]
            )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the script does not stream")


async def main():
    params = {"url": f"{base}/mcp", "timeout": 10}
    async with MCPServerStreamableHttp(params=params, name="weather") as server:
        if story == "unknown":
            with agents_trace("unknown tool"):
                print([t.name for t in await server.list_tools()])
                for _ in range(3):
                    try:
                        print(await server.call_tool("get_forecast", {}))
                    except Exception as e:  # noqa: BLE001 (the refusal is the story)
                        print("unknown", type(e).__name__, e)
            return
        calls = {
            "careful": [("get_weather", {"city": "Oslo"})],
            "assistant": [("get_weather", {"city": ""})] * 3,
        }[story]
        agent = Agent(name="weather-agent", instructions="Say the weather.", mcp_servers=[server])
        result = await Runner.run(agent, "The weather?", run_config=RunConfig(model=Script(calls)))
        print(story, result.final_output)


if story not in ("careful", "assistant", "unknown"):
    sys.exit(f"unknown story: {story}")
asyncio.run(main())
provider.shutdown()
