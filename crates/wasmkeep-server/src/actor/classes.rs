//! Deployed classes: `deploy` stores a validated component in the bucket,
//! and every node polls the `current` keys to load new versions. A resident
//! actor switches to a new version at its next event boundary.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::{Mutex, RwLock};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Fenced, Outcome};
use wasmkeep_runtime::Runtime;
use wasmkeep_types::{ClassName, Keys};

use crate::actor::guest::{GuestClass, GuestEngine, WasmtimeEngine};
use crate::ops::metrics::Metrics;
use crate::{Error, Result};

/// Longest digest text read from a `current` key.
const DIGEST_BYTES_MAX: usize = 128;

/// Retry-After for a request to a class still compiling here: a Rust
/// component compiles in about a second, a JavaScript one in ~16 s.
const CLASS_LOADING_RETRY_AFTER_S: u32 = 2;

/// A deployed class with no version loaded on this node.
#[derive(Debug, Clone)]
enum ClassPending {
    Loading,
    /// Its last load failed, for this reason; the next poll tries again.
    Failed(String),
}

/// The classes this node serves and the version of each loaded here. A
/// handle of the node; [`Classes::poll`] keeps it up to date with the
/// bucket's `current` keys.
pub struct Classes {
    /// Loads classes and runs guests (wasmtime, or the simulation's actor).
    engine: Arc<dyn GuestEngine>,
    /// `--classes`: the only classes served here; `None`: every class.
    served: Option<Vec<ClassName>>,
    loaded: RwLock<HashMap<ClassName, Arc<dyn GuestClass>>>,
    /// Deployed classes with no version loaded here yet, being loaded or
    /// failed to load: their requests are asked to retry, not told the
    /// class does not exist.
    pending: Mutex<HashMap<ClassName, ClassPending>>,
}

impl Classes {
    pub(crate) fn new(engine: Arc<dyn GuestEngine>, served: Option<Vec<ClassName>>) -> Self {
        Self {
            engine,
            served,
            loaded: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// The engine that loads classes and runs guests.
    pub fn engine(&self) -> &Arc<dyn GuestEngine> {
        &self.engine
    }

    /// Whether this node serves `class` (`--classes`).
    pub fn serves(&self, class: &ClassName) -> bool {
        self.served.as_ref().is_none_or(|list| list.contains(class))
    }

    /// The class's loaded version; "unknown class" when it is not served
    /// here or not deployed, "retry" while its first version loads here.
    pub fn get(&self, class: &ClassName) -> Result<Arc<dyn GuestClass>> {
        if !self.serves(class) {
            return Err(Error::UnknownClass(class.to_string()));
        }
        if let Some(component) = self.loaded.read().get(class) {
            return Ok(Arc::clone(component));
        }
        let reason = match self.pending.lock().get(class) {
            None => return Err(Error::UnknownClass(class.to_string())),
            Some(ClassPending::Loading) => {
                format!("class {class} was just deployed and is being compiled here")
            }
            Some(ClassPending::Failed(why)) => format!(
                "class {class} is deployed but did not load on this node ({why}); it is tried again every heartbeat period"
            ),
        };
        Err(Error::Unavailable {
            reason,
            retry_after_s: CLASS_LOADING_RETRY_AFTER_S,
        })
    }

    /// Notes where the load of `class`'s first version here stands; `None`
    /// once a version is loaded.
    fn set_pending(&self, class: &ClassName, pending: Option<ClassPending>) {
        let mut map = self.pending.lock();
        match pending {
            Some(pending) => {
                map.insert(class.clone(), pending);
            }
            None => {
                map.remove(class);
            }
        }
    }

    /// The digest of the class's loaded version.
    pub(crate) fn digest(&self, class: &ClassName) -> Option<String> {
        self.loaded.read().get(class).map(|c| c.digest().to_owned())
    }

    /// Makes `component` the class's loaded version.
    pub(crate) fn set(&self, class: ClassName, component: Arc<dyn GuestClass>) {
        self.loaded.write().insert(class, component);
    }

    /// The classes this node has loaded and serves.
    pub(crate) fn loaded(&self) -> Vec<ClassName> {
        self.loaded
            .read()
            .keys()
            .filter(|c| self.serves(c))
            .cloned()
            .collect()
    }
}

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

impl Classes {
    /// Loads every class whose current version differs from the loaded one.
    /// A class that fails to load keeps serving its previous version. The
    /// loads run side by side, one per core (each deserializes or compiles on a
    /// blocking thread), and each class serves its new version as soon as that
    /// one is loaded: a slow compile holds back no other class. A class with no
    /// version here yet answers "retry" while it loads, or after its load
    /// failed (the next poll tries again), not "unknown class". A starting node
    /// serves once all are loaded.
    pub(crate) async fn poll(
        &self,
        bucket: &dyn Bucket,
        keys: &Keys,
        metrics: &Metrics,
    ) -> Result<()> {
        let metas = bucket.list(&keys.classes_prefix()).await?;
        let mut changed = Vec::new();
        for meta in metas {
            let Some(class) = keys.parse_class_current_key(&meta.key) else {
                continue;
            };
            if !self.serves(&class) {
                continue;
            }
            let object = match bucket.get(&meta.key).await {
                Ok(object) => object,
                Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let digest = digest_text(&object.bytes);
            if self.digest(&class).as_deref() == Some(digest.as_str()) {
                continue;
            }
            changed.push((class, digest));
        }
        for (class, _) in &changed {
            if self.digest(class).is_none() {
                self.set_pending(class, Some(ClassPending::Loading));
            }
        }
        // As many at once as there are cores: a first start compiles every
        // class, and each compile holds its own working memory.
        let side_by_side = std::thread::available_parallelism().map_or(1, usize::from);
        let mut loads =
            futures::stream::iter(changed.into_iter().map(|(class, digest)| async move {
                let loaded = load(bucket, keys, &*self.engine, &class, &digest).await;
                (class, digest, loaded)
            }))
            .buffer_unordered(side_by_side);
        while let Some((class, digest, loaded)) = loads.next().await {
            match loaded {
                Ok(component) => {
                    tracing::info!(%class, %digest, from_cache = component.was_cached(), "class version loaded");
                    metrics.class_loads.fetch_add(1, Ordering::Relaxed);
                    self.set(class.clone(), component);
                    self.set_pending(&class, None);
                }
                Err(e) => {
                    tracing::error!(%class, %digest, error = %e, "class version not loaded; the previous one keeps serving");
                    if self.digest(&class).is_none() {
                        self.set_pending(&class, Some(ClassPending::Failed(e.to_string())));
                    }
                }
            }
        }
        Ok(())
    }
}
