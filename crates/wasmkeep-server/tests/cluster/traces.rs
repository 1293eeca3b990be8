//! Traces across nodes (issue 57, ADR 0072): two real nodes export OTLP
//! over HTTP (JSON) to a receiver inside the test. A client's request with
//! a `traceparent`, sent to the node that does not hold the actor, gives
//! one trace on both nodes: the receiving node's request and forward, the
//! holder's request (a child of the forward), event and commit. An actor's
//! call to an actor on the other node is one trace too, an alarm's delivery
//! is a span of its own, and the holder's log lines inside the request
//! carry its trace id.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use crate::runner::{BucketKind, Cluster, ClusterOptions};

/// How long the spans of a request may take to arrive (the nodes export
/// every 100 ms here).
const SPANS_TIME_MAX: Duration = Duration::from_secs(30);
const PHASE_TIME_MAX: Duration = Duration::from_secs(60);
/// Names tried to find an actor held by a given node.
const CANDIDATES: usize = 20;

/// One exported span, as the test reads it.
#[derive(Debug, Clone)]
struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP receiver on loopback: every span of every request body it
/// is sent, decoded from OTLP JSON.
struct Receiver {
    port: u16,
    spans: mpsc::UnboundedReceiver<Span>,
    seen: Vec<Span>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    async fn start() -> anyhow::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (tx, spans) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let status = match body {
                                Ok(body) if path == "/v1/traces" => match decode(&body) {
                                    Ok(spans) => {
                                        for span in spans {
                                            let _ = tx.send(span);
                                        }
                                        200
                                    }
                                    Err(e) => {
                                        eprintln!("receiver: undecodable OTLP body: {e:#}");
                                        400
                                    }
                                },
                                _ => 404,
                            };
                            let response = hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(b"{}")))
                                .expect("static parts are valid");
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Receiver {
            port,
            spans,
            seen: Vec::new(),
            task,
        })
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the spans of `trace_id` received so far satisfy `done`;
    /// returns them.
    async fn wait_for(
        &mut self,
        trace_id: &str,
        what: &str,
        done: impl Fn(&[Span]) -> bool,
    ) -> anyhow::Result<Vec<Span>> {
        let of_trace = |all: &[Span]| -> Vec<Span> {
            all.iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect()
        };
        self.wait_until(what, |all| done(&of_trace(all))).await?;
        Ok(of_trace(&self.seen))
    }

    /// Waits until every span received so far satisfies `done`.
    async fn wait_until(
        &mut self,
        what: &str,
        done: impl Fn(&[Span]) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + SPANS_TIME_MAX;
        while !done(&self.seen) {
            match tokio::time::timeout_at(deadline, self.spans.recv()).await {
                Ok(Some(span)) => self.seen.push(span),
                Ok(None) => bail!("the receiver stopped"),
                Err(_) => bail!(
                    "{what}: not there after {SPANS_TIME_MAX:?}; spans: {:#?}",
                    self.seen
                ),
            }
        }
        Ok(())
    }
}

/// The spans of an OTLP JSON export request.
fn decode(body: &[u8]) -> anyhow::Result<Vec<Span>> {
    let json: serde_json::Value = serde_json::from_slice(body).context("not JSON")?;
    let mut out = Vec::new();
    let text = |v: &serde_json::Value, key: &str| {
        v.get(key)
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    for resource in json["resourceSpans"]
        .as_array()
        .context("no resourceSpans")?
    {
        for scope in resource["scopeSpans"].as_array().context("no scopeSpans")? {
            for span in scope["spans"].as_array().context("no spans")? {
                let mut attributes = HashMap::new();
                for kv in span["attributes"].as_array().into_iter().flatten() {
                    let key = kv["key"].as_str().unwrap_or_default().to_owned();
                    let value = &kv["value"];
                    let value = value["stringValue"]
                        .as_str()
                        .map(str::to_owned)
                        .or_else(|| value["intValue"].as_str().map(str::to_owned))
                        .or_else(|| value["intValue"].as_i64().map(|i| i.to_string()))
                        .unwrap_or_else(|| value.to_string());
                    attributes.insert(key, value);
                }
                out.push(Span {
                    trace_id: text(span, "traceId"),
                    span_id: text(span, "spanId"),
                    parent_span_id: text(span, "parentSpanId"),
                    name: text(span, "name"),
                    attributes,
                });
            }
        }
    }
    Ok(out)
}

/// The first span named `name`, with attribute `key` = `value` when given.
fn find<'a>(spans: &'a [Span], name: &str, attr: Option<(&str, &str)>) -> Option<&'a Span> {
    spans.iter().find(|s| {
        s.name == name
            && attr.is_none_or(|(k, v)| s.attributes.get(k).map(String::as_str) == Some(v))
    })
}

/// `POST path` through node `via`, with a client's `traceparent`.
async fn post_traced(
    c: &Cluster,
    via: usize,
    path: &str,
    traceparent: String,
) -> anyhow::Result<crate::client::Resp> {
    c.http
        .send(
            "POST",
            &c.url(via, path),
            &[("traceparent".to_owned(), traceparent)],
            Bytes::new(),
        )
        .await
}

/// The request span (named `METHOD actor`) that node `node` exported.
fn request_on<'a>(spans: &'a [Span], node: &str) -> Option<&'a Span> {
    spans.iter().find(|s| {
        s.name.ends_with("actor")
            && s.attributes.get("wasmkeep.node").map(String::as_str) == Some(node)
    })
}

pub async fn one_trace_covers_a_forwarded_request_and_a_call(tls: bool, bucket: BucketKind) {
    let receiver = match Receiver::start().await {
        Ok(r) => r,
        Err(e) => panic!("the OTLP receiver did not start: {e:#}"),
    };
    let mut options = ClusterOptions::new("traces", bucket, tls).with_class("sink", "kitchen-sink");
    options.nodes = 2;
    options.env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
    ];
    let mut receiver = Some(receiver);
    crate::run(options, async move |c: &mut Cluster| {
        let mut receiver = receiver.take().context("the receiver")?;
        traces(c, &mut receiver).await
    })
    .await
}

/// An actor of `class` held by node `node`: activated through it, which
/// claims it unless another node holds it.
async fn held_by(c: &Cluster, node: usize, class: &str, prefix: &str) -> anyhow::Result<String> {
    for k in 0..CANDIDATES {
        let name = format!("{prefix}{k}");
        let path = format!("/t/{class}/{name}/echo");
        let r = c
            .send_retrying(node, "POST", &path, Instant::now() + PHASE_TIME_MAX)
            .await?;
        ensure!(r.status == 200, "POST {path}: {} {}", r.status, r.text());
        if r.node() == Some(c.node_id(node)) {
            return Ok(name);
        }
    }
    bail!("no {class} actor of {CANDIDATES} landed on node {node}")
}

async fn traces(c: &mut Cluster, receiver: &mut Receiver) -> anyhow::Result<()> {
    let (a, b) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    // A request sent to node 0 for an actor node 1 holds.
    let held = held_by(c, 1, "sink", "held").await?;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let path = format!("/t/sink/{held}/answer");
    let r = post_traced(c, 0, &path, traceparent).await?;
    ensure!(
        r.status == 200 && r.node() == Some(b.as_str()),
        "POST {path} via node {a}: {} from {:?}: {}",
        r.status,
        r.node(),
        r.text()
    );
    let spans = receiver
        .wait_for(trace_id, "the forwarded request's spans", |spans| {
            find(spans, "commit", None).is_some()
                && find(spans, "forward", None).is_some()
                && spans.iter().filter(|s| s.name.ends_with("actor")).count() >= 2
        })
        .await?;
    let first = request_on(&spans, &a)
        .with_context(|| format!("no request span from node {a}: {spans:#?}"))?;
    ensure!(
        first.parent_span_id == client_span,
        "node {a}'s request span's parent is {:?}, not the client's span: {first:#?}",
        first.parent_span_id
    );
    let forward = find(&spans, "forward", None).context("no forward span")?;
    ensure!(
        forward.parent_span_id == first.span_id,
        "the forward is not a child of node {a}'s request: {spans:#?}"
    );
    let second = request_on(&spans, &b)
        .with_context(|| format!("no request span from node {b}: {spans:#?}"))?;
    ensure!(
        second.parent_span_id == forward.span_id,
        "node {b}'s request is not a child of node {a}'s forward: {spans:#?}"
    );
    let event = find(&spans, "event", None).context("no event span")?;
    ensure!(
        event.parent_span_id == second.span_id,
        "the event is not a child of node {b}'s request: {spans:#?}"
    );
    let commit = find(&spans, "commit", None).context("no commit span")?;
    ensure!(
        commit.parent_span_id == event.span_id,
        "the commit is not a child of the event: {spans:#?}"
    );
    // Node a's event span, had it run one, would have ended before its
    // request span, which is here.
    let events = spans.iter().filter(|s| s.name == "event").count();
    ensure!(
        events == 1,
        "{events} events ran for one forwarded request: {spans:#?}"
    );

    // An actor's call to an actor held by the other node: the caller's
    // event on node 0, its call, and the callee's request and event on
    // node 1, one trace; the callee's guest log line carries the trace id.
    let caller = held_by(c, 0, "sink", "caller").await?;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let path = format!("/t/sink/{caller}/call?class=sink&name={held}&path=/log");
    let r = post_traced(c, 0, &path, format!("00-{trace_id}-b7ad6b7169203331-01")).await?;
    ensure!(r.status < 500, "POST {path}: {} {}", r.status, r.text());
    let spans = receiver
        .wait_for(trace_id, "the call's spans", |spans| {
            find(spans, "call", None).is_some()
                && request_on(spans, &b).is_some()
                && spans.iter().filter(|s| s.name == "event").count() >= 2
        })
        .await?;
    let call = find(&spans, "call", None).context("no call span")?;
    let caller_event = spans
        .iter()
        .find(|s| s.span_id == call.parent_span_id)
        .with_context(|| format!("the call's parent was not exported: {spans:#?}"))?;
    ensure!(
        caller_event.name == "event",
        "the call's parent is {:?}, not the caller's event",
        caller_event.name
    );
    let callee_request = request_on(&spans, &b).context("no request span on the callee's node")?;
    let hop = spans
        .iter()
        .find(|s| s.span_id == callee_request.parent_span_id)
        .with_context(|| format!("the callee's request has no exported parent: {spans:#?}"))?;
    ensure!(
        hop.name == "forward" && hop.parent_span_id == call.span_id,
        "the callee's request is not a child of the call's forward: {spans:#?}"
    );
    // A client's unsampled trace: nothing exported, but the holder's log
    // lines (through the forward) still carry its trace id.
    let unsampled = "11111111111111111111111111111111";
    let path = format!("/t/sink/{held}/log");
    let r = post_traced(c, 0, &path, format!("00-{unsampled}-2222222222222222-00")).await?;
    ensure!(
        r.status == 200 && r.node() == Some(b.as_str()),
        "POST {path} via node {a}: {} from {:?}",
        r.status,
        r.node()
    );
    let log = c.node_log(1);
    ensure!(
        log.lines().any(|line| line.contains("at info")
            && line.contains(&format!("trace_id={unsampled}"))),
        "node {b}'s log has no guest line with the unsampled trace_id={unsampled}:\n{log}"
    );
    // An alarm's delivery is a trace of its own, on the holder.
    let path = format!("/t/sink/{held}/alarm/set?at=1");
    let r = c.http.post(&c.url(1, &path)).await?;
    ensure!(r.status == 200, "POST {path}: {} {}", r.status, r.text());
    let actor = format!("t/sink/{held}");
    receiver
        .wait_until("the alarm's span", |all| {
            all.iter()
                .any(|s| s.name == "alarm" && s.attributes.get("wasmkeep.actor") == Some(&actor))
        })
        .await?;
    // Exported after the unsampled request: had its spans been exported,
    // they would be here by now.
    ensure!(
        receiver.seen.iter().all(|s| s.trace_id != unsampled),
        "spans of an unsampled trace were exported"
    );
    let log = c.node_log(1);
    ensure!(
        log.lines()
            .any(|line| line.contains("at info") && line.contains(&format!("trace_id={trace_id}"))),
        "node {b}'s log has no guest line with trace_id={trace_id}:\n{log}"
    );
    Ok(())
}
