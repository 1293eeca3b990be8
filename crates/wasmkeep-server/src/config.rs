//! The node's configuration: names, periods and the limits on everything
//! a client or a guest can make the node hold.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use wasmkeep_types::{AppName, ClassName, NodeId};

/// Limits on what clients and guests can make the node hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body read from a client.
    pub body_bytes_max: usize,
    /// Longest a connection may take to send a request's head, counted from
    /// its opening or from the end of its previous response: a slow or idle
    /// connection is closed after it (ADR 0050).
    pub header_time_max: Duration,
    /// Longest wait for the next part of a request body; a stalled body is
    /// answered 408 and reaches no actor.
    pub body_idle_time_max: Duration,
    /// Client connections open at once (WebSockets included); one more is
    /// answered 503 and closed.
    pub connections_max: usize,
    /// Longest a write to a client may wait (the client reads nothing of its
    /// response or WebSocket messages); the connection is closed after it.
    pub send_idle_time_max: Duration,
    /// Events waiting in one actor's mailbox; a full mailbox answers 503.
    pub mailbox_events_max: usize,
    /// Largest WebSocket message accepted from a client.
    pub socket_message_bytes_max: usize,
    /// Open WebSockets per actor.
    pub sockets_per_actor_max: usize,
    /// Messages waiting to be written to one WebSocket; a slower client is closed.
    pub socket_outbox_messages_max: usize,
    /// Longest socket tag.
    pub socket_tag_bytes_max: usize,
    /// Longest chain of actor-to-actor calls.
    pub call_depth_max: usize,
    /// Retries of a failing alarm before it is given up.
    pub alarm_retries_max: u32,
    /// Delay before the first alarm retry; doubles each time.
    pub alarm_retry_backoff_first: Duration,
    /// Time the node waits for in-flight requests at shutdown.
    pub shutdown_grace: Duration,
    /// Longest one event may run (the runtime stops the guest after it).
    pub event_time_max: Duration,
    /// Longest a forwarded request, call or alarm hand-off waits for the peer.
    pub forward_time_max: Duration,
    /// Largest response body read back from a peer.
    pub forward_response_bytes_max: usize,
    /// Most memory the databases of all actors on this node may hold
    /// together (they live in memory); a write past it fails with a clear
    /// error (ADR 0064). Default: half the machine's memory.
    pub database_memory_bytes_max: usize,
    /// Largest response body an actor may read from an outbound request
    /// (ADR 0066).
    pub outbound_body_bytes_max: usize,
    /// Outbound requests one actor may have in flight.
    pub outbound_per_actor_max: usize,
    /// Outbound requests the node may have in flight.
    pub outbound_per_node_max: usize,
}

/// Half the memory of this machine (or of this process's cgroup, when it
/// has less); 4 GiB when neither can be read. Read once per process:
/// every `Limits::default()` asks.
pub fn half_the_memory() -> usize {
    static HALF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *HALF.get_or_init(read_half_the_memory)
}

fn read_half_the_memory() -> usize {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    let total = match (meminfo, cgroup) {
        (Some(m), Some(c)) => m.min(c),
        (Some(m), None) => m,
        (None, Some(c)) => c,
        (None, None) => 8 << 30,
    };
    usize::try_from(total / 2).unwrap_or(usize::MAX)
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_bytes_max: 32 * 1024 * 1024,
            header_time_max: Duration::from_secs(60),
            body_idle_time_max: Duration::from_secs(60),
            send_idle_time_max: Duration::from_secs(60),
            connections_max: 10_000,
            mailbox_events_max: 1024,
            socket_message_bytes_max: 1024 * 1024,
            sockets_per_actor_max: 1000,
            socket_outbox_messages_max: 1024,
            socket_tag_bytes_max: 256,
            call_depth_max: 8,
            alarm_retries_max: 6,
            alarm_retry_backoff_first: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(30),
            event_time_max: Duration::from_secs(30),
            forward_time_max: Duration::from_secs(60),
            forward_response_bytes_max: 64 * 1024 * 1024,
            database_memory_bytes_max: half_the_memory(),
            outbound_body_bytes_max: 16 << 20,
            outbound_per_actor_max: 16,
            outbound_per_node_max: 1024,
        }
    }
}

/// Everything a node needs to know at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub app: AppName,
    pub node_id: NodeId,
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    /// Classes this node serves; `None` means every deployed class.
    pub classes: Option<Vec<ClassName>>,
    pub heartbeat_period: Duration,
    pub lease_ttl: Duration,
    /// A resident actor with no event and no open socket for this long hibernates.
    pub idle_timeout: Duration,
    /// A resident actor with no event for this long drops its guest instance
    /// (it keeps its database, sockets and hold); the next event instantiates
    /// afresh in about 11 µs. An idle instance costs ~47 KiB, and many of
    /// them alive at once fragment the heap (docs/adr/0024).
    pub instance_idle_timeout: Duration,
    /// Resident actors at most; beyond it the least recently used idle actor hibernates.
    pub actors_max: usize,
    pub alarm_sweep_period: Duration,
    /// Local scratch: the compiled-component cache.
    pub data_dir: PathBuf,
    /// The cluster key (`--cluster-key-file`); without it the node cannot
    /// sign node calls, so it forwards nothing (it still keeps its lease).
    pub cluster_key_file: Option<PathBuf>,
    /// Certificate and key for the listener (`--tls-cert`, `--tls-key`).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Roots that peers' certificates are verified against (`--tls-ca`).
    pub tls_ca: Option<PathBuf>,
    /// The app's age identity (`--secrets-identity`, ADR 0016).
    pub secrets_identity: Option<PathBuf>,
    /// PEM CA certificates trusted by actors' outbound HTTPS besides the
    /// webpki roots (ADR 0066).
    pub outbound_ca: Option<PathBuf>,
    /// Client requests must carry their tenant's bearer token.
    pub tenant_tokens: bool,
    /// On SIGTERM, `wasmkeep serve` drains the node (hands every actor to
    /// its peers) for at most this long before stopping (ADR 0014); `dev`
    /// has no peers and does not drain.
    pub drain_timeout: Duration,
    /// A client whose event trapped is told what the guest printed and
    /// where it panicked (`wasmkeep dev`); otherwise only that it trapped,
    /// and the node's log has the rest: a panic's text may hold data that
    /// is not the client's.
    pub guest_error_detail: bool,
    /// The token of this process's data dir, given only while the process
    /// holds the dir's lock (`holder::DataDirLock`): a heartbeat of this
    /// node id that carries it was written by an earlier process of the dir,
    /// now dead, and is taken over at once. `None`: any heartbeat found at
    /// start is watched for a lease TTL first (ADR 0054).
    pub holder: Option<String>,
    /// The web console at `/_wasmkeep/console` (ADR 0067).
    pub console: Console,
    /// `wasmkeep dev --test-routes` (ADR 0073): the routes under
    /// `/_wasmkeep/test/` answer, and their `clock/advance` moves this
    /// clock, which must be the node's (`Platform.clock`). `None`: those
    /// paths answer 404. Never set by `serve`.
    pub test_clock: Option<std::sync::Arc<wasmkeep_cluster::TestClock>>,
    pub limits: Limits,
}

/// Whether the node serves the web console, and to whom (ADR 0067).
#[derive(Clone, Default)]
pub enum Console {
    /// Not served: its paths answer 404.
    #[default]
    Off,
    /// Served to anyone who reaches the listener: only on a loopback
    /// listener (`wasmkeep dev`'s default).
    Open,
    /// Served; its API answers only requests that carry this operator
    /// token as `Authorization: Bearer`.
    Token(std::sync::Arc<zeroize::Zeroizing<String>>),
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Off => "Off",
            Self::Open => "Open",
            Self::Token(_) => "Token(..)",
        })
    }
}

impl NodeConfig {
    /// A configuration with the defaults of DESIGN.md.
    pub fn new(app: AppName, node_id: NodeId, listen: SocketAddr, data_dir: PathBuf) -> Self {
        Self {
            app,
            node_id,
            listen,
            advertise: None,
            classes: None,
            heartbeat_period: Duration::from_secs(3),
            lease_ttl: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            instance_idle_timeout: Duration::from_millis(500),
            actors_max: 1000,
            alarm_sweep_period: Duration::from_secs(30),
            data_dir,
            cluster_key_file: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            secrets_identity: None,
            outbound_ca: None,
            tenant_tokens: false,
            drain_timeout: Duration::from_secs(30),
            guest_error_detail: false,
            holder: None,
            console: Console::Off,
            test_clock: None,
            limits: Limits::default(),
        }
    }

    /// The URL peers use to reach this node: `--advertise`, or the listen
    /// address with `https` when TLS is on.
    pub fn advertise_url(&self) -> String {
        match &self.advertise {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let scheme = if self.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", self.listen)
            }
        }
    }
}
