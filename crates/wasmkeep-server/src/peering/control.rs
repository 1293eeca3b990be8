//! What the passes over `control/` (moves, deletes, operators' SQL)
//! share: the removal of a key none of them can read.

use crate::node::Node;

/// A control key that does not parse names nothing a pass could carry
/// out: it is removed (a failed removal is tried again at the next pass).
pub(crate) async fn remove_unparsed(node: &Node, key: &str, error: &wasmkeep_types::Error) {
    tracing::warn!(%key, %error, "a control key does not parse; removing it");
    match node.bucket.delete(key).await {
        Ok(()) | Err(wasmkeep_bucket::Error::NotFound { .. }) => {}
        Err(e) => tracing::warn!(%key, error = %e, "removing the control key failed"),
    }
}
