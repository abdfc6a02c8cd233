"""An MCP server on FastMCP 4, its native OpenTelemetry on (FastMCP records a SERVER span per
message as soon as an SDK is configured), exporting over OTLP/HTTP.

    python fastmcp_server.py PORT

OTEL_SERVICE_NAME and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT say who it is and where its spans
go. It serves one tool, `get_weather`, and its server card at /.well-known/mcp.json; it
declares no completions, so `completion/complete` is answered -32601.
"""

import sys

import uvicorn
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.responses import JSONResponse

from fastmcp import FastMCP

port = int(sys.argv[1])
provider = TracerProvider(resource=Resource.create())
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

mcp = FastMCP("weather")


@mcp.tool()
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@mcp.custom_route("/.well-known/mcp.json", methods=["GET"])
async def card(request):
    url = f"http://127.0.0.1:{port}/mcp"
    return JSONResponse({"name": "weather", "remotes": [{"type": "streamable-http", "url": url}]})


app = mcp.http_app(stateless_http=True, json_response=True)
try:
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
finally:
    provider.shutdown()
