//! The command line's shape: the clap structs and enums of every command
//! and flag (with the environment variable each flag reads), and
//! `parse_duration` for the flags that take a time. It never reads a
//! config file, checks a value beyond its type, or touches a bucket.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "wasmkeep",
    version,
    about = "Durable actors as WebAssembly components, kept in one bucket."
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "WASMKEEP_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One node with a bucket in a local folder; deploys the given
    /// components (CLASS=path.wasm), or the bundled examples.
    Dev(DevArgs),
    /// One cluster node.
    Serve(ServeArgs),
    /// Validates a component and makes it the class's current version.
    Deploy(DeployArgs),
    /// Nodes of an app, as their heartbeats say.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Deployed classes of an app: version, database maximum, outbound
    /// allow-list.
    #[command(subcommand)]
    Class(ClassCommand),
    /// Actors of an app, as the bucket says.
    #[command(subcommand)]
    Actor(ActorCommand),
    /// Makes a new actor project (a counter) in Rust or TypeScript, with
    /// its README and a test that runs it on a node (ADR 0070).
    New {
        /// The project's name, also its class name: lower-case letters,
        /// digits and single hyphens.
        name: String,
        #[arg(long, value_enum, default_value = "rust")]
        lang: crate::ops::cli::new::Lang,
        /// Where to write it (default: ./NAME); must not exist or be empty.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// A wasmkeep source tree with the SDKs (default: $WASMKEEP_SOURCE,
        /// the tree this binary was built from, or one above it).
        #[arg(long)]
        sdk: Option<std::path::PathBuf>,
    },
    /// Builds the actor project in DIR (a Cargo.toml or a package.json)
    /// into DIR/NAME.wasm.
    Build {
        #[arg(default_value = ".")]
        dir: std::path::PathBuf,
    },
    /// Copies the app's actors (log records and snapshots), alarms,
    /// classes, secrets and tenant tokens to another bucket, incrementally:
    /// what the destination has of the log is skipped, nothing there is
    /// deleted, nothing of the source is written (ADR 0076). Read the
    /// backup with `--bucket URL` (`actor history`, `actor sql --at`) or
    /// `actor restore --from URL`.
    Backup {
        /// The destination (file:///abs/path, s3://bucket/prefix).
        #[arg(long, value_name = "URL")]
        to: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// The app's secrets (ADR 0016).
    #[command(subcommand)]
    Secret(crate::ops::admin::SecretCommand),
    /// Tenants' bearer tokens.
    #[command(subcommand)]
    Tenant(crate::ops::admin::TenantCommand),
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Every node with a heartbeat: id, address, state, drain, capabilities,
    /// resident actors, heartbeat age.
    List {
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Asks a node to hand every actor over to its peers (writes
    /// `control/drain/<node>`; ADR 0014).
    Drain {
        /// The node id.
        node: String,
        /// Follow the drain on stderr; exit 0 once the node reports `drained`.
        #[arg(long)]
        wait: bool,
        /// Write the key even for an unknown node or the last serving one.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Withdraws a drain request (deletes `control/drain/<node>`).
    Undrain {
        /// The node id.
        node: String,
        #[command(flatten)]
        view: ViewArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClassCommand {
    /// Every deployed class, as its `current` record says.
    List {
        #[command(flatten)]
        view: ViewArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum ActorCommand {
    /// Every actor with data, an ownership record or an alarm.
    List {
        /// Only actors whose id starts with this (`TENANT/` or `TENANT/CLASS/`).
        prefix: Option<String>,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// One actor: owner, hold, alarm, database size.
    Inspect {
        /// TENANT/CLASS/NAME
        actor: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Moves one actor to a named node now (writes
    /// `control/move/<tenant>/<class>/<name hex>/<node>`; ADR 0017). It
    /// does not pin: an idle actor hibernates there and its next event may
    /// claim it anywhere.
    Move {
        /// TENANT/CLASS/NAME
        actor: String,
        /// The node that should hold the actor.
        #[arg(long)]
        to: String,
        /// Follow the move on stderr; exit 0 once the target holds the actor,
        /// non-zero when the move did not happen.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Runs one SQL statement on the actor and prints its rows (ADR 0065).
    /// Without --write: a statement that reads, on the actor's state as the
    /// bucket holds it (every acknowledged write), wherever it is held,
    /// without waking it. With --write: any statement, run by the node
    /// that holds the actor (or activates it) as one event in its mailbox,
    /// committed like any event, once.
    Sql {
        /// TENANT/CLASS/NAME
        actor: String,
        /// One statement (SELECT, INSERT, UPDATE, ... RETURNING, ...).
        statement: String,
        /// Run it on the actor's holder, which commits its writes (writes
        /// `control/sql/<tenant>/<class>/<name hex>/<request>`).
        #[arg(long)]
        write: bool,
        /// With --write: how long to wait for the result.
        #[arg(long, default_value = "60s")]
        timeout: String,
        /// Without --write: read the actor as it was at this instant
        /// (RFC 3339, or a duration ago such as `-10m`; ADR 0076).
        #[arg(
            long,
            value_name = "TIME",
            allow_hyphen_values = true,
            conflicts_with = "write"
        )]
        at: Option<String>,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Writes the actor's database, as the bucket holds it, to a new file
    /// that the sqlite3 shell opens (ADR 0065).
    Export {
        /// TENANT/CLASS/NAME
        actor: String,
        /// The file to create (an existing one is left alone).
        file: std::path::PathBuf,
        /// The database as it was at this instant (RFC 3339, or a
        /// duration ago such as `-10m`; ADR 0076).
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// The instants the actor's data can be restored to: every record and
    /// snapshot of its log with its time, size and writer (ADR 0076).
    History {
        /// TENANT/CLASS/NAME
        actor: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Puts the actor's data back as it was at an instant (ADR 0076): the
    /// database of that instant becomes the newest state, as `actor import
    /// --replace` puts a file (its holder hands it over, requests wait;
    /// the node carries it out at its next heartbeat). Nothing in between
    /// is lost: the state before the restore stays restorable.
    Restore {
        /// TENANT/CLASS/NAME
        actor: String,
        /// RFC 3339 (`2026-12-08T10:00:00Z`, an offset allowed), or a
        /// duration ago (`-10m`, `-2h`, `-1d`).
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: String,
        /// Read the instant from this backup (`wasmkeep backup --to`)
        /// instead of the bucket.
        #[arg(long, value_name = "URL")]
        from: Option<String>,
        /// How long to wait for the node's answer.
        #[arg(long, default_value = "60s")]
        timeout: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// A new actor with the database an actor had at an instant (now by
    /// default); the new actor must have no data (ADR 0076).
    Fork {
        /// TENANT/CLASS/NAME to copy from
        actor: String,
        /// TENANT/CLASS/NAME to create (the same class, or another that
        /// reads the same tables)
        new: String,
        /// RFC 3339, or a duration ago (`-10m`); default: now.
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        /// Read the instant from this backup instead of the bucket.
        #[arg(long, value_name = "URL")]
        from: Option<String>,
        /// How long to wait for the node's answer.
        #[arg(long, default_value = "60s")]
        timeout: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Puts a SQLite database file (one `actor export` wrote, or any with
    /// 4096-byte pages, not in WAL mode) in place of the actor's data, with
    /// the alarm its `_wasmkeep_alarm` table holds (writes
    /// `control/import/<tenant>/<class>/<name hex>/<request>`; the node that
    /// holds the actor, or any node when none does, carries it out at its
    /// next heartbeat; ADR 0069). Refused if the actor has data, unless
    /// --replace. The file is checked before anything is written.
    Import {
        /// TENANT/CLASS/NAME
        actor: String,
        /// The SQLite database file.
        file: std::path::PathBuf,
        /// Replace the actor's data if it has any (its holder hands it over
        /// first; its open WebSockets are closed with 1000).
        #[arg(long)]
        replace: bool,
        /// How long to wait for the node's answer.
        #[arg(long, default_value = "60s")]
        timeout: String,
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Deletes one actor: its database, its alarm and its ownership record
    /// (writes `control/delete/<tenant>/<class>/<name hex>/<request>`; the node that
    /// holds it, or any node when none does, deletes it at its next
    /// heartbeat; ADR 0055). Its open WebSockets are closed (1000); its next
    /// event starts an empty actor.
    Delete {
        /// TENANT/CLASS/NAME
        actor: String,
        /// Wait until the actor is deleted; exit non-zero if it is not
        /// within --timeout (the request stays and is carried out later).
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value = "60s")]
        timeout: String,
        #[command(flatten)]
        view: ViewArgs,
    },
}

/// Flags of the read-only views.
#[derive(Debug, Args)]
pub struct ViewArgs {
    #[arg(long, env = "WASMKEEP_BUCKET")]
    pub bucket: String,
    #[arg(long, env = "WASMKEEP_APP", default_value = "default")]
    pub app: String,
    /// The cluster's lease TTL, to call heartbeats stale (default 10s).
    #[arg(long, env = "WASMKEEP_LEASE_TTL", default_value = "10s")]
    pub lease_ttl: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Components to deploy, as CLASS=path.wasm.
    pub components: Vec<String>,
    /// An actor project (`wasmkeep new`) to build, deploy as its class, and
    /// build and deploy again on every change to its files; repeatable
    /// (ADR 0070). A failed build is shown and the last version keeps
    /// serving.
    #[arg(long = "watch", value_name = "DIR")]
    pub watch: Vec<PathBuf>,
    /// Where the bundled example components are (default: target/wasm next
    /// to this executable's directory).
    #[arg(long, env = "WASMKEEP_GUESTS_DIR")]
    pub guests_dir: Option<PathBuf>,
    /// Serve the test harness's routes under /_wasmkeep/test/ (run an
    /// actor's alarm now, hibernate it, SQL on its database, move the
    /// wall clock, deploy a class at once; ADR 0073). Only on a loopback
    /// address; with no component given, none is deployed.
    #[arg(long)]
    pub test_routes: bool,
    #[command(flatten)]
    pub node: NodeArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub node: NodeArgs,
}

/// Flags of a node (`serve`, and `dev` with other defaults).
#[derive(Debug, Args, Default)]
pub struct NodeArgs {
    /// TOML file with any of these flags as keys (e.g. `idle-timeout = "30s"`).
    #[arg(long, env = "WASMKEEP_CONFIG")]
    pub config: Option<PathBuf>,
    /// file:///path, s3://bucket/prefix or memory://.
    #[arg(long, env = "WASMKEEP_BUCKET")]
    pub bucket: Option<String>,
    /// The app whose classes and actors this node serves (default `default`).
    #[arg(long, env = "WASMKEEP_APP")]
    pub app: Option<String>,
    /// This node's stable id (default: the host name; `dev` for `wasmkeep dev`).
    #[arg(long, env = "WASMKEEP_NODE_ID")]
    pub node_id: Option<String>,
    /// Address to listen on, e.g. 127.0.0.1:8787.
    #[arg(long, env = "WASMKEEP_LISTEN")]
    pub listen: Option<String>,
    /// URL other nodes use to reach this one.
    #[arg(long, env = "WASMKEEP_ADVERTISE")]
    pub advertise: Option<String>,
    /// Classes served, comma-separated (default: all).
    #[arg(long, env = "WASMKEEP_CLASSES")]
    pub classes: Option<String>,
    /// Heartbeat (and class poll) period, e.g. 3s.
    #[arg(long, env = "WASMKEEP_HEARTBEAT")]
    pub heartbeat: Option<String>,
    /// How long a node lease lasts without renewal (used by the cluster).
    #[arg(long, env = "WASMKEEP_LEASE_TTL")]
    pub lease_ttl: Option<String>,
    /// An actor with no event and no socket for this long hibernates.
    #[arg(long, env = "WASMKEEP_IDLE_TIMEOUT")]
    pub idle_timeout: Option<String>,
    /// An actor with no event for this long drops its guest instance (not its
    /// data); one activated by a single event drops it when that event is
    /// done. At or above --idle-timeout, instances are kept while resident.
    #[arg(long, env = "WASMKEEP_INSTANCE_IDLE_TIMEOUT")]
    pub instance_idle_timeout: Option<String>,
    /// Resident actors at most (least recently used idle ones hibernate).
    #[arg(long, env = "WASMKEEP_MAX_ACTORS")]
    pub max_actors: Option<String>,
    /// Period of the scan for due alarms of actors nobody holds.
    #[arg(long, env = "WASMKEEP_ALARM_SWEEP")]
    pub alarm_sweep: Option<String>,
    /// Local scratch directory (compiled-component cache).
    #[arg(long, env = "WASMKEEP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// File with the cluster key (at least 32 bytes, or hex); nodes sign
    /// their calls with it. Without it the node runs alone.
    #[arg(long, env = "WASMKEEP_CLUSTER_KEY_FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// PEM certificate chain: serve HTTPS.
    #[arg(long, env = "WASMKEEP_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "WASMKEEP_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM roots that peers' certificates are verified against.
    #[arg(long, env = "WASMKEEP_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The app's age identity file (`wasmkeep secret keygen`): guests read
    /// the app's secrets (ADR 0016).
    #[arg(long, env = "WASMKEEP_SECRETS_IDENTITY")]
    pub secrets_identity: Option<PathBuf>,
    /// `true`: client requests must carry their tenant's bearer token
    /// (`wasmkeep tenant token create`), and the node writes the app's
    /// policy so that every node requires them. `false` opens nothing: the
    /// app's policy in the bucket decides (`wasmkeep tenant policy`).
    #[arg(long, env = "WASMKEEP_TENANT_TOKENS")]
    pub tenant_tokens: Option<String>,
    /// The web console at /_wasmkeep/console (ADR 0067): `on` or `off`.
    /// `serve`: on when --console-token-file is given; `dev`: on, without
    /// a token when it listens on loopback.
    #[arg(long, env = "WASMKEEP_CONSOLE")]
    pub console: Option<String>,
    /// File whose first line is the console's operator token (16 or more
    /// visible characters); the console's API answers only requests that
    /// send it as `Authorization: Bearer`.
    #[arg(long, env = "WASMKEEP_CONSOLE_TOKEN_FILE")]
    pub console_token_file: Option<PathBuf>,
    /// Longest one event may run before the guest is stopped (default 30s).
    #[arg(long, env = "WASMKEEP_EVENT_TIME_MAX")]
    pub event_time_max: Option<String>,
    /// Largest request body (default 32 MiB).
    #[arg(long, env = "WASMKEEP_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<String>,
    /// Most memory, in bytes, the databases of all actors on this node may
    /// hold together; a write past it fails (default: half the machine's
    /// memory).
    #[arg(long, env = "WASMKEEP_MAX_DATABASE_MEMORY")]
    pub max_database_memory: Option<String>,
    /// Largest response body an actor may read from an outbound HTTP
    /// request (default 16 MiB; ADR 0066).
    #[arg(long, env = "WASMKEEP_MAX_OUTBOUND_BODY_BYTES")]
    pub max_outbound_body_bytes: Option<String>,
    /// Outbound HTTP requests one actor may have in flight; one more fails
    /// at once (default 16).
    #[arg(long, env = "WASMKEEP_MAX_OUTBOUND_PER_ACTOR")]
    pub max_outbound_per_actor: Option<String>,
    /// Outbound HTTP requests this node may have in flight; one more fails
    /// at once (default 1024).
    #[arg(long, env = "WASMKEEP_MAX_OUTBOUND_PER_NODE")]
    pub max_outbound_per_node: Option<String>,
    /// PEM CA certificates that actors' outbound HTTPS trusts besides the
    /// webpki roots (a private CA).
    #[arg(long, env = "WASMKEEP_OUTBOUND_CA")]
    pub outbound_ca: Option<PathBuf>,
    /// Longest a connection may take to send a request's head, counted from
    /// its opening or its previous response; slower or idle connections are
    /// closed (default 60s).
    #[arg(long, env = "WASMKEEP_HEADER_TIMEOUT")]
    pub header_timeout: Option<String>,
    /// Longest wait for the next part of a request body; a stalled body gets
    /// 408 (default 60s).
    #[arg(long, env = "WASMKEEP_BODY_TIMEOUT")]
    pub body_timeout: Option<String>,
    /// Longest a write to a client may wait because the client reads
    /// nothing (a response or WebSocket messages); the connection is then
    /// closed (default 60s).
    #[arg(long, env = "WASMKEEP_SEND_TIMEOUT")]
    pub send_timeout: Option<String>,
    /// Client connections open at once, WebSockets included; one more is
    /// answered 503 and closed (default 10000).
    #[arg(long, env = "WASMKEEP_MAX_CONNECTIONS")]
    pub max_connections: Option<String>,
    /// Events waiting in one actor's mailbox before 503 (default 1024).
    #[arg(long, env = "WASMKEEP_MAX_MAILBOX_EVENTS")]
    pub max_mailbox_events: Option<String>,
    /// Largest WebSocket message from a client (default 1 MiB).
    #[arg(long, env = "WASMKEEP_MAX_SOCKET_MESSAGE_BYTES")]
    pub max_socket_message_bytes: Option<String>,
    /// Open WebSockets per actor (default 1000).
    #[arg(long, env = "WASMKEEP_MAX_SOCKETS_PER_ACTOR")]
    pub max_sockets_per_actor: Option<String>,
    /// On SIGTERM, `serve` drains this node (hands every actor to its
    /// peers) for at most this long before stopping (ADR 0014; default
    /// 30s); `dev` does not drain.
    #[arg(long, env = "WASMKEEP_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<String>,
}

#[derive(Debug, Args)]
pub struct DeployArgs {
    pub class: String,
    pub file: PathBuf,
    #[arg(long, env = "WASMKEEP_BUCKET")]
    pub bucket: String,
    #[arg(long, env = "WASMKEEP_APP", default_value = "default")]
    pub app: String,
    #[arg(long, env = "WASMKEEP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Largest database of one actor of the class, in bytes (default
    /// 10 GiB; at least 65536). Redeploying changes it.
    #[arg(long)]
    pub database_max_bytes: Option<u64>,
    /// How far back the class's actors can be restored (`actor restore`,
    /// `actor fork`): the log keeps what rebuilds any instant this long
    /// ago (default 7d; 0 keeps only the present; at most 366d). The
    /// bucket holds every write of the window. Redeploying changes it.
    #[arg(long, value_name = "DURATION")]
    pub retention: Option<String>,
    /// Where the class's actors may send HTTP requests: HOST[:PORT]
    /// (`api.example.com`, `*.example.com`, `*`, `127.0.0.1:8080`,
    /// `10.0.0.0/8`; without a port only 80/443), repeatable. Nothing
    /// without it; a private or loopback address only when listed as an
    /// address or network (ADR 0066). Redeploying replaces the list.
    #[arg(long = "allow-outbound", value_name = "HOST[:PORT]")]
    pub allow_outbound: Vec<String>,
}

/// An actor id given on the command line, with an error that says the form.
pub fn parse_actor(text: &str) -> anyhow::Result<wasmkeep_types::ActorId> {
    wasmkeep_types::ActorId::parse(text)
        .with_context(|| format!("{text:?} is not an actor id (TENANT/CLASS/NAME)"))
}

/// An instant given on the command line, in wall-clock milliseconds: RFC
/// 3339 with any offset (`2026-12-08T10:00:00.250+01:00`), or a duration
/// before `now_ms` (`-10m`). An instant after `now_ms` is refused.
pub fn parse_instant(text: &str, now_ms: i64) -> anyhow::Result<i64> {
    let text = text.trim();
    let at_ms = match text.strip_prefix('-') {
        Some(ago) => {
            let ago = parse_duration(ago).with_context(|| format!("{text:?}"))?;
            let ago = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
            now_ms.saturating_sub(ago)
        }
        None => chrono::DateTime::parse_from_rfc3339(text)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{text:?} is not an instant ({e}): use RFC 3339 (2026-12-08T10:00:00Z) or a duration ago (-10m)"
                )
            })?
            .timestamp_millis(),
    };
    if at_ms > now_ms {
        bail!("{text:?} is in the future");
    }
    Ok(at_ms)
}

/// Wall-clock milliseconds as RFC 3339 in UTC, to the millisecond.
pub fn instant_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

/// Parses `250ms`, `3s`, `2m`, `1h`, `7d`; a bare number is seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .with_context(|| format!("duration {text:?} does not start with a number"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        other => bail!("duration {text:?}: unknown unit {other:?} (use ms, s, m, h or d)"),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        bail!("duration {text:?} is out of range");
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_parse_as_rfc_3339_or_a_duration_ago_and_never_in_the_future() {
        let now = parse_instant("2026-11-30T00:00:00Z", i64::MAX).expect("now");
        assert_eq!(now, 1_795_996_800_000);
        let at = parse_instant("2026-11-29T10:00:00.250Z", now).expect("utc");
        assert_eq!(instant_text(at), "2026-11-29T10:00:00.250Z");
        let offset = parse_instant("2026-11-29T11:00:00.250+01:00", now).expect("offset");
        assert_eq!(offset, at);
        assert_eq!(parse_instant("-10m", now).expect("ago"), now - 600_000);
        assert_eq!(parse_instant("-1d", now).expect("ago"), now - 86_400_000);
        for bad in [
            "yesterday",
            "2026-11-29",
            "2026-11-29 10:00",
            "-soon",
            "2027-01-01T00:00:00Z",
        ] {
            assert!(parse_instant(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("3s").expect("3s"), Duration::from_secs(3));
        assert_eq!(
            parse_duration("250ms").expect("ms"),
            Duration::from_millis(250)
        );
        assert_eq!(parse_duration("2m").expect("m"), Duration::from_secs(120));
        assert_eq!(parse_duration("5").expect("bare"), Duration::from_secs(5));
        assert_eq!(
            parse_duration("7d").expect("d"),
            Duration::from_secs(7 * 86_400)
        );
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-3s").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }
}
