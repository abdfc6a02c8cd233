// A Java agent for tests/polyglot.rs: the official MCP Java SDK's client over streamable HTTP
// (on the JDK's java.net.http.HttpClient) and OkHttp calling an HTTP API, both HTTP clients
// instrumented by the OpenTelemetry Java agent, which exports the spans over OTLP/HTTP.
//
//     java -javaagent:opentelemetry-javaagent.jar -jar agent.jar STORY BASE_URL
//
// Configured as a user configures the Java agent, through the environment (OTEL_SERVICE_NAME,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_BSP_SCHEDULE_DELAY); nothing in this program knows
// of OpenTelemetry. The stories are the Go agent's (tests/agents/go/main.go):
//
//   planner    connects, asks for completion/complete (-32601), and stops.
//   prober     reads the server card, then connects at three undeclared paths, 22 times.
//   assistant  calls get_weather without its city three times (a tool error each time).
//   careful    calls get_weather once, as it should.
//   retrier    reads /openapi.json, then POSTs /v1/reservations until it is not 503, backing
//              off, at most three retries.
//   resend     reads /openapi.json, then POSTs /v1/orders/legacy, which answers 307 to
//              /v1/orders: OkHttp sends the request again on its own, and the Java agent
//              records that request's `http.request.resend_count`.
package refusalgate;

import io.modelcontextprotocol.client.McpClient;
import io.modelcontextprotocol.client.McpSyncClient;
import io.modelcontextprotocol.client.transport.HttpClientStreamableHttpTransport;
import io.modelcontextprotocol.spec.McpSchema;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import okhttp3.MediaType;
import okhttp3.OkHttpClient;
import okhttp3.Request;
import okhttp3.RequestBody;
import okhttp3.Response;

/** The stories, one a run. */
public final class Agent {
  private static final List<String> PATHS = List.of("/mcp/mcp", "/mcp/v2", "/mcp/a2a");

  private Agent() {}

  /** Plays the story `args[0]` against `args[1]`. */
  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: agent STORY BASE_URL");
      System.exit(2);
    }
    String story = args[0];
    String base = args[1];
    switch (story) {
      case "planner" -> planner(base);
      case "prober" -> prober(base);
      case "assistant" -> calling(base, 3, Map.of());
      case "careful" -> calling(base, 1, Map.of("city", "Oslo"));
      case "retrier" -> retrier(base);
      case "resend" -> resend(base);
      default -> {
        System.err.println("unknown story " + story);
        System.exit(2);
      }
    }
  }

  /** An MCP client of the server at `base` + `endpoint`, initialized. */
  private static McpSyncClient connect(String base, String endpoint) {
    var transport = HttpClientStreamableHttpTransport.builder(base).endpoint(endpoint).build();
    McpSyncClient client =
        McpClient.sync(transport).requestTimeout(Duration.ofSeconds(10)).build();
    client.initialize();
    return client;
  }

  private static void planner(String base) {
    try (McpSyncClient client = connect(base, "/mcp")) {
      var ref = new McpSchema.PromptReference("forecast");
      var argument = new McpSchema.CompleteRequest.CompleteArgument("city", "Os");
      client.completeCompletion(new McpSchema.CompleteRequest(ref, argument));
      throw new IllegalStateException("completion/complete answered");
    } catch (RuntimeException e) {
      System.out.println("planner: " + e);
    }
  }

  private static void prober(String base) throws Exception {
    read(base + "/.well-known/mcp.json");
    for (int i = 0; i < 22; i++) {
      String path = PATHS.get(i % 3);
      try (McpSyncClient client = connect(base, path)) {
        throw new IllegalStateException(path + " answered");
      } catch (RuntimeException e) {
        System.out.println("prober: " + path + " " + e.getClass().getSimpleName());
      }
    }
  }

  private static void calling(String base, int times, Map<String, Object> arguments) {
    try (McpSyncClient client = connect(base, "/mcp")) {
      for (int i = 0; i < times; i++) {
        var result = client.callTool(new McpSchema.CallToolRequest("get_weather", arguments));
        System.out.println("get_weather: error " + result.isError());
      }
    }
  }

  /** The HTTP API's client: OkHttp, following redirects (its default). */
  private static final OkHttpClient HTTP = new OkHttpClient();

  /** GETs `url`, and fails unless it is 200. */
  private static void read(String url) throws Exception {
    try (Response response = HTTP.newCall(new Request.Builder().url(url).build()).execute()) {
      if (response.code() != 200) {
        throw new IllegalStateException("GET " + url + ": " + response.code());
      }
    }
  }

  /** POSTs an order to `url`; returns the status. */
  private static int post(String url) throws Exception {
    var json = MediaType.get("application/json");
    var body = RequestBody.create("{\"item\":\"umbrella\"}", json);
    var request = new Request.Builder().url(url).post(body).build();
    try (Response response = HTTP.newCall(request).execute()) {
      return response.code();
    }
  }

  private static void retrier(String base) throws Exception {
    read(base + "/openapi.json");
    long backoff = 50;
    for (int retry = 0; ; retry++) {
      int status = post(base + "/v1/reservations");
      System.out.println("retrier: " + status);
      if (status != 503 || retry == 3) {
        return;
      }
      Thread.sleep(backoff);
      backoff *= 2;
    }
  }

  private static void resend(String base) throws Exception {
    read(base + "/openapi.json");
    System.out.println("resend: " + post(base + "/v1/orders/legacy"));
  }
}
