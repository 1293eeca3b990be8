//! Operators' writes (`wasmkeep actor sql --write`, ADR 0065 amended).
//! The command writes `control/sql/<tenant>/<class>/<name hex>/<request>`
//! with the statement as its body; once per heartbeat period every node
//! looks at those keys (in its one listing of `control/`). The node that
//! holds the actor, or, when nobody does, the one whose activation
//! acquires it (the ownership record decides), runs the statement as one
//! event ([`Job::Sql`]), writes what it returned to `results/sql/...` and
//! removes the request. The actor keeps each request's result in its
//! database with the statement's writes, so a request carried out again
//! (its node stopped after the commit, before it reported) answers its
//! result and writes nothing twice.

use std::sync::Arc;

use wasmkeep_bucket::ObjectMeta;
use wasmkeep_types::ActorId;

use crate::actor::orders::Job;
use crate::node::Node;
use crate::{Error, Result};

/// Longest statement a request may carry.
pub const STATEMENT_BYTES_MAX: usize = 64 * 1024;

/// Why an operator's statement is refused before it runs (empty, or over
/// [`STATEMENT_BYTES_MAX`]); `None` when it may run.
pub(crate) fn refused(statement: &str) -> Option<String> {
    (statement.trim().is_empty() || statement.len() > STATEMENT_BYTES_MAX)
        .then(|| format!("the statement is empty or longer than {STATEMENT_BYTES_MAX} bytes"))
}

/// Whether this node runs the pass over the SQL keys now.
pub(crate) fn wanted(node: &Node) -> bool {
    node.peering.lease.is_valid() && !node.is_shutting_down()
}

/// The pass over the SQL keys, when [`wanted`]: `listed` is the
/// heartbeat's listing under [`Keys::sqls_prefix`]. Each request runs in
/// a task of its own; the pass does not wait for them.
///
/// [`Keys::sqls_prefix`]: wasmkeep_types::Keys::sqls_prefix
pub(crate) async fn check(node: &Arc<Node>, listed: Vec<ObjectMeta>) {
    for item in listed {
        let (actor, request) = match node.keys.parse_sql_key(&item.key) {
            Ok(parsed) => parsed,
            Err(e) => {
                crate::peering::control::remove_unparsed(node, &item.key, &e).await;
                continue;
            }
        };
        // Another node serves the class (or this one moves the actor
        // away, or drains): that node acts.
        let resident = node.residents.live_stub(&actor).is_some();
        if !node.classes.serves(&actor.class)
            || (!resident
                && (node.peering.drain.is_active() || node.peering.moves.target(&actor).is_some()))
        {
            continue;
        }
        let key = item.key.clone();
        crate::peering::control::spawn_once(node, item.key, |node| async move {
            if let Err(e) = carry_out(&node, &actor, &request, &key).await {
                tracing::warn!(%actor, %request, error = %e, "an operator's statement was not carried out; the next pass tries again");
            }
        });
    }
}

/// Runs the request's statement in the actor's mailbox (activating the
/// actor here when nobody holds it), then writes its result and removes
/// the request. A request whose outcome is not known is left for the next
/// pass: run again, it finds its recorded result if it committed.
async fn carry_out(node: &Arc<Node>, actor: &ActorId, request: &str, key: &str) -> Result<()> {
    let statement = match node.bucket.get(key).await {
        Ok(object) => match String::from_utf8(object.bytes.to_vec()) {
            Ok(text) => refused(&text).map_or(Ok(text), Err),
            Err(_) => Err("the statement is not UTF-8".to_owned()),
        },
        // Carried out and removed since the listing.
        Err(wasmkeep_bucket::Error::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let result = match statement {
        Err(why) => serde_json::json!({ "error": why }).to_string(),
        Ok(statement) => {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let job = Job::Sql {
                request: request.to_owned(),
                statement,
                reply,
                started: tokio::time::Instant::now(),
            };
            match node.send_event(actor, job).await {
                Ok(()) => {}
                // Its holder carries it out at its own pass.
                Err(Error::HeldElsewhere { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
            let waited = node.config.limits.event_time_max * 2;
            match tokio::time::timeout(waited, answer).await {
                Ok(Ok(Ok(response))) => String::from_utf8_lossy(&response.body).into_owned(),
                // SQLite refused the statement: nothing was written.
                Ok(Ok(Err(Error::BadRequest(message)))) => {
                    serde_json::json!({ "error": message }).to_string()
                }
                Ok(Ok(Err(e))) => return Err(e),
                Ok(Err(_)) => return Err(Error::unavailable("the actor left before it answered")),
                Err(_) => return Err(Error::unavailable("the statement did not answer in time")),
            }
        }
    };
    node.bucket
        .put(
            &node.keys.sql_result_key(actor, request)?,
            bytes::Bytes::from(result),
        )
        .await?;
    node.bucket.delete(key).await?;
    tracing::info!(%actor, %request, "an operator's statement was carried out");
    Ok(())
}
