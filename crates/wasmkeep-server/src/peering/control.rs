//! What the passes over `control/` (moves, deletes, imports, operators'
//! SQL) share: the removal of a key none of them can read, and one task
//! per request carried out.

use std::sync::Arc;

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

/// Carries out the request `key` in a task of its own (`work`), unless a
/// task of this node is carrying it out already: a pass does not wait for
/// a request, and the next pass must not start it twice.
pub(crate) fn spawn_once<F>(node: &Arc<Node>, key: String, work: impl FnOnce(Arc<Node>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if !node.peering.operator_running.lock().insert(key.clone()) {
        return;
    }
    let work = work(Arc::clone(node));
    let node = Arc::clone(node);
    tokio::spawn(async move {
        work.await;
        node.peering.operator_running.lock().remove(&key);
    });
}
