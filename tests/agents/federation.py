"""The federation of DESIGN §1 as uninstrumented clients: plain httpx, no OpenTelemetry,
nothing exported. Each names itself only in its User-Agent.

    python federation.py STORY BASE_URL

planner:   initializes, gets -32601 for server/discover, and stops.
prober:    reads the server card, then sends 22 POSTs to three undeclared paths.
assistant: initializes, then calls an unknown tool three times.
careful:   initializes and calls get_weather once. Instrumented when
           OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or RECORD=FILE, for OTLP/JSON lines) is set:
           the OpenTelemetry SDK and opentelemetry-instrumentation-httpx export its CLIENT
           spans and propagate their trace context, so the server's spans of the same calls
           are their children.
"""

import os
import sys

import httpx

story, base = sys.argv[1], sys.argv[2]
provider = None
if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("RECORD"):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    if os.environ.get("RECORD"):
        from otlp_file import JsonLinesExporter

        exporter = JsonLinesExporter(os.environ["RECORD"])
    else:
        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
headers = {
    "User-Agent": f"{story}-agent/1.0",
    "Accept": "application/json, text/event-stream",
}
client = httpx.Client(headers=headers, timeout=10)
ids = iter(range(1, 1000))


def rpc(method, params=None):
    body = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params or {}}
    answer = client.post(f"{base}/mcp", json=body)
    print(method, answer.status_code, answer.text[:120])
    return answer


def initialize():
    rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": story, "version": "1.0"}})


if story == "planner":
    initialize()
    assert "-32601" in rpc("server/discover").text
elif story == "prober":
    assert client.get(f"{base}/.well-known/mcp.json").status_code == 200
    paths = ["/mcp/mcp", "/mcp/sse", "/mcp/a2a/"]
    for i in range(22):
        assert client.post(f"{base}{paths[i % 3]}", json={}).status_code == 404
elif story == "assistant":
    initialize()
    for _ in range(3):
        assert '"isError":true' in rpc("tools/call", {"name": "weather.lookup-v0", "arguments": {}}).text
elif story == "careful":
    initialize()
    rpc("tools/call", {"name": "get_weather", "arguments": {"city": "Oslo"}})
else:
    sys.exit(f"unknown story {story}")
if provider is not None:
    provider.shutdown()
