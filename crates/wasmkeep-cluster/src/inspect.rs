//! Read-only views of the bucket for operators: `wasmkeep node list`,
//! `actor list` and `actor inspect`.
//!
//! A command that reads the bucket once cannot judge a lease the way nodes
//! do (that takes two reads a TTL apart), so these views report what they
//! can see: each heartbeat's age by its last-modified time on the bucket's
//! clock compared with this machine's, clearly an estimate.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use wasmkeep_bucket::{Bucket, ObjectMeta};
use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, Keys};

use crate::Result;
use crate::ownership::OwnershipRecord;

#[derive(Debug, Clone, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub address: String,
    pub incarnation: String,
    pub state: &'static str,
    pub drain: &'static str,
    pub classes: String,
    pub secrets: bool,
    pub capabilities: Vec<String>,
    pub resident_actors: u64,
    /// Sockets the node closed that are still in their close handshake.
    pub sockets_closing: u64,
    /// Ownership records whose release failed, not yet given back.
    pub releases_failed: u64,
    /// Seconds since the heartbeat was last written (estimated across clocks).
    pub heartbeat_age_s: f64,
    /// The heartbeat is older than the lease TTL: the node is probably gone.
    pub stale: bool,
    /// A drain was requested for this node (`control/drain/<node>`).
    pub drain_requested: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ActorRow {
    pub actor: String,
    /// The node named by the ownership record, if it says `held`.
    pub owner: Option<String>,
    pub owner_incarnation: Option<String>,
    /// Whether that node's heartbeat shows the same incarnation and is fresh.
    pub hold_valid: bool,
    /// The alarm in the alarm index (ms since the Unix epoch).
    pub alarm_ms: Option<i64>,
    pub database_bytes: u64,
    pub log_records: u64,
    pub snapshots: u64,
    /// Last write to the actor's data, as seconds since the Unix epoch.
    pub last_write_unix_s: Option<u64>,
}

impl ActorRow {
    /// The row of an actor nothing is known of yet.
    fn blank(actor: &ActorId) -> Self {
        Self {
            actor: actor.to_string(),
            owner: None,
            owner_incarnation: None,
            hold_valid: false,
            alarm_ms: None,
            database_bytes: 0,
            log_records: 0,
            snapshots: 0,
            last_write_unix_s: None,
        }
    }
}

fn state_word(state: NodeState) -> &'static str {
    match state {
        NodeState::Starting => "starting",
        NodeState::Serving => "serving",
        NodeState::Stopping => "stopping",
    }
}

fn drain_word(drain: DrainState) -> &'static str {
    match drain {
        DrainState::None => "none",
        DrainState::Asked => "asked",
        DrainState::Draining => "draining",
        DrainState::Drained => "drained",
    }
}

fn age(modified: SystemTime) -> Duration {
    SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default()
}

/// Adds one object of an actor's database (a log record or a snapshot) to
/// its row.
fn count_data_object(row: &mut ActorRow, meta: &ObjectMeta) {
    row.database_bytes += meta.size;
    if meta.key.contains("/log/") {
        row.log_records += 1;
    } else if meta.key.contains("/snap/") {
        row.snapshots += 1;
    }
    let written = meta
        .last_modified
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    row.last_write_unix_s = Some(row.last_write_unix_s.map_or(written, |w| w.max(written)));
}

/// Every node with a heartbeat in the app. Heartbeats that do not parse are
/// skipped with a warning.
pub async fn list_nodes(
    bucket: &dyn Bucket,
    keys: &Keys,
    lease_ttl: Duration,
) -> Result<Vec<NodeRow>> {
    let drains: Vec<String> = bucket
        .list(&keys.drains_prefix())
        .await?
        .into_iter()
        .filter_map(|m| m.key.rsplit('/').next().map(str::to_owned))
        .collect();
    let mut rows = Vec::new();
    for meta in bucket.list(&keys.nodes_prefix()).await? {
        let object = match bucket.get(&meta.key).await {
            Ok(o) => o,
            Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let Some(hb) = std::str::from_utf8(&object.bytes)
            .ok()
            .and_then(|t| Heartbeat::parse(t).ok())
        else {
            tracing::warn!(key = meta.key, "skipping a heartbeat that does not parse");
            continue;
        };
        let heartbeat_age = age(object.meta.last_modified);
        rows.push(NodeRow {
            drain_requested: drains.iter().any(|d| d == hb.node.as_str()),
            node: hb.node.to_string(),
            address: hb.advertise,
            incarnation: hb.incarnation,
            sockets_closing: hb.sockets_closing,
            releases_failed: hb.releases_failed,
            state: state_word(hb.state),
            drain: drain_word(hb.drain),
            classes: match hb.classes {
                ClassesServed::All => "*".into(),
                ClassesServed::Only(set) => {
                    set.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(",")
                }
            },
            secrets: hb.secrets,
            capabilities: hb.capabilities.into_iter().collect(),
            resident_actors: hb.resident_actors,
            heartbeat_age_s: heartbeat_age.as_secs_f64(),
            stale: heartbeat_age > lease_ttl,
        });
    }
    Ok(rows)
}

/// Every actor with data, an ownership record or an alarm, optionally only
/// those whose id starts with `filter` (`TENANT/` or `TENANT/CLASS/`), in
/// the order of their ids as text.
pub async fn list_actors(
    bucket: &dyn Bucket,
    keys: &Keys,
    lease_ttl: Duration,
    filter: Option<&str>,
) -> Result<Vec<ActorRow>> {
    let (rows, _) = list_actors_page(bucket, keys, lease_ttl, filter, None, usize::MAX).await?;
    Ok(rows)
}

/// One page of [`list_actors`]: at most `limit` actors whose id (as text)
/// sorts after `after`, and the id to pass as `after` for the next page
/// when there are more. Three listings (data, owners, alarms) find every
/// actor; only the page's own ownership records and alarms are read.
pub async fn list_actors_page(
    bucket: &dyn Bucket,
    keys: &Keys,
    lease_ttl: Duration,
    filter: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<ActorRow>, Option<String>)> {
    struct Found {
        row: ActorRow,
        owner_key: Option<String>,
        alarm_key: Option<String>,
    }
    let blank = |actor: &ActorId| Found {
        row: ActorRow::blank(actor),
        owner_key: None,
        alarm_key: None,
    };
    let wanted =
        |id: &str| filter.is_none_or(|f| id.starts_with(f)) && after.is_none_or(|a| id > a);
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for meta in bucket.list(&keys.actors_prefix()).await? {
        let Ok(actor) = keys.parse_actor_data_key(&meta.key) else {
            continue;
        };
        let id = actor.to_string();
        if wanted(&id) {
            count_data_object(
                &mut found.entry(id).or_insert_with(|| blank(&actor)).row,
                &meta,
            );
        }
    }
    for meta in bucket.list(&keys.owners_prefix()).await? {
        let Ok(actor) = keys.parse_owner_key(&meta.key) else {
            continue;
        };
        let id = actor.to_string();
        if wanted(&id) {
            found.entry(id).or_insert_with(|| blank(&actor)).owner_key = Some(meta.key);
        }
    }
    for meta in bucket.list(&keys.alarms_prefix()).await? {
        let Ok(actor) = keys.parse_alarm_key(&meta.key) else {
            continue;
        };
        let id = actor.to_string();
        if wanted(&id) {
            found.entry(id).or_insert_with(|| blank(&actor)).alarm_key = Some(meta.key);
        }
    }
    let more = found.len() > limit;
    let page: Vec<Found> = found.into_values().take(limit).collect();
    let next = more
        .then(|| page.last().map(|f| f.row.actor.clone()))
        .flatten();
    let nodes: BTreeMap<String, NodeRow> = if page.iter().any(|f| f.owner_key.is_some()) {
        list_nodes(bucket, keys, lease_ttl)
            .await?
            .into_iter()
            .map(|n| (n.node.clone(), n))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut rows = Vec::with_capacity(page.len());
    for Found {
        mut row,
        owner_key,
        alarm_key,
    } in page
    {
        if let Some(key) = owner_key
            && let Ok(object) = bucket.get(&key).await
            && let Some(record) = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(OwnershipRecord::parse)
            && record.held
        {
            row.hold_valid = nodes
                .get(record.node.as_str())
                .is_some_and(|n| n.incarnation == record.incarnation && !n.stale);
            row.owner = Some(record.node.to_string());
            row.owner_incarnation = Some(record.incarnation);
        }
        if let Some(key) = alarm_key
            && let Ok(object) = bucket.get(&key).await
        {
            row.alarm_ms = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(|t| t.trim().parse().ok());
        }
        rows.push(row);
    }
    Ok((rows, next))
}

/// One actor's row, reading only that actor's keys; `None` when the bucket
/// has nothing of it.
pub async fn inspect_actor(
    bucket: &dyn Bucket,
    keys: &Keys,
    lease_ttl: Duration,
    actor: &ActorId,
) -> Result<Option<ActorRow>> {
    let mut row = ActorRow::blank(actor);
    let mut found = false;
    for meta in bucket.list(&keys.actor_prefix(actor)).await? {
        found = true;
        count_data_object(&mut row, &meta);
    }
    match bucket.get(&keys.owner(actor)).await {
        Ok(object) => {
            found = true;
            if let Some(record) = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(OwnershipRecord::parse)
                && record.held
            {
                let nodes = list_nodes(bucket, keys, lease_ttl).await?;
                row.hold_valid = nodes.iter().any(|n| {
                    n.node == record.node.as_str()
                        && n.incarnation == record.incarnation
                        && !n.stale
                });
                row.owner = Some(record.node.to_string());
                row.owner_incarnation = Some(record.incarnation);
            }
        }
        Err(wasmkeep_bucket::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    match bucket.get(&keys.alarm(actor)).await {
        Ok(object) => {
            found = true;
            row.alarm_ms = std::str::from_utf8(&object.bytes)
                .ok()
                .and_then(|t| t.trim().parse().ok());
        }
        Err(wasmkeep_bucket::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(found.then_some(row))
}
