"""A span exporter that appends OTLP/JSON lines to a file, one export request a line, in the
shape the Collector's file exporter writes and `refusal-gate replay` reads (hex ids,
integer enums)."""

import base64
import json

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, path):
        self.path = path

    def export(self, spans):
        request = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        for rs in request.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64decode(span[key]).hex()
        with open(self.path, "a") as f:
            f.write(json.dumps(request, separators=(",", ":")) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass
