"""DESIGN §1's clients on real agent stacks that export their own telemetry.

    python stack_client.py STACK STORY BASE_URL

STACK is `fastmcp` (FastMCP 4's client, its native OpenTelemetry on), `mcp` (the official
MCP SDK 2's ClientSession over streamable HTTP), or `gateway` (the same MCP SDK client, its
BASE_URL a gateway in front of the server); either way the MCP SDK sends over `httpx2`,
which `opentelemetry-instrumentation-httpx` reaches through its HTTPX2ClientInstrumentor, so
each call is the stack's spans around an HTTP CLIENT span. The spans go over OTLP/HTTP
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and, with RECORD=FILE, to FILE as OTLP/JSON lines too.
The service is `STACK-STORY`.

planner:   reads the server's contract, asks for `completion/complete` (-32601), and stops.
prober:    reads the server card, then tries to connect at three undeclared paths, 22
           requests in all where 3 would have done.
assistant: calls get_weather without its argument, three times (a tool error each time).
careful:   calls get_weather once, as it should.
"""

import asyncio
import os
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

stack, story, base = sys.argv[1], sys.argv[2], sys.argv[3]
provider = TracerProvider(resource=Resource.create({"service.name": f"{stack}-{story}"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
if os.environ.get("RECORD"):
    from otlp_file import JsonLinesExporter

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["RECORD"])))
trace.set_tracer_provider(provider)
HTTPX2ClientInstrumentor().instrument()

import httpx2  # noqa: E402  (instrumented above)
import mcp.types as types  # noqa: E402

PATHS = ["/mcp/mcp", "/mcp/v2", "/mcp/a2a"]
FORECAST = types.PromptReference(type="ref/prompt", name="forecast")


async def fastmcp():
    from fastmcp import Client

    if story == "prober":
        # Each connection tries `server/discover`, then `initialize`: two requests each.
        for i in range(11):
            try:
                async with Client(f"{base}{PATHS[i % 3]}"):
                    pass
            except Exception as e:  # noqa: BLE001 (a 404 is what the story is about)
                print("prober", PATHS[i % 3], type(e).__name__)
        return
    async with Client(f"{base}/mcp") as client:
        if story == "planner":
            try:
                await client.complete(FORECAST, {"name": "city", "value": "Os"})
            except Exception as e:  # noqa: BLE001
                print("planner", type(e).__name__, e)
        elif story == "assistant":
            for _ in range(3):
                try:
                    await client.call_tool("get_weather", {})
                except Exception as e:  # noqa: BLE001
                    print("assistant", type(e).__name__)
        elif story == "careful":
            print(await client.call_tool("get_weather", {"city": "Oslo"}))


async def sdk():
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def session(url, then):
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as s:
                await s.initialize()
                await then(s)

    if story == "prober":
        for i in range(22):
            try:
                await session(f"{base}{PATHS[i % 3]}", lambda s: asyncio.sleep(0))
            except BaseException as e:  # noqa: BLE001 (an exception group of the 404)
                print("prober", PATHS[i % 3], type(e).__name__)
        return

    async def planner(s):
        try:
            await s.complete(FORECAST, {"name": "city", "value": "Os"})
        except Exception as e:  # noqa: BLE001
            print("planner", type(e).__name__, e)

    async def assistant(s):
        for _ in range(3):
            print("assistant", (await s.call_tool("get_weather", {})).is_error)

    async def careful(s):
        print(await s.call_tool("get_weather", {"city": "Oslo"}))

    await session(f"{base}/mcp", {"planner": planner, "assistant": assistant, "careful": careful}[story])


async def main():
    if story == "prober":
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"{base}/.well-known/mcp.json")).status_code == 200
    await (fastmcp() if stack == "fastmcp" else sdk())


if story not in ("planner", "prober", "assistant", "careful") or stack not in (
    "fastmcp",
    "mcp",
    "gateway",
):
    sys.exit(f"unknown stack or story: {stack} {story}")
asyncio.run(main())
provider.shutdown()
