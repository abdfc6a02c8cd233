// A Go agent for tests/polyglot.rs: the official MCP Go SDK's client over streamable HTTP and a
// plain net/http client of an HTTP API, each HTTP client's transport instrumented by otelhttp,
// the spans exported by the OpenTelemetry Go SDK over OTLP/HTTP.
//
//	agent STORY BASE_URL
//
// Configured as a user configures it, through the environment: OTEL_SERVICE_NAME,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_BSP_SCHEDULE_DELAY. With RECORD=FILE each span is
// also appended to FILE as one JSON line (name, kind, trace id, status, attributes), so that
// the test can count the requests the agent sent and show what its spans carried.
//
// Stories on an MCP server (BASE_URL its origin; the server at /mcp):
//
//	planner    connects, asks for completion/complete (-32601), and stops.
//	prober     reads the server card, then connects at three undeclared paths, 22 times.
//	assistant  calls get_weather without its city three times (a tool error each time).
//	careful    calls get_weather once, as it should.
//
// Stories on an HTTP API (BASE_URL its origin, its OpenAPI document at /openapi.json):
//
//	retrier    reads the document, then POSTs /v1/reservations until it is not 503, backing off,
//	           at most three retries.
//	resend     reads the document, then POSTs /v1/orders/legacy, which answers 307 to
//	           /v1/orders: the HTTP client sends the request again on its own.
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// paths are the undeclared paths the prober tries.
var paths = []string{"/mcp/mcp", "/mcp/v2", "/mcp/a2a"}

func main() {
	if len(os.Args) != 3 {
		fail(fmt.Errorf("usage: agent STORY BASE_URL"))
	}
	story, base := os.Args[1], os.Args[2]
	ctx := context.Background()
	provider, err := tracing(ctx)
	if err != nil {
		fail(err)
	}
	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport)}
	stories := map[string]func(context.Context, *http.Client, string) error{
		"planner": planner, "prober": prober, "assistant": assistant, "careful": careful,
		"retrier": retrier, "resend": resend,
	}
	play, ok := stories[story]
	if !ok {
		fail(fmt.Errorf("unknown story %q", story))
	}
	played := play(ctx, client, base)
	if err := provider.Shutdown(ctx); err != nil {
		fail(err)
	}
	if played != nil {
		fail(played)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "agent:", err)
	os.Exit(1)
}

// tracing installs the SDK's tracer provider: a batch of OTLP/HTTP exports, the W3C trace
// context propagated on requests, and with RECORD a file of every span.
func tracing(ctx context.Context) (*sdktrace.TracerProvider, error) {
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	options := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exporter)}
	if file := os.Getenv("RECORD"); file != "" {
		options = append(options, sdktrace.WithSyncer(&recorder{file: file}))
	}
	provider := sdktrace.NewTracerProvider(options...)
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return provider, nil
}

// connect opens an MCP session at url over streamable HTTP on client.
func connect(ctx context.Context, client *http.Client, url string) (*mcp.ClientSession, error) {
	agent := mcp.NewClient(&mcp.Implementation{Name: "refusal-gate-go-agent", Version: "1.0.0"}, nil)
	transport := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: client, MaxRetries: -1}
	return agent.Connect(ctx, transport, nil)
}

func planner(ctx context.Context, client *http.Client, base string) error {
	session, err := connect(ctx, client, base+"/mcp")
	if err != nil {
		return err
	}
	defer session.Close()
	_, err = session.Complete(ctx, &mcp.CompleteParams{
		Ref:      &mcp.CompleteReference{Type: "ref/prompt", Name: "forecast"},
		Argument: mcp.CompleteParamsArgument{Name: "city", Value: "Os"},
	})
	fmt.Println("planner:", err)
	return nil
}

func prober(ctx context.Context, client *http.Client, base string) error {
	if err := read(ctx, client, base+"/.well-known/mcp.json"); err != nil {
		return err
	}
	for i := range 22 {
		session, err := connect(ctx, client, base+paths[i%3])
		if err == nil {
			session.Close()
			return fmt.Errorf("%s answered", paths[i%3])
		}
		fmt.Println("prober:", paths[i%3], err)
	}
	return nil
}

func assistant(ctx context.Context, client *http.Client, base string) error {
	return calling(ctx, client, base, 3, map[string]any{})
}

func careful(ctx context.Context, client *http.Client, base string) error {
	return calling(ctx, client, base, 1, map[string]any{"city": "Oslo"})
}

// calling calls get_weather with arguments, times times, in one session.
func calling(ctx context.Context, client *http.Client, base string, times int, arguments map[string]any) error {
	session, err := connect(ctx, client, base+"/mcp")
	if err != nil {
		return err
	}
	defer session.Close()
	for range times {
		result, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "get_weather", Arguments: arguments})
		if err != nil {
			return err
		}
		fmt.Println("get_weather: error", result.IsError)
	}
	return nil
}

func retrier(ctx context.Context, client *http.Client, base string) error {
	if err := read(ctx, client, base+"/openapi.json"); err != nil {
		return err
	}
	backoff := 50 * time.Millisecond
	for retry := 0; ; retry++ {
		status, err := post(ctx, client, base+"/v1/reservations")
		if err != nil {
			return err
		}
		fmt.Println("retrier:", status)
		if status != http.StatusServiceUnavailable || retry == 3 {
			return nil
		}
		time.Sleep(backoff)
		backoff *= 2
	}
}

func resend(ctx context.Context, client *http.Client, base string) error {
	if err := read(ctx, client, base+"/openapi.json"); err != nil {
		return err
	}
	status, err := post(ctx, client, base+"/v1/orders/legacy")
	fmt.Println("resend:", status)
	return err
}

// read GETs url, and fails unless it is 200.
func read(ctx context.Context, client *http.Client, url string) error {
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	_, _ = io.Copy(io.Discard, response.Body)
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, response.Status)
	}
	return nil
}

// post POSTs an order to url; returns the status.
func post(ctx context.Context, client *http.Client, url string) (int, error) {
	body := []byte(`{"item":"umbrella"}`)
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	request.Header.Set("Content-Type", "application/json")
	response, err := client.Do(request)
	if err != nil {
		return 0, err
	}
	defer response.Body.Close()
	_, _ = io.Copy(io.Discard, response.Body)
	return response.StatusCode, nil
}

// recorder appends each span to a file as a JSON line.
type recorder struct {
	file string
	mu   sync.Mutex
}

func (r *recorder) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, err := os.OpenFile(r.file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	for _, span := range spans {
		attributes := map[string]any{}
		for _, kv := range span.Attributes() {
			attributes[string(kv.Key)] = kv.Value.AsInterface()
		}
		id := span.SpanContext().TraceID()
		line, err := json.Marshal(map[string]any{
			"name":       span.Name(),
			"kind":       span.SpanKind().String(),
			"traceId":    hex.EncodeToString(id[:]),
			"status":     span.Status().Code.String(),
			"attributes": attributes,
		})
		if err != nil {
			return err
		}
		if _, err := out.Write(append(line, '\n')); err != nil {
			return err
		}
	}
	return nil
}

func (r *recorder) Shutdown(context.Context) error { return nil }
