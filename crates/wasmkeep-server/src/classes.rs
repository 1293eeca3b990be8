//! Deployed classes: `deploy` stores a validated component in the bucket,
//! and every node polls the `current` keys to load new versions. A resident
//! actor switches to a new version at its next event boundary.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::Runtime;
use wasmkeep_types::{ClassName, Keys};

use crate::guest::{GuestClass, GuestEngine, WasmtimeEngine};
use crate::node::Node;
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

/// [`deploy`], validating with any guest engine.
pub async fn deploy_with(
    bucket: &dyn Bucket,
    keys: &Keys,
    class: &ClassName,
    bytes: Vec<u8>,
    engine: &dyn GuestEngine,
) -> Result<String> {
    let component = engine.load(bytes.clone()).await?;
    let digest = component.digest().to_owned();
    let key = keys.class_component(class, &digest);
    match bucket.put_if_absent(&key, Bytes::from(bytes)).await {
        // The same bytes were deployed before: the stored copy is identical.
        Ok(_) | Err(wasmkeep_bucket::Error::Conflict { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    bucket
        .put(&keys.class_current(class), Bytes::from(digest.clone()))
        .await?;
    Ok(digest)
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
/// A class that fails to load keeps serving its previous version.
pub async fn poll(node: &Arc<Node>) -> Result<()> {
    let metas = node.bucket.list(&node.keys.classes_prefix()).await?;
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
        let digest =
            String::from_utf8_lossy(&object.bytes[..object.bytes.len().min(DIGEST_BYTES_MAX)])
                .trim()
                .to_owned();
        if node.class_digest(&class).as_deref() == Some(digest.as_str()) {
            continue;
        }
        match load(&*node.bucket, &node.keys, &*node.guest, &class, &digest).await {
            Ok(component) => {
                tracing::info!(%class, %digest, from_cache = component.was_cached(), "class version loaded");
                node.metrics.class_loads.fetch_add(1, Ordering::Relaxed);
                node.set_class(class, component);
            }
            Err(e) => {
                tracing::error!(%class, %digest, error = %e, "class version not loaded; the previous one keeps serving")
            }
        }
    }
    Ok(())
}
