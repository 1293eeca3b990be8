//! The node's Prometheus metrics, kept and rendered by `prometheus-client`
//! (ADR 0071). Node-level series (lease, bucket, forwarding, connections,
//! moves...) carry no label of ours. The series of what an actor does (its
//! events, failures, alarms, sockets, residency, outbound requests) carry
//! its `tenant` and `class`: `sum without(tenant, class)` of one is the
//! node-level value it replaced.
//!
//! An actor's handles for its labels ([`ClassMetrics`]) are found once, when
//! its stub is made ([`Metrics::class`]); its events then touch their atomics
//! without a lookup or a hash. At most [`CLASS_LABELS_MAX`] (tenant, class)
//! pairs get series of their own; later pairs are counted under
//! [`OTHER_LABEL`]. A pair's series stay until the process ends (a deleted
//! class's too).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use wasmkeep_runtime::OutboundOutcome;

/// The `Content-Type` of [`Metrics::render`]: the Prometheus text format,
/// version 0.0.4 (what every scraper reads; ADR 0071 says why not OpenMetrics).
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Most distinct (tenant, class) label pairs one labelled series has in
/// this process, the [`OTHER_LABEL`] pair included: the first
/// `CLASS_LABELS_MAX - 1` pairs seen get their own, every later one shares
/// `_other` (which exists from the start). Each pair costs about a hundred
/// lines of every scrape.
pub const CLASS_LABELS_MAX: usize = 1_000;

/// The tenant and class of the pairs past [`CLASS_LABELS_MAX`] (and of an
/// actor whose class went away before its stub was made). No tenant or
/// class name can be it (names begin with `[a-z0-9]`).
pub const OTHER_LABEL: &str = "_other";

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of the SQL time of one event: most events spend
/// tens of microseconds in SQLite.
const SQL_BUCKETS_S: [f64; 14] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
    0.5, 2.5,
];

/// How an outbound request ended, as its label says (ADR 0066).
const OUTBOUND_OUTCOMES: [&str; 7] = ["1xx", "2xx", "3xx", "4xx", "5xx", "denied", "failed"];

/// Statuses an HTTP answer can have (`http::StatusCode`'s range).
const STATUS_FIRST: u16 = 100;
const STATUS_LAST: u16 = 999;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabels {
    tenant: String,
    class: String,
}

impl ClassLabels {
    fn other() -> Self {
        Self {
            tenant: OTHER_LABEL.to_owned(),
            class: OTHER_LABEL.to_owned(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutboundLabels {
    tenant: String,
    class: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BucketLabels {
    op: &'static str,
    outcome: &'static str,
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_S)
}

fn sql_histogram() -> Histogram {
    Histogram::new(SQL_BUCKETS_S)
}

/// Observes a duration in seconds, the unit of every histogram here.
pub fn observe(histogram: &Histogram, value: Duration) {
    histogram.observe(value.as_secs_f64());
}

/// The labelled families, registered once; [`ClassMetrics`] holds handles
/// into them.
#[derive(Debug)]
struct ClassFamilies {
    events: Family<ClassLabels, Counter>,
    event_seconds: HistogramFamily<ClassLabels>,
    sql_seconds: HistogramFamily<ClassLabels>,
    commit_seconds: HistogramFamily<ClassLabels>,
    guest_failures: Family<ClassLabels, Counter>,
    alarms_fired: Family<ClassLabels, Counter>,
    alarm_retries: Family<ClassLabels, Counter>,
    alarm_lag_seconds: HistogramFamily<ClassLabels>,
    socket_messages: Family<ClassLabels, Counter>,
    sockets_open: Family<ClassLabels, Gauge>,
    resident_actors: Family<ClassLabels, Gauge>,
    activations: Family<ClassLabels, Counter>,
    activation_failures: Family<ClassLabels, Counter>,
    hibernations: Family<ClassLabels, Counter>,
    instance_unloads: Family<ClassLabels, Counter>,
    outbound_requests: Family<OutboundLabels, Counter>,
    outbound_seconds: HistogramFamily<ClassLabels>,
}

impl ClassFamilies {
    fn new() -> Self {
        Self {
            events: Family::default(),
            event_seconds: Family::new_with_constructor(latency_histogram),
            sql_seconds: Family::new_with_constructor(sql_histogram),
            commit_seconds: Family::new_with_constructor(latency_histogram),
            guest_failures: Family::default(),
            alarms_fired: Family::default(),
            alarm_retries: Family::default(),
            alarm_lag_seconds: Family::new_with_constructor(latency_histogram),
            socket_messages: Family::default(),
            sockets_open: Family::default(),
            resident_actors: Family::default(),
            activations: Family::default(),
            activation_failures: Family::default(),
            hibernations: Family::default(),
            instance_unloads: Family::default(),
            outbound_requests: Family::default(),
            outbound_seconds: Family::new_with_constructor(latency_histogram),
        }
    }

    fn register(&self, registry: &mut Registry) {
        let histograms = [
            (
                "wasmkeep_event_seconds",
                "Event latency including the output gate",
                &self.event_seconds,
            ),
            (
                "wasmkeep_sql_seconds",
                "Time one event's guest spent in its SQL calls",
                &self.sql_seconds,
            ),
            (
                "wasmkeep_commit_seconds",
                "From an event's end to its writes being durable (the output gate), for events that waited on it",
                &self.commit_seconds,
            ),
            (
                "wasmkeep_alarm_lag_seconds",
                "Delay between an alarm's time and its delivery",
                &self.alarm_lag_seconds,
            ),
            (
                "wasmkeep_outbound_seconds",
                "Outbound HTTP latency, to the response's head",
                &self.outbound_seconds,
            ),
        ];
        let counters = [
            ("wasmkeep_events", "Events run", &self.events),
            (
                "wasmkeep_guest_failures",
                "Events whose guest trapped or hit a limit",
                &self.guest_failures,
            ),
            (
                "wasmkeep_alarms_fired",
                "Alarm deliveries",
                &self.alarms_fired,
            ),
            (
                "wasmkeep_alarm_retries",
                "Alarm deliveries that failed and were rescheduled",
                &self.alarm_retries,
            ),
            (
                "wasmkeep_socket_messages",
                "WebSocket messages received",
                &self.socket_messages,
            ),
            (
                "wasmkeep_activations",
                "Actors activated on this node",
                &self.activations,
            ),
            (
                "wasmkeep_activation_failures",
                "Activations that failed",
                &self.activation_failures,
            ),
            (
                "wasmkeep_hibernations",
                "Actors hibernated by this node",
                &self.hibernations,
            ),
            (
                "wasmkeep_instance_unloads",
                "Guest instances of idle resident actors dropped (the actor stays resident)",
                &self.instance_unloads,
            ),
        ];
        let gauges = [
            (
                "wasmkeep_resident_actors",
                "Actors resident on this node",
                &self.resident_actors,
            ),
            (
                "wasmkeep_sockets_open",
                "WebSockets open",
                &self.sockets_open,
            ),
        ];
        for (name, help, family) in counters {
            registry.register(name, help, family.clone());
        }
        for (name, help, family) in gauges {
            registry.register(name, help, family.clone());
        }
        for (name, help, family) in histograms {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "wasmkeep_outbound_requests",
            "Actors' outbound HTTP requests by outcome (status class, denied, failed)",
            self.outbound_requests.clone(),
        );
    }
}

/// One (tenant, class) pair's handles: each shares its atomics with the
/// series in the registry, so an event increments them without a lookup.
/// Kept by every resident actor of the pair (its stub).
#[derive(Debug)]
pub struct ClassMetrics {
    pub events: Counter,
    pub event_seconds: Histogram,
    pub sql_seconds: Histogram,
    pub commit_seconds: Histogram,
    pub guest_failures: Counter,
    pub alarms_fired: Counter,
    pub alarm_retries: Counter,
    pub alarm_lag_seconds: Histogram,
    pub socket_messages: Counter,
    pub sockets_open: Gauge,
    pub resident_actors: Gauge,
    pub activations: Counter,
    pub activation_failures: Counter,
    pub hibernations: Counter,
    pub instance_unloads: Counter,
    /// Made at a pair's first outbound request of each outcome: most
    /// classes make none, and seven series of zeros per pair would be noise.
    outbound_requests: [OnceLock<Counter>; OUTBOUND_OUTCOMES.len()],
    outbound_seconds: OnceLock<Histogram>,
    labels: ClassLabels,
    families: Arc<ClassFamilies>,
}

impl ClassMetrics {
    fn new(families: &Arc<ClassFamilies>, labels: ClassLabels) -> Self {
        let f = families;
        let l = &labels;
        Self {
            events: f.events.get_or_create_owned(l),
            event_seconds: f.event_seconds.get_or_create_owned(l),
            sql_seconds: f.sql_seconds.get_or_create_owned(l),
            commit_seconds: f.commit_seconds.get_or_create_owned(l),
            guest_failures: f.guest_failures.get_or_create_owned(l),
            alarms_fired: f.alarms_fired.get_or_create_owned(l),
            alarm_retries: f.alarm_retries.get_or_create_owned(l),
            alarm_lag_seconds: f.alarm_lag_seconds.get_or_create_owned(l),
            socket_messages: f.socket_messages.get_or_create_owned(l),
            sockets_open: f.sockets_open.get_or_create_owned(l),
            resident_actors: f.resident_actors.get_or_create_owned(l),
            activations: f.activations.get_or_create_owned(l),
            activation_failures: f.activation_failures.get_or_create_owned(l),
            hibernations: f.hibernations.get_or_create_owned(l),
            instance_unloads: f.instance_unloads.get_or_create_owned(l),
            outbound_requests: Default::default(),
            outbound_seconds: OnceLock::new(),
            labels,
            families: Arc::clone(families),
        }
    }

    /// One outbound request of an actor of this pair.
    pub fn outbound(&self, outcome: &OutboundOutcome) {
        let index = match outcome {
            OutboundOutcome::Answered { status, latency } => {
                let histogram = self.outbound_seconds.get_or_init(|| {
                    self.families
                        .outbound_seconds
                        .get_or_create_owned(&self.labels)
                });
                observe(histogram, *latency);
                match status / 100 {
                    1 => 0,
                    2 => 1,
                    3 => 2,
                    4 => 3,
                    _ => 4,
                }
            }
            OutboundOutcome::Denied => 5,
            OutboundOutcome::Failed => 6,
        };
        self.outbound_requests[index]
            .get_or_init(|| {
                self.families
                    .outbound_requests
                    .get_or_create_owned(&OutboundLabels {
                        tenant: self.labels.tenant.clone(),
                        class: self.labels.class.clone(),
                        outcome: OUTBOUND_OUTCOMES[index],
                    })
            })
            .inc();
    }
}

/// `wasmkeep_http_requests_total{status}`: a counter per status, found by
/// indexing, not hashing, at each answer.
#[derive(Debug)]
struct HttpRequests {
    family: Family<StatusLabels, Counter>,
    /// Index `status - STATUS_FIRST`; made at a status's first answer.
    by_status: Box<[OnceLock<Counter>]>,
}

impl HttpRequests {
    fn new() -> Self {
        Self {
            family: Family::default(),
            by_status: (STATUS_FIRST..=STATUS_LAST)
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    fn count(&self, status: http::StatusCode) {
        let status = status.as_u16();
        let index = usize::from(status - STATUS_FIRST);
        self.by_status[index]
            .get_or_init(|| self.family.get_or_create_owned(&StatusLabels { status }))
            .inc();
    }

    fn total(&self) -> u64 {
        self.by_status
            .iter()
            .filter_map(OnceLock::get)
            .map(Counter::get)
            .sum()
    }
}

/// The values read only when scraped.
#[derive(Debug)]
struct ScrapeValues {
    http: Arc<HttpRequests>,
}

impl Collector for ScrapeValues {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let counters = [
            (
                "wasmkeep_sql_statements_off_worker",
                "Guest SQL statements run off the async workers: writes that can loop, and reads past their inline slice (ADR 0063).",
                wasmkeep_store::statements_off_worker_total(),
            ),
            (
                "wasmkeep_http_requests_seen",
                "HTTP requests answered.",
                self.http.total(),
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let bytes = wasmkeep_store::pages_held() * wasmkeep_store::PAGE_BYTES as u64;
        let gauge = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
        gauge.encode(encoder.encode_descriptor(
            "wasmkeep_database_bytes",
            "Bytes the databases of the actors in this process hold (they live in memory; --max-database-memory caps them, ADR 0064).",
            None,
            gauge.metric_type(),
        )?)
    }
}

/// Every metric the node exports. The unlabelled ones are fields: each
/// part of the node increments its own.
#[derive(Debug)]
pub struct Metrics {
    pub mailbox_panics: Counter,
    /// Long-running parts of the node that panicked (`crate::parts`).
    pub part_panics: Counter,
    pub actors_deleted: Counter,
    pub class_loads: Counter,
    pub forwarded_requests: Counter,
    pub forward_failures: Counter,
    pub forward_loops: Counter,
    pub forward_latency: Histogram,
    pub relayed_sockets: Counter,
    pub alarm_hand_offs: Counter,
    pub signed_refused: Counter,
    pub signed_skewed: Counter,
    pub lease_renewals: Counter,
    pub lease_failures: Counter,
    pub peers_live: Gauge,
    /// 1 while a requested drain waits for an eligible peer.
    pub drain_blocked: Gauge,
    pub store_fenced: Counter,
    /// Activations that fenced the actor's log first: the ownership
    /// record they replaced named a holder (ADR 0062).
    pub log_fences: Counter,
    /// Answers whose outcome is unknown (504, ADR 0062).
    pub outcomes_unknown: Counter,
    /// Client connections closed for slowness: a request head not sent in
    /// time, or writes the client did not read (ADR 0050).
    pub connections_timed_out: Counter,
    /// Client connections open now (HTTP, and WebSockets they became).
    pub connections_open: Gauge,
    /// Client connections refused at `--max-connections`.
    pub connections_refused: Counter,
    /// Moves this node started as the owner (ADR 0017).
    pub moves_started: Counter,
    /// Moves that ended with the target holding the actor (owner or target side).
    pub moves_done: Counter,
    /// Move attempts that ended without an outcome and are tried again.
    pub moves_retried: Counter,
    /// From the owner's pass over a move key to the target holding the actor.
    pub move_latency: Histogram,
    /// Move keys for actors resident here whose target cannot take them now.
    pub moves_waiting: Gauge,
    /// Ownership records a failed release left naming this node.
    pub leftover_holds: Gauge,
    /// Sockets this node sent a close frame to, awaiting the client's.
    pub sockets_closing: Gauge,
    pub bucket_latency: Histogram,
    bucket_requests: Family<BucketLabels, Counter>,
    http_requests: Arc<HttpRequests>,
    classes: Arc<ClassFamilies>,
    /// Each pair's handles, at most [`CLASS_LABELS_MAX`] of them. Asked
    /// once per activation, never per event.
    class_handles: Mutex<HashMap<ClassLabels, Arc<ClassMetrics>>>,
    registry: Registry,
}

/// A counter registered under `name` (the `_total` is added).
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}

fn histogram(registry: &mut Registry, name: &str, help: &str) -> Histogram {
    let histogram = latency_histogram();
    registry.register(name, help, histogram.clone());
    histogram
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::default();
        let http_requests = Arc::new(HttpRequests::new());
        r.register(
            "wasmkeep_http_requests",
            "HTTP requests answered, by status",
            http_requests.family.clone(),
        );
        let classes = Arc::new(ClassFamilies::new());
        classes.register(&mut r);
        // Made at once: every labelled series has a sample (zeros) from
        // the start, as the unlabelled series it replaced had, so a fresh
        // node's `sum without(tenant, class)` is 0, not absent.
        let other = ClassLabels::other();
        let class_handles =
            HashMap::from([(other.clone(), Arc::new(ClassMetrics::new(&classes, other)))]);
        let bucket_requests = Family::<BucketLabels, Counter>::default();
        r.register(
            "wasmkeep_bucket_requests",
            "Bucket calls by operation and outcome",
            bucket_requests.clone(),
        );
        r.register_collector(Box::new(ScrapeValues {
            http: Arc::clone(&http_requests),
        }));
        Self {
            forwarded_requests: counter(
                &mut r,
                "wasmkeep_forwarded_requests",
                "Requests and calls forwarded to the node that holds the actor",
            ),
            forward_failures: counter(
                &mut r,
                "wasmkeep_forward_failures",
                "Calls to peers that failed (the peer is then suspect)",
            ),
            forward_loops: counter(
                &mut r,
                "wasmkeep_forward_loops",
                "Forwarded requests that found the actor elsewhere again (answered 503)",
            ),
            relayed_sockets: counter(
                &mut r,
                "wasmkeep_relayed_sockets",
                "WebSockets relayed to the node that holds the actor",
            ),
            alarm_hand_offs: counter(
                &mut r,
                "wasmkeep_alarm_hand_offs",
                "Alarms handed off to the node that holds the actor",
            ),
            signed_refused: counter(
                &mut r,
                "wasmkeep_signed_calls_refused",
                "Signed calls whose signature was refused (served as ordinary requests)",
            ),
            signed_skewed: counter(
                &mut r,
                "wasmkeep_signed_calls_skewed",
                "Peers' signed calls refused (503) because the two nodes' clocks disagree by more than the signature window",
            ),
            lease_renewals: counter(
                &mut r,
                "wasmkeep_lease_renewals",
                "Successful node lease renewals",
            ),
            lease_failures: counter(
                &mut r,
                "wasmkeep_lease_renewal_failures",
                "Failed node lease renewals",
            ),
            store_fenced: counter(
                &mut r,
                "wasmkeep_store_fenced",
                "Actor writes refused because another writer extended the log (fencing)",
            ),
            log_fences: counter(
                &mut r,
                "wasmkeep_log_fences",
                "Activations that fenced the actor's log before serving, after a holder that may still have had a record in flight",
            ),
            outcomes_unknown: counter(
                &mut r,
                "wasmkeep_outcomes_unknown",
                "Requests answered 504 outcome unknown: a log record that did not settle, or a peer that took the request and did not answer",
            ),
            connections_timed_out: counter(
                &mut r,
                "wasmkeep_connections_timed_out",
                "Client connections closed for slowness (a request head not sent in time, or a client that read nothing)",
            ),
            connections_refused: counter(
                &mut r,
                "wasmkeep_connections_refused",
                "Client connections answered 503 and closed because --max-connections were open",
            ),
            mailbox_panics: counter(
                &mut r,
                "wasmkeep_mailbox_panics",
                "Actor mailboxes that panicked (a wasmkeep bug; the actor was activated afresh at its next event)",
            ),
            part_panics: counter(
                &mut r,
                "wasmkeep_part_panics",
                "Long-running parts of the node (heartbeat, alarm timer, upkeep) that panicked and stopped (a wasmkeep bug; the health answer turns 503)",
            ),
            actors_deleted: counter(
                &mut r,
                "wasmkeep_actors_deleted",
                "Actors whose data this node deleted (wasmkeep actor delete)",
            ),
            class_loads: counter(&mut r, "wasmkeep_class_loads", "Component versions loaded"),
            moves_started: counter(
                &mut r,
                "wasmkeep_moves_started",
                "Moves of a resident actor started by this node as its owner",
            ),
            moves_done: counter(
                &mut r,
                "wasmkeep_moves_done",
                "Moves that ended with the target holding the actor",
            ),
            moves_retried: counter(
                &mut r,
                "wasmkeep_moves_retried",
                "Move attempts without an outcome; the key is tried again",
            ),
            connections_open: gauge(
                &mut r,
                "wasmkeep_connections_open",
                "Client connections open (HTTP, and the WebSockets they became)",
            ),
            peers_live: gauge(
                &mut r,
                "wasmkeep_peers_live",
                "Other nodes whose lease this node judges valid",
            ),
            moves_waiting: gauge(
                &mut r,
                "wasmkeep_moves_waiting",
                "Move keys of resident actors whose target cannot take them now (retried every heartbeat)",
            ),
            sockets_closing: gauge(
                &mut r,
                "wasmkeep_sockets_closing",
                "Sockets this node closed that have not finished the close handshake (at most 5 s)",
            ),
            leftover_holds: gauge(
                &mut r,
                "wasmkeep_leftover_holds",
                "Ownership records a failed release left naming this node (given back at the next heartbeats)",
            ),
            drain_blocked: gauge(
                &mut r,
                "wasmkeep_drain_blocked",
                "1 while a drain was asked but no eligible peer can take the actors",
            ),
            forward_latency: histogram(
                &mut r,
                "wasmkeep_forward_seconds",
                "Latency of forwarded requests and calls, the peer's event included",
            ),
            move_latency: histogram(
                &mut r,
                "wasmkeep_move_seconds",
                "From the owner's pass over a move key to the target holding the actor",
            ),
            bucket_latency: histogram(&mut r, "wasmkeep_bucket_seconds", "Bucket call latency"),
            bucket_requests,
            http_requests,
            classes,
            class_handles: Mutex::new(class_handles),
            registry: r,
        }
    }
}

impl Metrics {
    /// One HTTP answer.
    pub fn request(&self, status: http::StatusCode) {
        self.http_requests.count(status);
    }

    /// One bucket call: `op` is the trait method, `outcome` "ok" or the error kind.
    pub fn bucket_request(&self, op: &'static str, outcome: &'static str, latency: Duration) {
        self.bucket_requests
            .get_or_create(&BucketLabels { op, outcome })
            .inc();
        observe(&self.bucket_latency, latency);
    }

    /// The handles of one (tenant, class) pair, made at its first use; the
    /// `_other` pair's once [`CLASS_LABELS_MAX`] is reached. Called once
    /// per activation (a stub), never per event.
    pub fn class(&self, tenant: &str, class: &str) -> Arc<ClassMetrics> {
        let labels = ClassLabels {
            tenant: tenant.to_owned(),
            class: class.to_owned(),
        };
        let mut handles = self.class_handles.lock();
        if let Some(found) = handles.get(&labels) {
            return Arc::clone(found);
        }
        if handles.len() >= CLASS_LABELS_MAX {
            let other = handles
                .get(&ClassLabels::other())
                .expect("the `_other` pair is made with the metrics");
            return Arc::clone(other);
        }
        let handle = Arc::new(ClassMetrics::new(&self.classes, labels.clone()));
        handles.insert(labels, Arc::clone(&handle));
        handle
    }

    /// The `_other` pair's handles: for an actor whose class this node has
    /// not loaded (routing refuses those before a stub; one unloaded in
    /// between gets no series of its own).
    pub fn unknown_class(&self) -> Arc<ClassMetrics> {
        self.class(OTHER_LABEL, OTHER_LABEL)
    }

    /// Instances unloaded and actors hibernated since the start, all
    /// classes together (the heap trim asks once per heartbeat).
    pub fn unloads_and_hibernations(&self) -> u64 {
        self.class_handles
            .lock()
            .values()
            .map(|m| m.instance_unloads.get() + m.hibernations.get())
            .sum()
    }

    /// The Prometheus text format (version 0.0.4, [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// One sample line of rendered metrics: its name, its labels, its value.
fn samples(text: &str) -> impl Iterator<Item = (&str, Vec<(&str, String)>, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.trim().parse().ok()?;
            match series.split_once('{') {
                None => Some((series, Vec::new(), value)),
                Some((name, labels)) => {
                    Some((name, parse_labels(labels.strip_suffix('}')?)?, value))
                }
            }
        })
}

/// `a="x",b="y"` (values escaped as the text format escapes them).
fn parse_labels(mut text: &str) -> Option<Vec<(&str, String)>> {
    let mut labels = Vec::new();
    while !text.is_empty() {
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name, value));
        text = rest[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&rest[end + 1..]);
    }
    Some(labels)
}

/// The sum of a series over all its label sets in rendered metrics, or
/// `None` when it has no sample (used by tests: the node-level value of a
/// labelled series).
pub fn sum(text: &str, name: &str) -> Option<f64> {
    samples(text)
        .filter(|(n, _, _)| *n == name)
        .map(|(_, _, value)| value)
        .reduce(|a, b| a + b)
}

/// The sample of `name` whose labels are exactly `labels` (in any order),
/// in rendered metrics (used by tests).
pub fn labelled(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text).find_map(|(n, found, value)| {
        let same = n == name
            && found.len() == labels.len()
            && labels
                .iter()
                .all(|(k, v)| found.iter().any(|(fk, fv)| fk == k && fv == v));
        same.then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo(m: &Metrics, tenant: &str, class: &str, name: &str) -> Option<f64> {
        labelled(&m.render(), name, &[("tenant", tenant), ("class", class)])
    }

    #[test]
    fn render_has_counters_gauges_histograms_and_class_labels() {
        let m = Metrics::default();
        m.request(http::StatusCode::OK);
        m.request(http::StatusCode::OK);
        m.request(http::StatusCode::SERVICE_UNAVAILABLE);
        m.lease_renewals.inc();
        m.bucket_request("get", "ok", Duration::from_millis(1));
        let counter = m.class("demo", "counter");
        let chat = m.class("demo", "chat");
        counter.activations.inc();
        counter.resident_actors.inc();
        chat.resident_actors.inc();
        chat.resident_actors.inc();
        counter.events.inc();
        observe(&counter.event_seconds, Duration::from_millis(3));
        observe(&counter.sql_seconds, Duration::from_micros(40));
        counter.outbound(&OutboundOutcome::Answered {
            status: 204,
            latency: Duration::from_millis(2),
        });
        counter.outbound(&OutboundOutcome::Denied);
        let text = m.render();

        let tc = [("tenant", "demo"), ("class", "counter")];
        assert_eq!(
            labelled(&text, "wasmkeep_http_requests_total", &[("status", "200")]),
            Some(2.0)
        );
        assert_eq!(sum(&text, "wasmkeep_http_requests_total"), Some(3.0));
        assert_eq!(sum(&text, "wasmkeep_http_requests_seen_total"), Some(3.0));
        assert_eq!(sum(&text, "wasmkeep_lease_renewals_total"), Some(1.0));
        assert_eq!(
            labelled(
                &text,
                "wasmkeep_bucket_requests_total",
                &[("op", "get"), ("outcome", "ok")]
            ),
            Some(1.0)
        );
        assert_eq!(sum(&text, "wasmkeep_bucket_seconds_count"), Some(1.0));
        assert_eq!(
            labelled(&text, "wasmkeep_activations_total", &tc),
            Some(1.0)
        );
        assert_eq!(sum(&text, "wasmkeep_resident_actors"), Some(3.0));
        assert_eq!(
            demo(&m, "demo", "chat", "wasmkeep_resident_actors"),
            Some(2.0)
        );
        let bucket = |le: &str| {
            labelled(
                &text,
                "wasmkeep_event_seconds_bucket",
                &[("tenant", "demo"), ("class", "counter"), ("le", le)],
            )
        };
        assert_eq!(bucket("0.005"), Some(1.0));
        assert_eq!(bucket("0.0025"), Some(0.0));
        assert_eq!(bucket("+Inf"), Some(1.0));
        assert_eq!(
            labelled(&text, "wasmkeep_sql_seconds_count", &tc),
            Some(1.0)
        );
        let outcome = |o: &str| {
            labelled(
                &text,
                "wasmkeep_outbound_requests_total",
                &[("tenant", "demo"), ("class", "counter"), ("outcome", o)],
            )
        };
        assert_eq!(outcome("2xx"), Some(1.0));
        assert_eq!(outcome("denied"), Some(1.0));
        assert_eq!(outcome("failed"), None, "made at its first use only");
        assert_eq!(
            labelled(&text, "wasmkeep_outbound_seconds_count", &tc),
            Some(1.0)
        );
        // Computed at the scrape.
        assert!(sum(&text, "wasmkeep_database_bytes").is_some());
        assert!(sum(&text, "wasmkeep_sql_statements_off_worker_total").is_some());
        // The text format's type lines, one per family.
        for line in [
            "# TYPE wasmkeep_events_total counter",
            "# TYPE wasmkeep_resident_actors gauge",
            "# TYPE wasmkeep_event_seconds histogram",
            "# TYPE wasmkeep_http_requests_total counter",
        ] {
            assert_eq!(text.lines().filter(|l| *l == line).count(), 1, "{line}");
        }
    }

    #[test]
    fn a_fresh_node_has_every_labelled_series_at_zero() {
        let text = Metrics::default().render();
        for name in [
            "wasmkeep_events_total",
            "wasmkeep_resident_actors",
            "wasmkeep_event_seconds_count",
            "wasmkeep_sql_seconds_count",
            "wasmkeep_commit_seconds_count",
            "wasmkeep_instance_unloads_total",
        ] {
            assert_eq!(sum(&text, name), Some(0.0), "{name}");
        }
    }

    #[test]
    fn a_pair_found_again_shares_its_series() {
        let m = Metrics::default();
        m.class("demo", "counter").events.inc();
        m.class("demo", "counter").events.inc();
        assert_eq!(
            demo(&m, "demo", "counter", "wasmkeep_events_total"),
            Some(2.0)
        );
        assert_eq!(m.class_handles.lock().len(), 2, "the pair and `_other`");
    }

    #[test]
    fn class_labels_are_bounded_and_later_pairs_counted_as_other() {
        let m = Metrics::default();
        let past = 10;
        for i in 0..CLASS_LABELS_MAX + past {
            m.class(&format!("t{i}"), "counter").events.inc();
        }
        m.unknown_class().events.inc();
        // A pair seen before the bound keeps its own series.
        m.class("t0", "counter").events.inc();
        let text = m.render();
        let pairs = samples(&text)
            .filter(|(name, _, _)| *name == "wasmkeep_events_total")
            .count();
        assert_eq!(pairs, CLASS_LABELS_MAX);
        // Pairs CLASS_LABELS_MAX - 1 and on, and the unknown class.
        let other = demo(&m, OTHER_LABEL, OTHER_LABEL, "wasmkeep_events_total");
        assert_eq!(other, Some((past + 2) as f64));
        assert_eq!(
            demo(&m, "t0", "counter", "wasmkeep_events_total"),
            Some(2.0)
        );
        assert_eq!(
            sum(&text, "wasmkeep_events_total"),
            Some((CLASS_LABELS_MAX + past + 2) as f64),
            "nothing is lost past the bound"
        );
        assert_eq!(
            samples(&text)
                .filter(|(name, _, _)| *name == "wasmkeep_event_seconds_count")
                .count(),
            CLASS_LABELS_MAX
        );
    }

    #[test]
    fn sum_and_labelled_read_escaped_labels_and_skip_comments() {
        let text = "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"q\\\"u,o\"} 2\na_total{k=\"b\"} 3\nb 1\n";
        assert_eq!(sum(text, "a_total"), Some(5.0));
        assert_eq!(labelled(text, "a_total", &[("k", "q\"u,o")]), Some(2.0));
        assert_eq!(labelled(text, "b", &[]), Some(1.0));
        assert_eq!(sum(text, "a"), None);
    }
}
