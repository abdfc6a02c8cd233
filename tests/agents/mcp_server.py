"""An MCP server on the official Python SDK (`mcp`), its OpenTelemetry spans on (the SDK's
default), behind the ASGI instrumentation, exporting its SERVER spans over OTLP/HTTP.

    python mcp_server.py PORT [--stateful [--refuse-stream] [--idle SECONDS]]

OTEL_SERVICE_NAME and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT say who it is and where its spans
go; with RECORD=FILE they are appended to FILE as OTLP/JSON lines instead, as each ends. It
serves one tool, `get_weather` (a tool error for an empty city), and its server card at /.well-known/mcp.json; statelessly,
unless told:

--stateful       keeps sessions (DESIGN §12's flows use the freedoms that gives a server):
--refuse-stream  answers the optional `GET` stream and the client's `DELETE` at session end
                 with 405 (the transport: the server MAY do both);
--idle SECONDS   forgets a session idle that long (`session_idle_timeout`); a request in it
                 is then answered 404 `Session not found`, and the client MUST start a new
                 session.
"""

import argparse
import os

import uvicorn
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from starlette.responses import JSONResponse, Response

from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("--stateful", action="store_true")
parser.add_argument("--refuse-stream", action="store_true")
parser.add_argument("--idle", type=float, default=None)
args = parser.parse_args()
port = args.port

provider = TracerProvider(resource=Resource.create())
if os.environ.get("RECORD"):
    from otlp_file import JsonLinesExporter

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["RECORD"])))
else:
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

mcp = MCPServer("weather")


@mcp.tool()
def get_weather(city: str) -> str:
    """The weather in a city."""
    if not city:
        raise ValueError("no city")
    return f"sunny in {city}"


@mcp.custom_route("/.well-known/mcp.json", methods=["GET"])
async def card(request):
    url = f"http://127.0.0.1:{port}/mcp"
    return JSONResponse({"name": "weather", "remotes": [{"type": "streamable-http", "url": url}]})


options = {"stateless_http": not args.stateful, "json_response": True}
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
    uvicorn.run(OpenTelemetryMiddleware(app), host="127.0.0.1", port=port, log_level="warning")
finally:
    provider.shutdown()
