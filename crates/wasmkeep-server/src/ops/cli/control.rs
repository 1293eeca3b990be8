//! The operator commands that write control keys (ADR 0014, 0017, 0055):
//! `node drain` / `undrain` (`control/drain/<node>`), `actor move`
//! (`control/move/...`), `actor delete` (`control/delete/...`), the bodies
//! of those keys (written here only: nodes look at a control key's
//! presence, never at its body), and the `--wait` loops that follow each
//! on stderr. It never acts on an actor itself: the nodes do, at their
//! heartbeat.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use wasmkeep_bucket::Bucket;
use wasmkeep_types::heartbeat::CAPABILITY_TAKE;
use wasmkeep_types::{Keys, NodeId};

use super::args::{ViewArgs, parse_actor, parse_duration};
use super::views::open_view;
use crate::ops::survey::{self, is_erased};

/// Pause between two looks at the heartbeats while `node drain --wait` follows.
const DRAIN_WAIT_POLL: Duration = Duration::from_millis(250);

/// Body of a drain key (its presence is what counts).
const DRAIN_KEY_BODY: &[u8] = b"wasmkeep-drain 1\n";

/// Body of a control key (`move`, `delete`); the key names the actor (and
/// the target). The time makes two writes of one key differ (their ETags
/// too).
fn control_key_body(kind: &str) -> bytes::Bytes {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    bytes::Bytes::from(format!("wasmkeep-{kind} 1\n{now_ms}\n"))
}

pub(super) async fn node_drain(
    node: &str,
    wait: bool,
    force: bool,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let node_id = NodeId::new(node.to_owned())?;
    let (bucket, keys, lease_ttl) = open_view(&view).await?;
    let rows = wasmkeep_cluster::inspect::list_nodes(&*bucket, &keys, lease_ttl).await?;
    let Some(row) = rows.iter().find(|r| r.node == node_id.as_str()) else {
        if !force {
            bail!(
                "node {node_id} has no heartbeat in app {} (a typo, or a node that is gone); --force writes the drain key anyway",
                view.app
            );
        }
        eprintln!(
            "wasmkeep: node {node_id} has no heartbeat; writing the drain key anyway (--force)"
        );
        return write_drain_key(&*bucket, &keys, &node_id, wait, &view, lease_ttl).await;
    };
    let others_serving = rows
        .iter()
        .filter(|r| {
            r.node != row.node
                && !r.stale
                && r.state == "serving"
                && r.drain == "none"
                && !r.drain_requested
        })
        .count();
    if others_serving == 0 && !force {
        bail!(
            "node {node_id} is the last serving node of app {}: nothing could take its actors; --force writes the drain key anyway (the node then keeps serving until a peer joins)",
            view.app
        );
    }
    write_drain_key(&*bucket, &keys, &node_id, wait, &view, lease_ttl).await
}

async fn write_drain_key(
    bucket: &dyn Bucket,
    keys: &Keys,
    node_id: &NodeId,
    wait: bool,
    view: &ViewArgs,
    lease_ttl: Duration,
) -> anyhow::Result<()> {
    bucket
        .put(
            &keys.drain(node_id),
            bytes::Bytes::from_static(DRAIN_KEY_BODY),
        )
        .await
        .context("writing the drain key")?;
    eprintln!("wasmkeep: drain of node {node_id} requested");
    if !wait {
        return Ok(());
    }
    let mut last = String::new();
    loop {
        let rows = wasmkeep_cluster::inspect::list_nodes(bucket, keys, lease_ttl).await?;
        let Some(row) = rows.iter().find(|r| r.node == node_id.as_str()) else {
            bail!(
                "node {node_id} left app {} before it reported drained",
                view.app
            );
        };
        if row.drain == "drained" {
            eprintln!("wasmkeep: node {node_id} drained");
            return Ok(());
        }
        let progress = match row.drain {
            "none" => "waiting for the node to notice the drain key".to_owned(),
            "asked" => "asked; waiting for an eligible peer (see the node's log)".to_owned(),
            other => format!(
                "{other}: {} actors left, {} sockets closing, {} failed releases (retried)",
                row.resident_actors, row.sockets_closing, row.releases_failed
            ),
        };
        if progress != last {
            eprintln!("wasmkeep: node {node_id}: {progress}");
            last = progress;
        }
        tokio::time::sleep(DRAIN_WAIT_POLL).await;
    }
}

/// The actor of an operator command, which must have something in the
/// bucket (`what` ends the refusal: a mistyped name is never created).
async fn existing_actor(
    actor: &str,
    view: &ViewArgs,
    what: &str,
) -> anyhow::Result<(wasmkeep_types::ActorId, Arc<dyn Bucket>, Keys, Duration)> {
    let actor = parse_actor(actor)?;
    let (bucket, keys, lease_ttl) = open_view(view).await?;
    let row = wasmkeep_cluster::inspect::inspect_actor(&*bucket, &keys, lease_ttl, &actor).await?;
    let exists = match &row {
        Some(row) => !is_erased(&*bucket, &keys, row).await?,
        None => false,
    };
    if !exists {
        bail!(
            "actor {actor} does not exist in app {} (no data, ownership record or alarm){what}",
            view.app
        );
    }
    Ok((actor, bucket, keys, lease_ttl))
}

/// How long `actor delete --wait` waits, once the data is deleted, for the
/// holder to give the ownership record back.
const RECORD_RELEASE_WAIT_MAX: Duration = Duration::from_secs(2);
const RECORD_RELEASE_POLL: Duration = Duration::from_millis(20);

pub(super) async fn actor_delete(
    actor: &str,
    wait: bool,
    timeout: &str,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let timeout = parse_duration(timeout).context("--timeout")?;
    let (actor, bucket, keys, lease_ttl) = existing_actor(actor, &view, "").await?;
    let nodes = wasmkeep_cluster::inspect::list_nodes(&*bucket, &keys, lease_ttl).await?;
    if nodes.iter().all(|r| r.stale) {
        eprintln!(
            "wasmkeep: no node of app {} is running: the actor is deleted once one runs",
            view.app
        );
    }
    // A key of its own for this request (ADR 0055): the node that carries
    // out an earlier one removes only that one.
    let request = format!("{:016x}", rand::random::<u64>());
    let key = keys.delete_key(&actor, &request)?;
    // If-None-Match: a request never replaces another.
    bucket
        .put_if_absent(&key, control_key_body("delete"))
        .await
        .context("writing the delete key")?;
    eprintln!("wasmkeep: delete of {actor} requested");
    if !wait {
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match bucket.head(&key).await {
            Err(wasmkeep_bucket::Error::NotFound { .. }) => {
                // The holder removes the key, then gives its record back
                // (moments later); a new event may have started the actor
                // afresh meanwhile, which this does not wait out.
                let settled = tokio::time::Instant::now() + RECORD_RELEASE_WAIT_MAX;
                while tokio::time::Instant::now() < settled
                    && wasmkeep_cluster::inspect::inspect_actor(&*bucket, &keys, lease_ttl, &actor)
                        .await?
                        .is_some()
                {
                    tokio::time::sleep(RECORD_RELEASE_POLL).await;
                }
                eprintln!("wasmkeep: done: {actor} deleted");
                return Ok(());
            }
            Ok(_) => {}
            Err(e) => return Err(e).context("reading the delete key"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "delete of {actor}: not done within {timeout:?}; the request stays, and a node \
                 deletes the actor at its next pass (`wasmkeep node list` shows the nodes)"
            );
        }
        tokio::time::sleep(DRAIN_WAIT_POLL).await;
    }
}

pub(super) async fn actor_move(
    actor: &str,
    to: &str,
    wait: bool,
    view: ViewArgs,
) -> anyhow::Result<()> {
    let target = NodeId::new(to.to_owned()).with_context(|| format!("--to {to:?}"))?;
    let (actor, bucket, keys, lease_ttl) =
        existing_actor(actor, &view, ": nothing to move").await?;
    let nodes = wasmkeep_cluster::inspect::list_nodes(&*bucket, &keys, lease_ttl).await?;
    match nodes.iter().find(|r| r.node == target.as_str()) {
        None => eprintln!(
            "wasmkeep: node {target} has no heartbeat in app {}; the key waits for it (it expires after 5 minutes)",
            view.app
        ),
        Some(row) if !row.capabilities.iter().any(|c| c == CAPABILITY_TAKE) => eprintln!(
            "wasmkeep: node {target} does not advertise take (an older release); the key waits (it expires after 5 minutes)"
        ),
        Some(_) => {}
    }
    let key = keys.move_key(&actor, &target);
    bucket
        .put(&key, control_key_body("move"))
        .await
        .context("writing the move key")?;
    eprintln!("wasmkeep: move of {actor} to node {target} requested");
    if !wait {
        return Ok(());
    }
    /// Readings after the key is gone before the CLI calls the move dropped.
    const MOVE_SETTLE_READS: u32 = 4;
    // An app with secrets (a recipient) moves actors only to nodes that
    // can open them: the take is refused elsewhere.
    let app_has_secrets = survey::app_has_secrets(&*bucket, &keys)
        .await
        .context("reading the app's recipient")?;
    let deadline = tokio::time::Instant::now() + crate::peering::moves::MOVE_KEY_AGE_MAX;
    let mut settle_reads = 0;
    let mut last = String::new();
    loop {
        let key_left = match bucket.head(&key).await {
            Ok(_) => true,
            Err(wasmkeep_bucket::Error::NotFound { .. }) => false,
            Err(e) => return Err(e).context("reading the move key"),
        };
        let row =
            wasmkeep_cluster::inspect::inspect_actor(&*bucket, &keys, lease_ttl, &actor).await?;
        let holder = row
            .as_ref()
            .filter(|r| r.hold_valid)
            .and_then(|r| r.owner.clone());
        if holder.as_deref() == Some(target.as_str()) && !key_left {
            eprintln!("wasmkeep: done: node {target} holds {actor}");
            return Ok(());
        }
        if !key_left {
            // The key goes once the target holds the actor; a reading taken
            // between the two is not an outcome yet.
            if settle_reads < MOVE_SETTLE_READS {
                settle_reads += 1;
                tokio::time::sleep(DRAIN_WAIT_POLL).await;
                continue;
            }
            let outcome = match (&row, &holder) {
                (None, _) => format!("dropped: actor {actor} does not exist"),
                (_, Some(other)) => format!("dropped: node {other} holds the actor"),
                (_, None) => "dropped: the key was deleted and nobody holds the actor".to_owned(),
            };
            bail!("move of {actor} to node {target}: {outcome}");
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("move of {actor} to node {target}: expired after 5 minutes without happening");
        }
        let nodes = wasmkeep_cluster::inspect::list_nodes(&*bucket, &keys, lease_ttl).await?;
        let progress = survey::move_progress(&nodes, &target, holder.as_deref(), app_has_secrets);
        if progress != last {
            eprintln!("wasmkeep: {actor}: {progress}");
            last = progress;
        }
        tokio::time::sleep(DRAIN_WAIT_POLL).await;
    }
}

pub(super) async fn node_undrain(node: &str, view: ViewArgs) -> anyhow::Result<()> {
    let node_id = NodeId::new(node.to_owned())?;
    let (bucket, keys, _) = open_view(&view).await?;
    let key = keys.drain(&node_id);
    match bucket.head(&key).await {
        Ok(_) => {}
        Err(wasmkeep_bucket::Error::NotFound { .. }) => {
            eprintln!("wasmkeep: node {node_id} had no drain request");
            return Ok(());
        }
        Err(e) => return Err(e).context("reading the drain key"),
    }
    bucket
        .delete(&key)
        .await
        .context("deleting the drain key")?;
    eprintln!("wasmkeep: drain of node {node_id} withdrawn");
    Ok(())
}
