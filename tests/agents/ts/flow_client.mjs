// Compliant clients on the MCP TypeScript SDK doing what the MCP transport allows a server to
// refuse (DESIGN §12.4), their HTTP requests traced by OpenTelemetry's undici instrumentation
// (the SDK sends with fetch) with the session and version request headers captured.
//
//     node flow_client.mjs FLOW BASE_URL
//
// stream:  three sessions one after the other; after its handshake each opens the optional
//          `GET` stream, which the server may refuse with 405, then calls a tool.
// delete:  three sessions, each ended by the `DELETE` the SDK sends on terminateSession(),
//          which the server may refuse with 405.
//
// The spans go over OTLP/HTTP (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) as service `ts-FLOW`.

import { registerInstrumentations } from "@opentelemetry/instrumentation";
import { UndiciInstrumentation } from "@opentelemetry/instrumentation-undici";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, NodeTracerProvider } from "@opentelemetry/sdk-trace-node";

const [flow, base] = process.argv.slice(2);
if (!["stream", "delete"].includes(flow) || !base) {
  console.error(`usage: node flow_client.mjs stream|delete BASE_URL (got ${flow} ${base})`);
  process.exit(2);
}
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ "service.name": `ts-${flow}` }),
  spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
});
provider.register();
registerInstrumentations({
  instrumentations: [
    new UndiciInstrumentation({
      headersToSpanAttributes: { requestHeaders: ["mcp-session-id", "mcp-protocol-version"] },
    }),
  ],
});

// Imported after the instrumentation is registered.
const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = await import(
  "@modelcontextprotocol/sdk/client/streamableHttp.js"
);

for (let i = 0; i < 3; i++) {
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`));
  const client = new Client({ name: `ts-${flow}`, version: "1.0.0" });
  await client.connect(transport);
  // The GET stream starts once the server accepts `notifications/initialized`; let it answer.
  await new Promise((resolve) => setTimeout(resolve, 200));
  const result = await client.callTool({ name: "get_weather", arguments: { city: "Oslo" } });
  console.log(flow, i, result.isError ? "error" : "ok", transport.sessionId ?? "no session");
  if (flow === "delete") {
    await transport.terminateSession();
  }
  await client.close();
}
await provider.shutdown();
