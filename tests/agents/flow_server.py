"""A stateful MCP server on the official Python SDK (`mcp`), for the flows of DESIGN §12: it
keeps sessions, and it uses the freedoms the MCP transport gives a server.

    python flow_server.py PORT [--refuse-stream] [--idle SECONDS]

--refuse-stream  answers the optional `GET` stream and the client's `DELETE` at session end
                 with 405 (the transport: the server MAY do both).
--idle SECONDS   forgets a session idle that long (`session_idle_timeout`); a request in it
                 is then answered 404 `Session not found`, and the client MUST start a new
                 session.

Its spans (the SDK's SERVER spans behind the ASGI instrumentation) go over OTLP/HTTP as
OTEL_SERVICE_NAME to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT. It serves one tool, `get_weather`.
"""

import argparse

import uvicorn
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.responses import Response

from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("--refuse-stream", action="store_true")
parser.add_argument("--idle", type=float, default=None)
args = parser.parse_args()

provider = TracerProvider(resource=Resource.create())
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

mcp = MCPServer("weather")


@mcp.tool()
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


options = {"json_response": True}
if args.idle is not None:
    options["session_idle_timeout"] = args.idle
served = mcp.streamable_http_app(**options)


async def app(scope, receive, send):
    """The SDK's app, but for what --refuse-stream refuses."""
    refused = scope["type"] == "http" and scope["method"] in ("GET", "DELETE")
    if args.refuse_stream and refused and scope["path"] == "/mcp":
        await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
        return
    await served(scope, receive, send)


try:
    uvicorn.run(OpenTelemetryMiddleware(app), host="127.0.0.1", port=args.port, log_level="warning")
finally:
    provider.shutdown()
