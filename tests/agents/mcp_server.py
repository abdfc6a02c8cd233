"""An MCP server on the official Python SDK (`mcp`), its OpenTelemetry spans on (the SDK's
default), behind the ASGI instrumentation, exporting its SERVER spans over OTLP/HTTP.

    python mcp_server.py PORT

OTEL_SERVICE_NAME and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT say who it is and where its spans
go; with RECORD=FILE they are appended to FILE as OTLP/JSON lines instead, as each ends. It
serves one tool, `get_weather`, and its server card at /.well-known/mcp.json.
"""

import os
import sys

import uvicorn
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from starlette.responses import JSONResponse

from mcp.server.mcpserver import MCPServer

port = int(sys.argv[1])
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
    return f"sunny in {city}"


@mcp.custom_route("/.well-known/mcp.json", methods=["GET"])
async def card(request):
    url = f"http://127.0.0.1:{port}/mcp"
    return JSONResponse({"name": "weather", "remotes": [{"type": "streamable-http", "url": url}]})


app = OpenTelemetryMiddleware(mcp.streamable_http_app(stateless_http=True, json_response=True))
try:
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
finally:
    provider.shutdown()
