"""Compliant clients doing what the MCP specification tells them to (DESIGN §12), on real
stacks that export their own telemetry.

    python flow_client.py STACK FLOW BASE_URL [SERVICE]

STACK is `mcp` (the official MCP SDK 2) or `fastmcp` (FastMCP 4's client); both send over
`httpx2`, which `opentelemetry-instrumentation-httpx` reaches, so each call is the stack's
span around an HTTP CLIENT span. The spans go over OTLP/HTTP
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) as SERVICE, by default `STACK-FLOW`. The session and
version request headers are on the HTTP spans when the instrumentation is told to capture them
(OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST=mcp-session-id,mcp-protocol-version).
With RECORD=FILE they are appended to FILE as OTLP/JSON lines too.

stream:   three sessions one after the other against a server that refuses the optional
          `GET` stream and the `DELETE` at session end with 405; each calls a tool once.
expired:  a call, then a pause longer than the server keeps an idle session: the next call
          is answered 404 `Session not found`, so the client starts a new session and calls
          again, as the transport says it MUST.
version:  a client newer than the server: its `server/discover` proposes a version the server
          does not know, is answered -32022 (HTTP 400) with the versions it does, and the
          SDK's own negotiation asks again with the one they share.
unknown:  lists the tools, then calls one that is not among them, three times.
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

stack, flow, base = sys.argv[1], sys.argv[2], sys.argv[3]
service = sys.argv[4] if len(sys.argv) > 4 else f"{stack}-{flow}"
provider = TracerProvider(resource=Resource.create({"service.name": service}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
if os.environ.get("RECORD"):
    from otlp_file import JsonLinesExporter

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["RECORD"])))
trace.set_tracer_provider(provider)
HTTPX2ClientInstrumentor().instrument()

from mcp import ClientSession  # noqa: E402  (instrumented above)
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

URL = f"{base}/mcp"
CITY = {"city": "Oslo"}


async def session(then):
    """One session: the handshake, `then`, and the `DELETE` that ends it."""
    async with streamable_http_client(URL) as (read, write, *_):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await then(s)


async def stream():
    for _ in range(3):
        await session(lambda s: s.call_tool("get_weather", CITY))


async def expired():
    async def pause_then_call(s):
        await s.call_tool("get_weather", CITY)
        await asyncio.sleep(2.5)
        await s.call_tool("get_weather", CITY)

    try:
        await session(pause_then_call)
    except BaseException as e:  # noqa: BLE001 (the gone session, in an exception group)
        print("expired", type(e).__name__, e)
    await session(lambda s: s.call_tool("get_weather", CITY))


async def version():
    # The SDK proposes its newest version first; a newer SDK knows one this server does not.
    # Everything after is the SDK's own negotiation (mcp.client._probe).
    from mcp.client import _probe

    from mcp import Client

    newer = "2027-03-30"
    _probe.LATEST_MODERN_VERSION = newer
    _probe.MODERN_PROTOCOL_VERSIONS = (*_probe.MODERN_PROTOCOL_VERSIONS, newer)
    async with Client(URL) as client:
        print("version", client.session.discover_result is not None)
        await client.call_tool("get_weather", CITY)


async def unknown():
    async def calls(s):
        print("tools", [t.name for t in (await s.list_tools()).tools])
        for _ in range(3):
            print("unknown", (await s.call_tool("get_forecast", CITY)).is_error)

    await session(calls)


async def unknown_fastmcp():
    from fastmcp import Client

    async with Client(URL) as client:
        print("tools", [t.name for t in await client.list_tools()])
        for _ in range(3):
            try:
                await client.call_tool("get_forecast", CITY)
            except Exception as e:  # noqa: BLE001 (the tool error is the flow)
                print("unknown", type(e).__name__, e)


flows = {
    ("mcp", "stream"): stream,
    ("mcp", "expired"): expired,
    ("mcp", "version"): version,
    ("mcp", "unknown"): unknown,
    ("fastmcp", "unknown"): unknown_fastmcp,
}
if (stack, flow) not in flows:
    sys.exit(f"unknown stack or flow: {stack} {flow}")
asyncio.run(flows[(stack, flow)]())
provider.shutdown()
