#!/usr/bin/env python3
"""A Python agent for tests/agents.rs: httpx calls instrumented by the official OpenTelemetry
SDK and opentelemetry-instrumentation-httpx, exported over OTLP/HTTP to refusal-gate.

Everything is configured the way a user would configure it, through the environment:
OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and
OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE=retry-after so that the span
records the server's Retry-After (as `http.response.header.retry_after`, an array).

    retry_after.py STORY URL

Stories, each a few calls of POST URL:
  honours   waits as long as each Retry-After says (delay-seconds or an HTTP-date), then
            retries, at most three attempts;
  ignores   retries 100 ms after every 429 or 503, whatever the server said, three attempts.
It prints one line per attempt (status, Retry-After) and exits 0 once its spans are exported.
"""
import email.utils
import sys
import time

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def server_delay(response):
    """Seconds the response asks to wait: delay-seconds or an HTTP-date; None when silent."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    when = email.utils.parsedate_to_datetime(value)
    return max(0.0, when.timestamp() - time.time())


def main():
    story, url = sys.argv[1], sys.argv[2]
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    with httpx.Client(timeout=10) as client:
        for _ in range(3):
            response = client.post(url, json={"q": 1})
            delay = server_delay(response)
            print(f"{story}: {response.status_code} retry-after={response.headers.get('retry-after')}",
                  flush=True)
            if response.status_code not in (429, 503):
                break
            if story == "honours":
                # The HTTP-date has whole seconds: wait until the second it names has begun.
                time.sleep((delay if delay is not None else 1) + 0.05)
            else:
                time.sleep(0.1)
    provider.shutdown()  # flushes the batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
