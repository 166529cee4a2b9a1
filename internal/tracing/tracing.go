// Package tracing sends OpenTelemetry traces of tool calls (the policy's
// decision, the queue, the sandbox's start, installs, the run, upstream
// calls) to an OTLP collector over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, with the official Go
// SDK; without it the global tracer is the no-op one and nothing is sent
// or kept. The exporter reads the standard OTEL_* variables (headers,
// timeout, protocol options); the layers instrument themselves through
// the otel API with Tracer.
package tracing

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of pysandbox's spans.
const Name = "github.com/pysandbox/pysandbox"

// Tracer is the tracer every layer starts its spans with.
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Enabled says whether the environment asks for traces.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the OTLP exporter when Enabled; shutdown flushes what is
// left. Without it, both are no-ops.
func Setup(ctx context.Context, version string) (shutdown func(context.Context) error, err error) {
	if !Enabled() || os.Getenv("OTEL_SDK_DISABLED") == "true" {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "pysandbox"), attribute.String("service.version", version)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}
