//! What the bucket says about an app, as the operator's views show it: the
//! command line's `class list`, `actor list`, `actor sql`, `actor move
//! --wait`, and the web console (ADR 0067). Everything here reads; nothing
//! writes to the bucket.

use std::sync::Arc;
use std::time::Duration;

use wasmkeep_bucket::{Bucket, hinted};
use wasmkeep_cluster::inspect::{ActorRow, NodeRow};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig};
use wasmkeep_types::heartbeat::CAPABILITY_TAKE;
use wasmkeep_types::{ActorId, Keys, NodeId};

use crate::{Error, Result};

/// One deployed class as `class list --json` and the console show it.
#[derive(Debug, serde::Serialize)]
pub struct ClassRow {
    pub class: String,
    pub digest: Option<String>,
    pub database_bytes_max: Option<u64>,
    pub allow_outbound: Vec<String>,
    /// Why the class's `current` record does not parse, when it does not.
    pub error: Option<String>,
}

/// Every deployed class, by name.
pub async fn class_rows(bucket: &dyn Bucket, keys: &Keys) -> Result<Vec<ClassRow>> {
    Ok(crate::actor::classes::list(bucket, keys)
        .await?
        .into_iter()
        .map(|(class, current)| match current {
            Ok(current) => ClassRow {
                class: class.to_string(),
                digest: Some(current.digest),
                database_bytes_max: Some(current.limits.database_bytes_max),
                allow_outbound: current
                    .limits
                    .allow_outbound
                    .entries()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                error: None,
            },
            Err(why) => ClassRow {
                class: class.to_string(),
                digest: None,
                database_bytes_max: None,
                allow_outbound: Vec::new(),
                error: Some(why),
            },
        })
        .collect())
}

/// Whether `row` is an actor that `actor delete` emptied and nothing wrote
/// to since: no owner, no alarm, and only the empty snapshot and the log
/// record that fences its former holders ([`wasmkeep_store::erase`]). It
/// is shown as deleted, not as an actor.
pub async fn is_erased(bucket: &dyn Bucket, keys: &Keys, row: &ActorRow) -> Result<bool> {
    if row.owner.is_some() || row.alarm_ms.is_some() || row.log_records != 1 || row.snapshots != 1 {
        return Ok(false);
    }
    let actor = ActorId::parse(&row.actor)?;
    let listed = hinted::list_keys(bucket, &keys.actor_snapshot_prefix(&actor)).await?;
    let [snapshot] = listed.as_slice() else {
        return Ok(false);
    };
    match bucket.get(&snapshot.key).await {
        Ok(object) => Ok(wasmkeep_store::record_origin(&object.bytes).is_ok_and(|o| o.empty)),
        // Compacted by a new life meanwhile.
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A page of actors whose id starts with `prefix` and sorts after `after`
/// (at most `limit`, deleted ones left out), and the `after` of the next
/// page when there are more.
pub async fn actor_page(
    bucket: &dyn Bucket,
    keys: &Keys,
    lease_ttl: Duration,
    prefix: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<ActorRow>, Option<String>)> {
    let (listed, next) =
        wasmkeep_cluster::inspect::list_actors_page(bucket, keys, lease_ttl, prefix, after, limit)
            .await?;
    let mut rows = Vec::with_capacity(listed.len());
    for row in listed {
        if !is_erased(bucket, keys, &row).await? {
            rows.push(row);
        }
    }
    Ok((rows, next))
}

/// The actor's state as the bucket holds it (every acknowledged write),
/// restored in this process with a store that writes nothing (ADR 0065);
/// `None` when the bucket has nothing of it.
pub async fn open_reader(
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    actor: &ActorId,
) -> Result<Option<ActorStore>> {
    open_reader_at(bucket, keys, actor, None).await
}

/// As [`open_reader`], or the state as it was at `at_ms` (ADR 0076).
pub async fn open_reader_at(
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    actor: &ActorId,
    at_ms: Option<i64>,
) -> Result<Option<ActorStore>> {
    let store_error = |e: wasmkeep_store::Error| Error::Store(format!("actor {actor}: {e}"));
    if !ActorStore::exists(&*bucket, &keys, actor)
        .await
        .map_err(store_error)?
    {
        return Ok(None);
    }
    let config = StoreConfig {
        // Whatever its class allows: this only reads what is there.
        database_bytes_max: u64::MAX / 2,
        ..StoreConfig::default()
    };
    let opened = match at_ms {
        Some(at_ms) => ActorStore::open_reader_at(bucket, keys, actor.clone(), config, at_ms).await,
        None => ActorStore::open_reader(bucket, keys, actor.clone(), config).await,
    };
    opened.map(Some).map_err(store_error)
}

/// A value as a table cell: text as it is, a blob as `x'…'` (SQL's
/// literal), NULL as `NULL`.
pub fn text_value(value: &SqlValue) -> String {
    match value {
        SqlValue::Null => "NULL".into(),
        SqlValue::Integer(i) => i.to_string(),
        SqlValue::Real(r) => r.to_string(),
        SqlValue::Text(t) => t.clone(),
        SqlValue::Blob(b) => format!("x'{}'", hex::encode(b)),
    }
}

/// A value in JSON: numbers and text as themselves, a blob as
/// `{"hex": "…"}`.
pub fn json_value(value: &SqlValue) -> serde_json::Value {
    match value {
        SqlValue::Null => serde_json::Value::Null,
        SqlValue::Integer(i) => (*i).into(),
        SqlValue::Real(r) => serde_json::Number::from_f64(*r)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        SqlValue::Text(t) => t.clone().into(),
        SqlValue::Blob(b) => serde_json::json!({ "hex": hex::encode(b) }),
    }
}

/// Rows as `{"columns": [...], "rows": [[...], ...]}`.
pub fn json_rows(rows: &wasmkeep_types::sql::SqlRows) -> serde_json::Value {
    let values: Vec<Vec<serde_json::Value>> = rows
        .rows
        .iter()
        .map(|row| row.iter().map(json_value).collect())
        .collect();
    serde_json::json!({ "columns": rows.columns, "rows": values })
}

/// Where a requested move of an actor to `target` stands, in one line:
/// what stops it, or what it waits for. `holder` is the node whose hold
/// of the actor is valid, if any; `app_has_secrets` whether the app has
/// a recipient (a target must then open secrets).
pub fn move_progress(
    nodes: &[NodeRow],
    target: &NodeId,
    holder: Option<&str>,
    app_has_secrets: bool,
) -> String {
    match nodes.iter().find(|r| r.node == target.as_str()) {
        None => format!("retrying: node {target} has no heartbeat"),
        Some(r) if r.stale => format!("retrying: node {target}'s heartbeat is stale"),
        Some(r) if r.drain != "none" || r.drain_requested => {
            format!("target refused: node {target} drains; retrying until the key expires")
        }
        Some(r) if !r.capabilities.iter().any(|c| c == CAPABILITY_TAKE) => {
            format!("target refused: node {target} does not advertise take; retrying")
        }
        Some(r) if app_has_secrets && !r.secrets => format!(
            "target refused: node {target} cannot open the app's secrets (start it with \
             --secrets-identity); retrying until the key expires"
        ),
        Some(_) => match holder {
            Some(owner) if owner == target.as_str() => {
                format!("done: node {target} holds the actor; its key goes next")
            }
            Some(owner) => format!("moving: held by {owner}, waiting for its pass over the key"),
            None => "moving: nobody holds the actor; waiting for the target's take".to_owned(),
        },
    }
}

/// Whether the app has a recipient: its actors then move only to nodes
/// that can open its secrets.
pub async fn app_has_secrets(bucket: &dyn Bucket, keys: &Keys) -> Result<bool> {
    match bucket.head(&keys.recipient()).await {
        Ok(_) => Ok(true),
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
