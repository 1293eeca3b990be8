//! Replacing an actor's data: deleting it (ADR 0055) or importing a
//! database in its place (ADR 0069), by whoever holds its ownership record:
//! its mailbox at hand-over, or a pass over the requests for an unheld
//! actor. Never decides whether the actor's data is to be replaced: the
//! caller has the request and the record.

use wasmkeep_store::Image;
use wasmkeep_types::ActorId;

use crate::Result;
use crate::node::Node;

/// Puts `image` in place of the actor's database so that no former holder
/// can add to it ([`wasmkeep_store::replace`]: the snapshot and the log
/// record that fences stay, with what they replaced while the class's
/// retention window keeps it; [`Image::empty`] deletes, and keeps nothing),
/// then puts its alarm index in line with the image's alarm and arms the
/// timer for it. The caller holds the actor's ownership record, and
/// nothing of its store writes any more.
pub(crate) async fn replace_data(node: &Node, actor: &ActorId, image: &Image) -> Result<()> {
    let writer = wasmkeep_store::WriterId {
        node: node.node_id.to_string(),
        incarnation: node.peering.lease.incarnation(),
    };
    if image.db_pages() == 0 && wasmkeep_cluster::planted::erase_frees_numbers() {
        for listed in
            wasmkeep_bucket::hinted::list_keys(&*node.bucket, &node.keys.actor_prefix(actor))
                .await?
        {
            node.bucket.delete(&listed.key).await?;
        }
    } else {
        let config = node.store_config(&actor.class);
        // A delete leaves nothing to restore; an import keeps what it
        // replaced within the class's retention window (ADR 0076).
        let replaced = if image.db_pages() == 0 {
            wasmkeep_store::erase(&*node.bucket, &node.keys, actor, &writer, &config).await
        } else {
            wasmkeep_store::replace(&*node.bucket, &node.keys, actor, &writer, &config, image).await
        };
        replaced.map_err(|e| crate::Error::Store(e.to_string()))?;
    }
    let index = node.keys.alarm(actor);
    node.timer.clear(actor);
    match image.alarm_ms() {
        Some(at_ms) => {
            node.bucket
                .put(&index, bytes::Bytes::from(at_ms.to_string()))
                .await?;
            // Fired here, it activates the actor (after this release).
            node.timer.set_if_absent(actor.clone(), at_ms);
        }
        None => node.bucket.delete(&index).await?,
    }
    Ok(())
}
