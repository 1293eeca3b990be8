//! An actor's data, read from the bucket (ADR 0065): `actor sql` runs one
//! read-only statement on the actor's state as the bucket holds it and
//! prints the rows; `actor export` writes the database to a file the
//! sqlite3 shell opens. Both restore the actor in this process with a
//! store that writes nothing, so they need no node, and whoever holds the
//! actor keeps serving it.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use wasmkeep_store::ActorStore;
use wasmkeep_types::ActorId;

use wasmkeep_cluster::clock::Clock as _;

use super::args::{ViewArgs, parse_actor, parse_duration, parse_instant};
use super::dev::write_stdout;
use super::views::{json_text, open_view, table};
use crate::ops::survey;

/// `--at` as wall-clock milliseconds (now read once), or `None`.
pub(super) fn parse_at(at: Option<&str>) -> anyhow::Result<Option<i64>> {
    at.map(|at| parse_instant(at, wasmkeep_cluster::clock::SystemClock.wall_ms()))
        .transpose()
        .context("--at")
}

/// Opens the actor's state for reading, as it is or as it was at `at`
/// (`--at`, ADR 0076); an actor with nothing in the bucket is an error.
async fn restore(
    actor: &str,
    at: Option<&str>,
    view: &ViewArgs,
) -> anyhow::Result<(ActorId, ActorStore)> {
    let actor = parse_actor(actor)?;
    let at_ms = parse_at(at)?;
    let (bucket, keys, _) = open_view(view).await?;
    Ok((actor.clone(), read_at(bucket, keys, &actor, at_ms).await?))
}

/// The actor's state in `bucket`, now or at `at_ms`; nothing there is an
/// error.
pub(super) async fn read_at(
    bucket: std::sync::Arc<dyn wasmkeep_bucket::Bucket>,
    keys: wasmkeep_types::Keys,
    actor: &ActorId,
    at_ms: Option<i64>,
) -> anyhow::Result<ActorStore> {
    survey::open_reader_at(bucket, keys, actor, at_ms)
        .await
        .with_context(|| format!("restoring actor {actor}"))?
        .ok_or_else(|| anyhow::anyhow!("actor {actor} has nothing in the bucket"))
}

pub(super) async fn actor_sql(
    actor: &str,
    statement: &str,
    at: Option<&str>,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let (actor, mut store) = restore(actor, at, &view).await?;
    let rows = store
        .query(statement, &[])
        .map_err(|e| anyhow::anyhow!("actor {actor}: {}", e.message))?;
    store.rollback_event();
    if view.json {
        write_stdout(&json_text(&survey::json_rows(&rows))?);
        return Ok(());
    }
    let header: Vec<&str> = rows.columns.iter().map(String::as_str).collect();
    let cells: Vec<Vec<String>> = rows
        .rows
        .iter()
        .map(|row| row.iter().map(survey::text_value).collect())
        .collect();
    write_stdout(&table(&header, &cells));
    Ok(())
}

/// How often `actor sql --write` looks for its result.
const RESULT_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a result no command read stays: its command died, or gave up
/// waiting. The next operator's command removes it.
const RESULT_UNREAD_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes results older than [`RESULT_UNREAD_MAX`] (one listing of
/// `results/`; a failure only leaves them for the next command).
async fn remove_stale_results(bucket: &dyn wasmkeep_bucket::Bucket, keys: &wasmkeep_types::Keys) {
    remove_results_older(
        bucket,
        keys,
        std::time::SystemTime::now(),
        RESULT_UNREAD_MAX,
    )
    .await;
}

async fn remove_results_older(
    bucket: &dyn wasmkeep_bucket::Bucket,
    keys: &wasmkeep_types::Keys,
    now: std::time::SystemTime,
    age_max: std::time::Duration,
) {
    let Ok(listed) = bucket.list(&keys.results_prefix()).await else {
        return;
    };
    for meta in listed {
        let age = now.duration_since(meta.last_modified).unwrap_or_default();
        if age > age_max {
            let _ = bucket.delete(&meta.key).await;
        }
    }
}

/// A new operator request's id: 16 random hex digits.
fn new_request() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The key of an operator's request of one kind, or of its result, from
/// the actor and the request id ([`Keys::sql_key`], [`Keys::import_key`],
/// and their results').
///
/// [`Keys::sql_key`]: wasmkeep_types::Keys::sql_key
/// [`Keys::import_key`]: wasmkeep_types::Keys::import_key
type RequestKey =
    fn(&wasmkeep_types::Keys, &ActorId, &str) -> Result<String, wasmkeep_types::Error>;

/// Writes an operator's request under a new request id (`body` at
/// `request_key`, If-None-Match), waits for the node that carries it out
/// to write its result at `result_key`, and removes the result. Results
/// other commands left unread are swept first. On a timeout the request is
/// withdrawn if no node took it yet; one that did may still carry it out,
/// once. A result with an `error` is an error: the node wrote nothing.
async fn ask(
    bucket: &dyn wasmkeep_bucket::Bucket,
    keys: &wasmkeep_types::Keys,
    actor: &ActorId,
    (request_key, result_key): (RequestKey, RequestKey),
    body: bytes::Bytes,
    timeout: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    remove_stale_results(bucket, keys).await;
    let request = new_request();
    let key = &request_key(keys, actor, &request)?;
    let result_key = &result_key(keys, actor, &request)?;
    bucket
        .put_if_absent(key, body)
        .await
        .with_context(|| format!("writing the request {key}"))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let result = loop {
        match bucket.get(result_key).await {
            Ok(object) => break object.bytes,
            Err(wasmkeep_bucket::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).context("reading the result"),
        }
        if tokio::time::Instant::now() >= deadline {
            let withdrawn = bucket.delete(key).await.is_ok();
            bail!(
                "actor {actor}: no result within {timeout:?} (is a node serving class {}? \
                 `wasmkeep node list`). {}",
                actor.class,
                if withdrawn {
                    "The request was withdrawn; a node that took it already may still carry it out, once."
                } else {
                    "The request could not be withdrawn: a node may still carry it out, once."
                }
            );
        }
        tokio::time::sleep(RESULT_POLL).await;
    };
    if let Err(e) = bucket.delete(result_key).await {
        eprintln!("wasmkeep: removing the result {result_key} failed: {e}");
    }
    let result: serde_json::Value =
        serde_json::from_slice(&result).context("the node's result is not JSON")?;
    if let Some(error) = result.get("error").and_then(|e| e.as_str()) {
        bail!("actor {actor}: {error} (nothing was written)");
    }
    Ok(result)
}

/// `actor sql --write`: asks for the statement to run on the actor's
/// holder ([`ask`]) and prints its result.
pub(super) async fn actor_sql_write(
    actor: &str,
    statement: &str,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let timeout = parse_duration(timeout).context("--timeout")?;
    let actor = parse_actor(actor)?;
    if let Some(why) = crate::peering::sql::refused(statement) {
        bail!("{why}");
    }
    let (bucket, keys, _) = open_view(&view).await?;
    let result = ask(
        &*bucket,
        &keys,
        &actor,
        (
            wasmkeep_types::Keys::sql_key,
            wasmkeep_types::Keys::sql_result_key,
        ),
        bytes::Bytes::from(statement.to_owned()),
        timeout,
    )
    .await?;
    let changes = result
        .get("changes")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    if view.json {
        write_stdout(&json_text(&result)?);
        return Ok(());
    }
    let columns: Vec<String> = result["columns"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    if !columns.is_empty() {
        let header: Vec<&str> = columns.iter().map(String::as_str).collect();
        let cells: Vec<Vec<String>> = result["rows"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.as_array()
                            .map(|r| r.iter().map(json_cell).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        write_stdout(&table(&header, &cells));
    }
    eprintln!("wasmkeep: actor {actor}: committed; {changes} rows changed");
    Ok(())
}

/// A JSON value of a result as a table cell (as [`survey::text_value`]
/// shows SQL values).
fn json_cell(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Null => "NULL".into(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(o) => match o.get("hex").and_then(|h| h.as_str()) {
            Some(hex) => format!("x'{hex}'"),
            None => value.to_string(),
        },
        other => other.to_string(),
    }
}

pub(super) async fn actor_export(
    actor: &str,
    file: &Path,
    at: Option<&str>,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let (actor, store) = restore(actor, at, &view).await?;
    let image = store.database_image();
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .with_context(|| {
            format!(
                "creating {} (an existing file is left alone)",
                file.display()
            )
        })?;
    out.write_all(&image)
        .and_then(|()| out.sync_all())
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "actor {actor}: {} bytes written to {}",
        image.len(),
        file.display()
    );
    Ok(())
}

/// Checks a database as the node will (against the class's database
/// maximum when the class is deployed; `what` names it in the refusal),
/// then asks for its import into `actor` ([`ask`]): `actor import`,
/// `actor restore`, `actor fork`.
pub(super) async fn import(
    bucket: &dyn wasmkeep_bucket::Bucket,
    keys: &wasmkeep_types::Keys,
    actor: &ActorId,
    bytes: &[u8],
    replace: bool,
    timeout: std::time::Duration,
    what: &str,
) -> anyhow::Result<serde_json::Value> {
    // The node checks against its class's maximum again; a class not
    // deployed yet has none here.
    let bytes_max = crate::actor::classes::current(bucket, keys, &actor.class)
        .await?
        .map_or(u64::MAX, |current| current.limits.database_bytes_max);
    wasmkeep_store::Image::from_file(bytes, bytes_max, None)
        .map_err(|e| anyhow::anyhow!("{what}: {e}; nothing was written"))?;
    ask(
        bucket,
        keys,
        actor,
        (
            wasmkeep_types::Keys::import_key,
            wasmkeep_types::Keys::import_result_key,
        ),
        crate::peering::imports::request_body(replace, bytes),
        timeout,
    )
    .await
}

/// `actor import`: checks the file as the node will (against the class's
/// database maximum when the class is deployed), then asks for the import
/// ([`ask`]) and says how it ended.
pub(super) async fn actor_import(
    actor: &str,
    file: &Path,
    replace: bool,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let timeout = parse_duration(timeout).context("--timeout")?;
    let actor = parse_actor(actor)?;
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    if Path::new(&wal).exists() {
        bail!(
            "{} has a write-ahead log beside it ({}); checkpoint it first: \
             sqlite3 {} 'PRAGMA journal_mode=DELETE'",
            file.display(),
            Path::new(&wal).display(),
            file.display()
        );
    }
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let (bucket, keys, _) = open_view(&view).await?;
    let what = file.display().to_string();
    let result = import(&*bucket, &keys, &actor, &bytes, replace, timeout, &what).await?;
    if view.json {
        write_stdout(&json_text(&result)?);
        return Ok(());
    }
    let alarm = match result.get("alarm_ms").and_then(serde_json::Value::as_i64) {
        Some(at) => format!("; its alarm is at {at} ms"),
        None => String::new(),
    };
    eprintln!(
        "wasmkeep: actor {actor}: imported {} ({} bytes){alarm}",
        file.display(),
        bytes.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmkeep_bucket::{Bucket as _, MemoryBucket};
    use wasmkeep_types::{AppName, Keys};

    #[tokio::test]
    async fn only_results_left_unread_too_long_are_removed() {
        let bucket = MemoryBucket::new();
        let keys = Keys::new(&AppName::default_app());
        let actor = ActorId::parse("demo/counter/a").expect("valid");
        let result = keys.import_result_key(&actor, "00aa").expect("valid");
        let request = keys.import_key(&actor, "00bb").expect("valid");
        for key in [&result, &request] {
            bucket.put(key, bytes::Bytes::new()).await.expect("put");
        }
        let hour = std::time::Duration::from_secs(3600);
        let now = std::time::SystemTime::now();
        remove_results_older(&bucket, &keys, now, hour).await;
        assert!(bucket.head(&result).await.is_ok(), "a fresh result stays");
        remove_results_older(&bucket, &keys, now + 2 * hour, hour).await;
        assert!(bucket.head(&result).await.is_err(), "an old result goes");
        assert!(
            bucket.head(&request).await.is_ok(),
            "a request is not a result"
        );
    }
}
