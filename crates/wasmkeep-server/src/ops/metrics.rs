//! The node's Prometheus metrics, hand-written: a few counters, gauges and
//! fixed-bucket histograms rendered in the text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram with the fixed [`LATENCY_BUCKETS_S`] buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        for (bound, count) in LATENCY_BUCKETS_S.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in LATENCY_BUCKETS_S.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum_s = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {sum_s}\n{name}_count{braces} {count}"
        );
    }
}

/// Every metric the node exports.
#[derive(Debug, Default)]
pub struct Metrics {
    requests_by_status: Mutex<BTreeMap<u16, u64>>,
    pub event_latency: Histogram,
    pub resident_actors: AtomicI64,
    pub activations: AtomicU64,
    pub activation_failures: AtomicU64,
    pub mailbox_panics: AtomicU64,
    /// Long-running parts of the node that panicked (`crate::parts`).
    pub part_panics: AtomicU64,
    pub actors_deleted: AtomicU64,
    pub hibernations: AtomicU64,
    pub instance_unloads: AtomicU64,
    pub events: AtomicU64,
    pub guest_failures: AtomicU64,
    pub alarms_fired: AtomicU64,
    pub alarm_retries: AtomicU64,
    pub alarm_lag: Histogram,
    pub sockets_open: AtomicI64,
    pub socket_messages: AtomicU64,
    pub class_loads: AtomicU64,
    pub forwarded_requests: AtomicU64,
    pub forward_failures: AtomicU64,
    pub forward_loops: AtomicU64,
    pub forward_latency: Histogram,
    pub relayed_sockets: AtomicU64,
    pub alarm_hand_offs: AtomicU64,
    pub signed_refused: AtomicU64,
    pub signed_skewed: AtomicU64,
    pub lease_renewals: AtomicU64,
    pub lease_failures: AtomicU64,
    pub peers_live: AtomicI64,
    /// 1 while a requested drain waits for an eligible peer.
    pub drain_blocked: AtomicI64,
    pub store_fenced: AtomicU64,
    /// Activations that fenced the actor's log first: the ownership
    /// record they replaced named a holder (ADR 0062).
    pub log_fences: AtomicU64,
    /// Answers whose outcome is unknown (504, ADR 0062).
    pub outcomes_unknown: AtomicU64,
    /// Client connections closed for slowness: a request head not sent in
    /// time, or writes the client did not read (ADR 0050).
    pub connections_timed_out: AtomicU64,
    /// Client connections open now (HTTP, and WebSockets they became).
    pub connections_open: AtomicI64,
    /// Client connections refused at `--max-connections`.
    pub connections_refused: AtomicU64,
    /// Moves this node started as the owner (ADR 0017).
    pub moves_started: AtomicU64,
    /// Moves that ended with the target holding the actor (owner or target side).
    pub moves_done: AtomicU64,
    /// Move attempts that ended without an outcome and are tried again.
    pub moves_retried: AtomicU64,
    /// From the owner's pass over a move key to the target holding the actor.
    pub move_latency: Histogram,
    /// Move keys for actors resident here whose target cannot take them now.
    pub moves_waiting: AtomicI64,
    /// Ownership records a failed release left naming this node.
    pub leftover_holds: AtomicI64,
    /// Sockets this node sent a close frame to, awaiting the client's.
    pub sockets_closing: AtomicI64,
    bucket_requests: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    pub bucket_latency: Histogram,
    /// Actors' outbound HTTP requests by class and outcome (`2xx`...,
    /// `denied`, `failed`; ADR 0066).
    outbound_requests: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// From an outbound request's start to its response's head.
    pub outbound_latency: Histogram,
}

impl Metrics {
    pub fn request(&self, status: u16) {
        *self.requests_by_status.lock().entry(status).or_default() += 1;
    }

    /// One bucket call: `op` is the trait method, `outcome` "ok" or the error kind.
    pub fn bucket_request(&self, op: &'static str, outcome: &'static str, latency: Duration) {
        *self
            .bucket_requests
            .lock()
            .entry((op, outcome))
            .or_default() += 1;
        self.bucket_latency.observe(latency);
    }

    /// One outbound request of an actor of `class`.
    pub fn outbound(&self, class: &str, outcome: &wasmkeep_runtime::OutboundOutcome) {
        use wasmkeep_runtime::OutboundOutcome;
        let label = match outcome {
            OutboundOutcome::Answered { status, latency } => {
                self.outbound_latency.observe(*latency);
                match status / 100 {
                    1 => "1xx",
                    2 => "2xx",
                    3 => "3xx",
                    4 => "4xx",
                    _ => "5xx",
                }
            }
            OutboundOutcome::Denied => "denied",
            OutboundOutcome::Failed => "failed",
        };
        *self
            .outbound_requests
            .lock()
            .entry((class.to_owned(), label))
            .or_default() += 1;
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP wasmkeep_http_requests_total HTTP requests answered, by status.\n# TYPE wasmkeep_http_requests_total counter"
        );
        for (status, n) in self.requests_by_status.lock().iter() {
            let _ = writeln!(
                out,
                "wasmkeep_http_requests_total{{status=\"{status}\"}} {n}"
            );
        }
        let counters: [(&str, &str, u64); 32] = [
            (
                "wasmkeep_forwarded_requests_total",
                "Requests and calls forwarded to the node that holds the actor.",
                load(&self.forwarded_requests),
            ),
            (
                "wasmkeep_forward_failures_total",
                "Calls to peers that failed (the peer is then suspect).",
                load(&self.forward_failures),
            ),
            (
                "wasmkeep_forward_loops_total",
                "Forwarded requests that found the actor elsewhere again (answered 503).",
                load(&self.forward_loops),
            ),
            (
                "wasmkeep_relayed_sockets_total",
                "WebSockets relayed to the node that holds the actor.",
                load(&self.relayed_sockets),
            ),
            (
                "wasmkeep_alarm_hand_offs_total",
                "Alarms handed off to the node that holds the actor.",
                load(&self.alarm_hand_offs),
            ),
            (
                "wasmkeep_signed_calls_refused_total",
                "Signed calls whose signature was refused (served as ordinary requests).",
                load(&self.signed_refused),
            ),
            (
                "wasmkeep_signed_calls_skewed_total",
                "Peers' signed calls refused (503) because the two nodes' clocks disagree by more than the signature window.",
                load(&self.signed_skewed),
            ),
            (
                "wasmkeep_lease_renewals_total",
                "Successful node lease renewals.",
                load(&self.lease_renewals),
            ),
            (
                "wasmkeep_lease_renewal_failures_total",
                "Failed node lease renewals.",
                load(&self.lease_failures),
            ),
            (
                "wasmkeep_store_fenced_total",
                "Actor writes refused because another writer extended the log (fencing).",
                load(&self.store_fenced),
            ),
            (
                "wasmkeep_sql_statements_off_worker_total",
                "Guest SQL statements run off the async workers: writes that can loop, and reads past their inline slice (ADR 0063).",
                wasmkeep_store::statements_off_worker_total(),
            ),
            (
                "wasmkeep_log_fences_total",
                "Activations that fenced the actor's log before serving, after a holder that may still have had a record in flight.",
                load(&self.log_fences),
            ),
            (
                "wasmkeep_outcomes_unknown_total",
                "Requests answered 504 outcome unknown: a log record that did not settle, or a peer that took the request and did not answer.",
                load(&self.outcomes_unknown),
            ),
            (
                "wasmkeep_connections_timed_out_total",
                "Client connections closed for slowness (a request head not sent in time, or a client that read nothing).",
                load(&self.connections_timed_out),
            ),
            (
                "wasmkeep_connections_refused_total",
                "Client connections answered 503 and closed because --max-connections were open.",
                load(&self.connections_refused),
            ),
            (
                "wasmkeep_activations_total",
                "Actors activated on this node.",
                load(&self.activations),
            ),
            (
                "wasmkeep_activation_failures_total",
                "Activations that failed.",
                load(&self.activation_failures),
            ),
            (
                "wasmkeep_mailbox_panics_total",
                "Actor mailboxes that panicked (a wasmkeep bug; the actor was activated afresh at its next event).",
                load(&self.mailbox_panics),
            ),
            (
                "wasmkeep_part_panics_total",
                "Long-running parts of the node (heartbeat, alarm timer, upkeep) that panicked and stopped (a wasmkeep bug; the health answer turns 503).",
                load(&self.part_panics),
            ),
            (
                "wasmkeep_actors_deleted_total",
                "Actors whose data this node deleted (wasmkeep actor delete).",
                load(&self.actors_deleted),
            ),
            (
                "wasmkeep_hibernations_total",
                "Actors hibernated by this node.",
                load(&self.hibernations),
            ),
            (
                "wasmkeep_instance_unloads_total",
                "Guest instances of idle resident actors dropped (the actor stays resident).",
                load(&self.instance_unloads),
            ),
            ("wasmkeep_events_total", "Events run.", load(&self.events)),
            (
                "wasmkeep_guest_failures_total",
                "Events whose guest trapped or hit a limit.",
                load(&self.guest_failures),
            ),
            (
                "wasmkeep_alarms_fired_total",
                "Alarm deliveries.",
                load(&self.alarms_fired),
            ),
            (
                "wasmkeep_alarm_retries_total",
                "Alarm deliveries that failed and were rescheduled.",
                load(&self.alarm_retries),
            ),
            (
                "wasmkeep_socket_messages_total",
                "WebSocket messages received.",
                load(&self.socket_messages),
            ),
            (
                "wasmkeep_class_loads_total",
                "Component versions loaded.",
                load(&self.class_loads),
            ),
            (
                "wasmkeep_moves_started_total",
                "Moves of a resident actor started by this node as its owner.",
                load(&self.moves_started),
            ),
            (
                "wasmkeep_moves_done_total",
                "Moves that ended with the target holding the actor.",
                load(&self.moves_done),
            ),
            (
                "wasmkeep_moves_retried_total",
                "Move attempts without an outcome; the key is tried again.",
                load(&self.moves_retried),
            ),
            (
                "wasmkeep_http_requests_seen_total",
                "HTTP requests answered.",
                self.requests_by_status.lock().values().sum(),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let gauges = [
            (
                "wasmkeep_resident_actors",
                "Actors resident on this node.",
                self.resident_actors.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_sockets_open",
                "WebSockets open.",
                self.sockets_open.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_connections_open",
                "Client connections open (HTTP, and the WebSockets they became).",
                self.connections_open.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_peers_live",
                "Other nodes whose lease this node judges valid.",
                self.peers_live.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_moves_waiting",
                "Move keys of resident actors whose target cannot take them now (retried every heartbeat).",
                self.moves_waiting.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_sockets_closing",
                "Sockets this node closed that have not finished the close handshake (at most 5 s).",
                self.sockets_closing.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_leftover_holds",
                "Ownership records a failed release left naming this node (given back at the next heartbeats).",
                self.leftover_holds.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_drain_blocked",
                "1 while a drain was asked but no eligible peer can take the actors.",
                self.drain_blocked.load(Ordering::Relaxed),
            ),
            (
                "wasmkeep_database_bytes",
                "Bytes the databases of the actors in this process hold (they live in memory; --max-database-memory caps them, ADR 0064).",
                i64::try_from(wasmkeep_store::pages_held() * wasmkeep_store::PAGE_BYTES as u64)
                    .unwrap_or(i64::MAX),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        self.event_latency.render(
            &mut out,
            "wasmkeep_event_seconds",
            "Event latency including the output gate.",
            "",
        );
        self.forward_latency.render(
            &mut out,
            "wasmkeep_forward_seconds",
            "Latency of forwarded requests and calls, the peer's event included.",
            "",
        );
        self.move_latency.render(
            &mut out,
            "wasmkeep_move_seconds",
            "From the owner's pass over a move key to the target holding the actor.",
            "",
        );
        self.alarm_lag.render(
            &mut out,
            "wasmkeep_alarm_lag_seconds",
            "Delay between an alarm's time and its delivery.",
            "",
        );
        let _ = writeln!(
            out,
            "# HELP wasmkeep_bucket_requests_total Bucket calls by operation and outcome.\n# TYPE wasmkeep_bucket_requests_total counter"
        );
        for ((op, outcome), n) in self.bucket_requests.lock().iter() {
            let _ = writeln!(
                out,
                "wasmkeep_bucket_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} {n}"
            );
        }
        self.bucket_latency.render(
            &mut out,
            "wasmkeep_bucket_seconds",
            "Bucket call latency.",
            "",
        );
        let _ = writeln!(
            out,
            "# HELP wasmkeep_outbound_requests_total Actors' outbound HTTP requests by class and outcome (status class, denied, failed).\n# TYPE wasmkeep_outbound_requests_total counter"
        );
        for ((class, outcome), n) in self.outbound_requests.lock().iter() {
            let _ = writeln!(
                out,
                "wasmkeep_outbound_requests_total{{class=\"{class}\",outcome=\"{outcome}\"}} {n}"
            );
        }
        self.outbound_latency.render(
            &mut out,
            "wasmkeep_outbound_seconds",
            "Outbound HTTP latency, to the response's head.",
            "",
        );
        out
    }
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Reads one unlabelled sample from rendered metrics (used by tests).
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_counters_gauges_and_histograms() {
        let m = Metrics::default();
        m.request(200);
        m.request(200);
        m.request(503);
        m.activations.fetch_add(1, Ordering::Relaxed);
        m.resident_actors.fetch_add(3, Ordering::Relaxed);
        m.event_latency.observe(Duration::from_millis(3));
        m.bucket_request("get", "ok", Duration::from_millis(1));
        m.outbound(
            "proxy",
            &wasmkeep_runtime::OutboundOutcome::Answered {
                status: 204,
                latency: Duration::from_millis(2),
            },
        );
        m.outbound("proxy", &wasmkeep_runtime::OutboundOutcome::Denied);
        let text = m.render();
        assert!(
            text.contains("wasmkeep_outbound_requests_total{class=\"proxy\",outcome=\"2xx\"} 1")
        );
        assert!(
            text.contains("wasmkeep_outbound_requests_total{class=\"proxy\",outcome=\"denied\"} 1")
        );
        assert_eq!(sample(&text, "wasmkeep_outbound_seconds_count"), Some(1.0));
        assert!(text.contains("wasmkeep_http_requests_total{status=\"200\"} 2"));
        assert!(text.contains("wasmkeep_http_requests_total{status=\"503\"} 1"));
        assert_eq!(sample(&text, "wasmkeep_activations_total"), Some(1.0));
        assert_eq!(sample(&text, "wasmkeep_resident_actors"), Some(3.0));
        assert!(text.contains("wasmkeep_event_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("wasmkeep_event_seconds_bucket{le=\"0.0025\"} 0"));
        assert_eq!(sample(&text, "wasmkeep_event_seconds_count"), Some(1.0));
        assert!(text.contains("wasmkeep_bucket_requests_total{op=\"get\",outcome=\"ok\"} 1"));
    }
}
