//! Traces (issue 57, ADR 0072): OpenTelemetry spans through
//! `tracing-opentelemetry`, exported with OTLP over HTTP (protobuf or
//! JSON), configured by the standard `OTEL_*` variables, and off unless an
//! OTLP endpoint is set.
//!
//! A request gets a span on the node that receives it (its parent taken
//! from the client's or the forwarding peer's `traceparent`), with child
//! spans for the forward, the event in the mailbox, the commit (from the
//! event's end to its writes being durable) and each actor call. Node
//! calls carry the current span as W3C `traceparent`. The request span
//! records its trace id as a field, so every log line inside it carries
//! it (ADR 0072: item 3 of the issue).
//!
//! Off, no span is made: each site asks [`on`] (one relaxed load) and
//! uses `Span::none()`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{Error, Result};

/// Whether spans are made and exported (set once, at start).
static ON: AtomicBool = AtomicBool::new(false);
/// Kept to flush and stop the exporter when the process ends.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether this process exports traces: sites make spans only then.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Where the spans go and how, read from the `OTEL_*` variables.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The variable that named the endpoint (for messages).
    pub endpoint_from: &'static str,
}

/// Samplers the SDK reads from `OTEL_TRACES_SAMPLER`; the ratio ones need
/// `OTEL_TRACES_SAMPLER_ARG` between 0 and 1.
const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

/// Reads the `OTEL_*` variables through `var`: `Ok(None)` when traces are
/// off (no endpoint, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`),
/// an error naming the variable for a value this build cannot honour. The
/// SDK itself falls back silently on a bad sampler or protocol; a node
/// refuses to start instead.
pub fn settings(var: impl Fn(&str) -> Option<String>) -> Result<Option<TraceSettings>> {
    let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if let Some(disabled) = var("OTEL_SDK_DISABLED") {
        match disabled.trim().to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            other => {
                return Err(Error::Config(format!(
                    "OTEL_SDK_DISABLED={other:?}: it is true or false"
                )));
            }
        }
    }
    if let Some(exporter) = var("OTEL_TRACES_EXPORTER") {
        match exporter.trim() {
            "none" => return Ok(None),
            "otlp" => {}
            other => {
                return Err(Error::Config(format!(
                    "OTEL_TRACES_EXPORTER={other:?}: wasmkeep exports traces with otlp (or none)"
                )));
            }
        }
    }
    let endpoint_from = if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    } else if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    } else {
        return Ok(None);
    };
    let endpoint = var(endpoint_from).unwrap_or_default();
    let uri: http::Uri = endpoint
        .trim()
        .parse()
        .map_err(|e| Error::Config(format!("{endpoint_from}={endpoint:?} is not a URL: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(Error::Config(format!(
            "{endpoint_from}={endpoint:?}: an http:// or https:// URL with a host (OTLP over HTTP, port 4318 by convention)"
        )));
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = var(name)
            && !matches!(protocol.trim(), "http/protobuf" | "http/json")
        {
            return Err(Error::Config(format!(
                "{name}={protocol:?}: wasmkeep sends OTLP over HTTP, http/protobuf or http/json (grpc is not built in)"
            )));
        }
    }
    if let Some(sampler) = var("OTEL_TRACES_SAMPLER") {
        let sampler = sampler.trim();
        if !SAMPLERS.contains(&sampler) {
            return Err(Error::Config(format!(
                "OTEL_TRACES_SAMPLER={sampler:?}: one of {}",
                SAMPLERS.join(", ")
            )));
        }
        if sampler.ends_with("traceidratio") {
            let arg = var("OTEL_TRACES_SAMPLER_ARG");
            let ratio = arg.as_deref().map(|a| a.trim().parse::<f64>());
            if !matches!(ratio, Some(Ok(r)) if (0.0..=1.0).contains(&r)) {
                return Err(Error::Config(format!(
                    "OTEL_TRACES_SAMPLER={sampler} needs OTEL_TRACES_SAMPLER_ARG, a ratio from 0 to 1 (got {arg:?})"
                )));
            }
        }
    }
    Ok(Some(TraceSettings { endpoint_from }))
}

/// The OTLP exporter and its batch processor, per the `OTEL_*` variables
/// (endpoint, protocol, headers, timeout, sampler, `OTEL_BSP_*`,
/// `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`): the provider, kept for
/// [`stop`], and its tracer. Marks traces on.
pub fn start(settings: &TraceSettings) -> Result<opentelemetry_sdk::trace::Tracer> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| {
            Error::Config(format!(
                "the OTLP trace exporter ({}): {e}",
                settings.endpoint_from
            ))
        })?;
    // The SDK's resource reads OTEL_SERVICE_NAME and
    // OTEL_RESOURCE_ATTRIBUTES; without either naming the service it would
    // say "unknown_service".
    let mut resource = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    if std::env::var_os("OTEL_SERVICE_NAME").is_none()
        && !std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="))
    {
        resource = resource.with_service_name("wasmkeep");
    }
    let resource = resource.build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("wasmkeep");
    if PROVIDER.set(provider).is_err() {
        return Err(Error::Config("traces were started twice".into()));
    }
    ON.store(true, Ordering::Relaxed);
    Ok(tracer)
}

/// Exports the spans still queued and stops the exporter (at most a few
/// seconds: the exporter's timeout). Blocks: call it outside the async
/// runtime, as the process ends.
pub fn stop() {
    if let Some(provider) = PROVIDER.get() {
        ON.store(false, Ordering::Relaxed);
        if let Err(e) = provider.shutdown() {
            tracing::warn!(error = %e, "the trace exporter did not stop cleanly");
        }
    }
}

/// The header of W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

struct Headers<'a>(&'a [(String, String)]);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

struct HeadersMut<'a>(&'a mut Vec<(String, String)>);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|(name, _)| !name.eq_ignore_ascii_case(key));
        // An empty `tracestate` is not sent.
        if !value.is_empty() {
            self.0.push((key.to_owned(), value));
        }
    }
}

/// The span of a request on the node that received it: its parent is the
/// `traceparent` in `headers` (a client's, or the forwarding peer's), and
/// its `trace_id` field is set, for the log lines inside it. `Span::none()`
/// while traces are off.
pub fn request_span(
    node: &str,
    method: &str,
    path: &str,
    actor: &dyn std::fmt::Display,
    headers: &[(String, String)],
) -> Span {
    if !on() {
        return Span::none();
    }
    let name = format!("{method} actor");
    let span = tracing::info_span!(
        target: "wasmkeep::trace",
        "request",
        otel.name = name.as_str(),
        otel.kind = "server",
        http.request.method = method,
        url.path = path,
        wasmkeep.actor = %actor,
        wasmkeep.node = node,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    let trace_id = span.context().span().span_context().trace_id();
    span.record("trace_id", tracing::field::display(trace_id));
    span
}

/// Whether `span` is recorded and exported (its trace was sampled). An
/// unsampled request gets no child spans: its own span only carries its
/// trace id to the log and to the peers (ADR 0072).
pub fn sampled(span: &Span) -> bool {
    !span.is_none() && span.context().span().span_context().is_sampled()
}

/// Whether the current span is sampled (see [`sampled`]): a child span is
/// worth making. False while traces are off.
pub fn current_sampled() -> bool {
    on() && sampled(&Span::current())
}

/// Records a request's answer on its span (an error status for a 5xx),
/// when the span is exported.
pub fn record_status(span: &Span, status: u16) {
    if !sampled(span) {
        return;
    }
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// Puts the current span's context in `headers` as `traceparent` (and
/// `tracestate`), replacing what was there: a forwarded request's parent
/// is the forward. Nothing while traces are off (a client's own header
/// then travels on untouched).
pub fn inject_current(headers: &mut Vec<(String, String)>) {
    if !on() {
        return;
    }
    let cx = Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    headers.retain(|(name, _)| {
        !name.eq_ignore_ascii_case(TRACEPARENT) && !name.eq_ignore_ascii_case(TRACESTATE)
    });
    TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
}

/// The current span while traces are on, to carry into another task (a
/// request's job into the actor's mailbox); else `Span::none()`.
pub fn current() -> Span {
    if on() { Span::current() } else { Span::none() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_of(vars: &[(&str, &str)]) -> Result<Option<TraceSettings>> {
        settings(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn traces_are_off_without_an_endpoint_or_when_disabled() {
        assert_eq!(settings_of(&[]).ok(), Some(None));
        assert_eq!(
            settings_of(&[("OTEL_TRACES_SAMPLER", "always_on")]).ok(),
            Some(None)
        );
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(matches!(settings_of(&[endpoint]), Ok(Some(_))));
        assert_eq!(
            settings_of(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).ok(),
            Some(None)
        );
        assert_eq!(
            settings_of(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).ok(),
            Some(None)
        );
        let traces = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces",
        );
        assert_eq!(
            settings_of(&[traces])
                .ok()
                .flatten()
                .map(|s| s.endpoint_from),
            Some("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        );
    }

    #[test]
    fn a_setting_this_build_cannot_honour_is_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        for (vars, named) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "grpc is not built in",
            ),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/xml")],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_SAMPLER", "traceidratio")],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![
                    endpoint,
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
                ],
                "a ratio from 0 to 1",
            ),
            (
                vec![endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![endpoint, ("OTEL_SDK_DISABLED", "maybe")],
                "OTEL_SDK_DISABLED",
            ),
        ] {
            let error = settings_of(&vars).expect_err("refused").to_string();
            assert!(error.contains(named), "{vars:?}: {error}");
        }
        let sampled = [
            endpoint,
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ];
        assert!(matches!(settings_of(&sampled), Ok(Some(_))));
    }

    #[test]
    fn a_context_is_read_from_and_written_to_headers_by_name_case_blind() {
        let headers = vec![(
            "TraceParent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )];
        let cx = TraceContextPropagator::new().extract(&Headers(&headers));
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut out = headers.clone();
        TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(&mut out));
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, TRACEPARENT);
        assert_eq!(out[0].1, headers[0].1);
    }
}
