//! Deployed classes: `deploy` stores a validated component in the bucket,
//! and every node polls the `current` keys to load new versions. A resident
//! actor switches to a new version at its next event boundary.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Fenced, Outcome};
use wasmkeep_runtime::Runtime;
use wasmkeep_types::{ClassName, Keys};

use crate::actor::guest::{GuestClass, GuestEngine, WasmtimeEngine};
use crate::node::{ClassPending, Node};
use crate::{Error, Result};

/// Longest digest text read from a `current` key.
const DIGEST_BYTES_MAX: usize = 128;

/// Validates `bytes` with the runtime, then stores them and makes them the
/// class's current version. A refused component stores nothing. Returns the digest.
pub async fn deploy(
    bucket: &dyn Bucket,
    keys: &Keys,
    class: &ClassName,
    bytes: Vec<u8>,
    runtime: &Runtime,
) -> Result<String> {
    deploy_with(
        bucket,
        keys,
        class,
        bytes,
        &WasmtimeEngine::new(runtime.clone()),
    )
    .await
}

/// [`deploy`], validating with any guest engine. Bytes that already are the
/// class's current version (validated when they were deployed) are neither
/// validated nor written again: `wasmkeep dev` deploys its bundled classes at
/// every start, and loading each component cost a restart ~3 ms.
pub async fn deploy_with(
    bucket: &dyn Bucket,
    keys: &Keys,
    class: &ClassName,
    bytes: Vec<u8>,
    engine: &dyn GuestEngine,
) -> Result<String> {
    // The digest every engine gives a class version (`GuestClass::digest`).
    let digest = hex::encode(Sha256::digest(&bytes));
    if current_digest(bucket, keys, class).await?.as_deref() == Some(digest.as_str())
        && bucket
            .head(&keys.class_component(class, &digest))
            .await
            .is_ok()
    {
        return Ok(digest);
    }
    let component = engine.load(bytes.clone()).await?;
    if component.digest() != digest {
        return Err(Error::Component(format!(
            "class {class}: the engine gave digest {}, not the bytes' {digest}",
            component.digest()
        )));
    }
    let key = keys.class_component(class, &digest);
    match Fenced::new(bucket, &key).create(Bytes::from(bytes)).await? {
        // The same bytes were deployed before: the stored copy is identical
        // (its key is their digest).
        Outcome::Done(_) | Outcome::Conflict => {}
        Outcome::Unknown(e) => return Err(e.into()),
        Outcome::Gone => return Err(wasmkeep_bucket::Error::NotFound { key }.into()),
    }
    bucket
        .put(&keys.class_current(class), Bytes::from(digest.clone()))
        .await?;
    Ok(digest)
}

/// The digest a class's `current` key names; `None` when it has none.
async fn current_digest(
    bucket: &dyn Bucket,
    keys: &Keys,
    class: &ClassName,
) -> Result<Option<String>> {
    match bucket.get(&keys.class_current(class)).await {
        Ok(object) => Ok(Some(digest_text(&object.bytes))),
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The digest in the body of a `current` key (at most [`DIGEST_BYTES_MAX`]).
fn digest_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(DIGEST_BYTES_MAX)])
        .trim()
        .to_owned()
}

/// Reads one class's current version from the bucket and compiles it (or
/// loads it from the runtime's cache).
pub async fn load(
    bucket: &dyn Bucket,
    keys: &Keys,
    engine: &dyn GuestEngine,
    class: &ClassName,
    digest: &str,
) -> Result<Arc<dyn GuestClass>> {
    let object = bucket.get(&keys.class_component(class, digest)).await?;
    let component = engine.load(object.bytes.to_vec()).await?;
    if component.digest() != digest {
        return Err(Error::Component(format!(
            "class {class}: stored component has digest {}, not {digest}",
            component.digest()
        )));
    }
    Ok(component)
}

/// Loads every class whose current version differs from the loaded one.
/// A class that fails to load keeps serving its previous version. The
/// loads run side by side, one per core (each deserializes or compiles on a
/// blocking thread), and each class serves its new version as soon as that
/// one is loaded: a slow compile holds back no other class. A class with no
/// version here yet answers "retry" while it loads, or after its load
/// failed (the next poll tries again), not "unknown class". A starting node
/// serves once all are loaded.
pub async fn poll(node: &Arc<Node>) -> Result<()> {
    let metas = node.bucket.list(&node.keys.classes_prefix()).await?;
    let mut changed = Vec::new();
    for meta in metas {
        let Some(class) = node.keys.parse_class_current_key(&meta.key) else {
            continue;
        };
        if !node.config.serves_class(&class) {
            continue;
        }
        let object = match node.bucket.get(&meta.key).await {
            Ok(object) => object,
            Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let digest = digest_text(&object.bytes);
        if node.class_digest(&class).as_deref() == Some(digest.as_str()) {
            continue;
        }
        changed.push((class, digest));
    }
    for (class, _) in &changed {
        if node.class_digest(class).is_none() {
            node.set_class_pending(class, Some(ClassPending::Loading));
        }
    }
    // As many at once as there are cores: a first start compiles every
    // class, and each compile holds its own working memory.
    let side_by_side = std::thread::available_parallelism().map_or(1, usize::from);
    let mut loads = futures::stream::iter(changed.into_iter().map(|(class, digest)| async move {
        let loaded = load(&*node.bucket, &node.keys, &*node.guest, &class, &digest).await;
        (class, digest, loaded)
    }))
    .buffer_unordered(side_by_side);
    while let Some((class, digest, loaded)) = loads.next().await {
        match loaded {
            Ok(component) => {
                tracing::info!(%class, %digest, from_cache = component.was_cached(), "class version loaded");
                node.metrics.class_loads.fetch_add(1, Ordering::Relaxed);
                node.set_class(class.clone(), component);
                node.set_class_pending(&class, None);
            }
            Err(e) => {
                tracing::error!(%class, %digest, error = %e, "class version not loaded; the previous one keeps serving");
                if node.class_digest(&class).is_none() {
                    node.set_class_pending(&class, Some(ClassPending::Failed(e.to_string())));
                }
            }
        }
    }
    Ok(())
}
