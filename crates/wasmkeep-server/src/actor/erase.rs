//! Deleting an actor's data (ADR 0055), by whoever holds its ownership
//! record: its mailbox at hand-over, or a delete pass for an unheld actor.
//! Never decides whether the actor is to be deleted: the caller has the
//! request and the record.

use wasmkeep_types::ActorId;

use crate::Result;
use crate::node::Node;

/// Empties the actor's database so that no former holder can add to it
/// ([`wasmkeep_store::erase`]: two small objects stay, an empty snapshot
/// and the log record that fences), then deletes its alarm. The caller
/// holds the actor's ownership record, and nothing of its store writes
/// any more.
pub(crate) async fn delete_data(node: &Node, actor: &ActorId) -> Result<()> {
    let writer = wasmkeep_store::WriterId {
        node: node.node_id.to_string(),
        incarnation: node.peering.lease.incarnation(),
    };
    if wasmkeep_cluster::planted::erase_frees_numbers() {
        for listed in
            wasmkeep_bucket::hinted::list_keys(&*node.bucket, &node.keys.actor_prefix(actor))
                .await?
        {
            node.bucket.delete(&listed.key).await?;
        }
    } else {
        wasmkeep_store::erase(
            &*node.bucket,
            &node.keys,
            actor,
            &writer,
            &node.residents.store_config,
        )
        .await
        .map_err(|e| crate::Error::Store(e.to_string()))?;
    }
    node.bucket.delete(&node.keys.alarm(actor)).await?;
    node.timer.clear(actor);
    Ok(())
}
