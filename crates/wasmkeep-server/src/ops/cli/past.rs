//! An actor's past (ADR 0076): `actor history` lists the instants its log
//! can rebuild, `actor restore` puts the database of one of them back as
//! the newest state, and `actor fork` makes a new actor of it. Restore and
//! fork rebuild the database in this process from the bucket (as `actor
//! export --at` does), check it as `actor import` checks a file, and ask
//! for its import: the node that holds the actor, or any, carries it out
//! at its next heartbeat (ADR 0069), so a restore fences the holder and
//! hands the actor over like a move. `backup` copies the app to another
//! bucket (`ops::backup`), which restore and fork read with `--from`.

use std::sync::Arc;

use anyhow::Context;
use wasmkeep_store::ActorStore;

use super::args::{ViewArgs, instant_text, parse_actor, parse_duration};
use super::data::{import, parse_at, read_at};
use super::dev::write_stdout;
use super::views::{json_text, open_view, table};

pub(super) async fn actor_history(actor: &str, view: ViewArgs) -> anyhow::Result<()> {
    let actor = parse_actor(actor)?;
    let (bucket, keys, _) = open_view(&view).await?;
    let entries = ActorStore::history(&*bucket, &keys, &actor)
        .await
        .with_context(|| format!("reading the log of actor {actor}"))?;
    if entries.is_empty() {
        anyhow::bail!("actor {actor} has nothing in the bucket");
    }
    let oldest = oldest_instant(&entries);
    if view.json {
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "seq": e.seq,
                    "kind": if e.snapshot { "snapshot" } else { "record" },
                    "time_ms": e.time_ms,
                    "time": instant_text(e.time_ms),
                    "bytes": e.bytes,
                    "node": e.node,
                })
            })
            .collect();
        let out = serde_json::json!({
            "actor": actor.to_string(),
            "restorable_from_ms": oldest,
            "entries": rows,
        });
        write_stdout(&json_text(&out)?);
        return Ok(());
    }
    let cells: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                if e.snapshot { "snapshot" } else { "record" }.to_owned(),
                instant_text(e.time_ms),
                e.bytes.to_string(),
                e.node.clone(),
            ]
        })
        .collect();
    write_stdout(&table(&["SEQ", "KIND", "TIME", "BYTES", "NODE"], &cells));
    let bytes: u64 = entries.iter().map(|e| e.bytes).sum();
    eprintln!(
        "actor {actor}: restorable from {} to now ({} objects, {bytes} bytes)",
        oldest.map_or_else(|| "its first write".to_owned(), instant_text),
        entries.len()
    );
    Ok(())
}

/// The oldest instant the log rebuilds: its beginning while the first
/// record is there (`None`), else the oldest snapshot's time.
fn oldest_instant(entries: &[wasmkeep_store::HistoryEntry]) -> Option<i64> {
    if entries.first().is_some_and(|e| e.seq == 1 && !e.snapshot) {
        return None;
    }
    entries
        .iter()
        .filter(|e| e.snapshot)
        .map(|e| e.time_ms)
        .min()
}

pub(super) async fn actor_restore(
    actor: &str,
    at: &str,
    backup: Option<&str>,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let from = Past {
        actor,
        at: Some(at),
        backup,
    };
    put_back(from, actor, true, timeout, view).await
}

pub(super) async fn actor_fork(
    actor: &str,
    new: &str,
    at: Option<&str>,
    backup: Option<&str>,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    if parse_actor(actor)? == parse_actor(new)? && backup.is_none() {
        anyhow::bail!("a fork needs a new actor id, not {actor} again (to go back: actor restore)");
    }
    put_back(Past { actor, at, backup }, new, false, timeout, view).await
}

/// `wasmkeep backup --to URL` ([`crate::ops::backup`]).
pub(super) async fn backup(to: &str, view: ViewArgs) -> anyhow::Result<()> {
    let (source, keys, _) = open_view(&view).await?;
    let destination = wasmkeep_bucket::open(to)
        .await
        .with_context(|| format!("opening the backup bucket {to}"))?;
    let started = std::time::Instant::now();
    let copied = crate::ops::backup::backup(&*source, &*destination, &keys).await?;
    if view.json {
        write_stdout(&json_text(&copied)?);
        return Ok(());
    }
    eprintln!(
        "wasmkeep: backed up to {to} in {:.1} s: {} objects copied ({} bytes), {} of the log already there, {} compacted away meanwhile",
        started.elapsed().as_secs_f64(),
        copied.objects,
        copied.bytes,
        copied.skipped,
        copied.vanished
    );
    Ok(())
}

/// An actor's state to put back: the actor, the instant (now without
/// one), and the backup it is read from (the bucket without one).
struct Past<'a> {
    actor: &'a str,
    at: Option<&'a str>,
    backup: Option<&'a str>,
}

/// Rebuilds `from` and imports it into `to`, replacing `to`'s data or only
/// into an actor without data.
async fn put_back(
    from: Past<'_>,
    to: &str,
    replace: bool,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let timeout = parse_duration(timeout).context("--timeout")?;
    let to = parse_actor(to)?;
    let from_id = parse_actor(from.actor)?;
    let at_ms = parse_at(from.at)?;
    let (bucket, keys, _) = open_view(&view).await?;
    // The instant is read from the backup, when one is named.
    let image = match from.backup {
        Some(url) => {
            let backup = wasmkeep_bucket::open_existing(url)
                .await
                .with_context(|| format!("opening the backup {url}"))?;
            read_at(backup, keys.clone(), &from_id, at_ms).await?
        }
        None => read_at(Arc::clone(&bucket), keys.clone(), &from_id, at_ms).await?,
    }
    .database_image();
    let from = match from.backup {
        Some(url) => format!("{from_id} in {url}"),
        None => from_id.to_string(),
    };
    let what = at_ms.map_or_else(
        || format!("actor {from}"),
        |ms| format!("actor {from} at {}", instant_text(ms)),
    );
    if image.is_empty() {
        anyhow::bail!("{what} had no data (nothing was written; to empty an actor: actor delete)");
    }
    let refused = format!("{what} cannot go into {to}");
    let result = import(&*bucket, &keys, &to, &image, replace, timeout, &refused).await?;
    if view.json {
        write_stdout(&json_text(&result)?);
        return Ok(());
    }
    let verb = if replace { "restored" } else { "forked" };
    eprintln!(
        "wasmkeep: actor {to}: {verb} from {what} ({} bytes)",
        image.len()
    );
    Ok(())
}
