//! Deployed classes: `deploy` stores a validated component in the bucket,
//! and every node polls the `current` keys to load new versions. A resident
//! actor switches to a new version at its next event boundary.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Fenced, Outcome};
use wasmkeep_runtime::Runtime;
use wasmkeep_types::outbound::AllowList;
use wasmkeep_types::{ClassName, Keys};

use crate::actor::guest::{GuestClass, GuestEngine, WasmtimeEngine};
use crate::ops::metrics::Metrics;
use crate::{Error, Result};

/// Longest `current` record read: a digest, a few limits and an
/// allow-list of up to 64 entries.
const CURRENT_BYTES_MAX: usize = 32 << 10;

/// A class's database maximum when its deploy names none: as Durable
/// Objects allow (ADR 0064).
pub const DATABASE_BYTES_MAX_DEFAULT: u64 = 10 << 30;

/// Smallest database maximum a deploy may set: a database of a few tables.
pub const DATABASE_BYTES_MIN: u64 = 64 << 10;

/// How far back a class's actors can be restored when its deploy names no
/// window (ADR 0076).
pub const RETENTION_DEFAULT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Longest retention window a deploy may set: a year.
pub const RETENTION_MAX: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

/// What a class's deploy says about each of its actors (ADR 0064, 0066).
/// Kept in the class's `current` record with the version's digest, so a
/// node reads both at once, and a deploy changes both at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassLimits {
    /// Largest database of one actor of the class.
    pub database_bytes_max: u64,
    /// Where its actors may send HTTP requests; empty: nowhere.
    pub allow_outbound: Arc<AllowList>,
    /// How far back its actors' data can be restored (ADR 0076); zero:
    /// only the present is kept.
    pub retention: std::time::Duration,
}

impl Default for ClassLimits {
    fn default() -> Self {
        Self {
            database_bytes_max: DATABASE_BYTES_MAX_DEFAULT,
            allow_outbound: Arc::new(AllowList::default()),
            retention: RETENTION_DEFAULT,
        }
    }
}

impl ClassLimits {
    /// Limits as a deploy asks for them; `None` takes the default.
    pub fn new(database_bytes_max: Option<u64>) -> Result<Self> {
        let database_bytes_max = database_bytes_max.unwrap_or(DATABASE_BYTES_MAX_DEFAULT);
        if database_bytes_max < DATABASE_BYTES_MIN {
            return Err(Error::Config(format!(
                "the database maximum must be at least {DATABASE_BYTES_MIN} bytes, not {database_bytes_max}"
            )));
        }
        Ok(Self {
            database_bytes_max,
            ..Self::default()
        })
    }

    /// These limits with `retention` as the restore window; `None` keeps
    /// the default. Longer than [`RETENTION_MAX`] is refused.
    pub fn with_retention(self, retention: Option<std::time::Duration>) -> Result<Self> {
        let retention = retention.unwrap_or(RETENTION_DEFAULT);
        if retention > RETENTION_MAX {
            return Err(Error::Config(format!(
                "the retention window must be at most {} days, not {:.1}",
                RETENTION_MAX.as_secs() / 86_400,
                retention.as_secs_f64() / 86_400.0
            )));
        }
        Ok(Self { retention, ..self })
    }

    /// These limits with `allow` as the outbound allow-list.
    pub fn with_allow_outbound(self, allow: AllowList) -> Self {
        Self {
            allow_outbound: Arc::new(allow),
            ..self
        }
    }
}

/// A class's `current` record: the digest of its version on the first line,
/// then `name value` lines (`database-bytes-max N`, `retention-ms N`, one
/// `allow-outbound ENTRY` per allow-list entry). A record of the
/// digest alone (written before ADR 0064) has the default limits, one
/// without `retention-ms` (before ADR 0076) the default window; a line
/// this node does not know is left alone (a newer deploy's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    pub digest: String,
    pub limits: ClassLimits,
}

impl Current {
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "{}\ndatabase-bytes-max {}\nretention-ms {}\n",
            self.digest,
            self.limits.database_bytes_max,
            self.limits.retention.as_millis()
        );
        for entry in self.limits.allow_outbound.entries() {
            text.push_str(&format!("allow-outbound {entry}\n"));
        }
        text
    }

    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        if bytes.len() > CURRENT_BYTES_MAX {
            return Err(format!(
                "{} bytes, more than {CURRENT_BYTES_MAX}",
                bytes.len()
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        let mut lines = text.lines();
        let digest = lines.next().unwrap_or("").trim().to_owned();
        if digest.is_empty() || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{digest:?} is not a digest"));
        }
        let mut database_bytes_max = None;
        let mut retention = None;
        let mut allow = Vec::new();
        for line in lines.map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once(' ') {
                Some(("database-bytes-max", value)) => {
                    let bytes = value
                        .trim()
                        .parse()
                        .map_err(|_| format!("database-bytes-max {value:?} is not a number"))?;
                    database_bytes_max = Some(bytes);
                }
                Some(("retention-ms", value)) => {
                    let ms: u64 = value
                        .trim()
                        .parse()
                        .map_err(|_| format!("retention-ms {value:?} is not a number"))?;
                    retention = Some(std::time::Duration::from_millis(ms));
                }
                Some(("allow-outbound", entry)) => allow.push(entry.trim()),
                _ => {}
            }
        }
        let allow = AllowList::parse(allow).map_err(|e| e.to_string())?;
        let limits = ClassLimits::new(database_bytes_max)
            .and_then(|limits| limits.with_retention(retention))
            .map_err(|e| e.to_string())?
            .with_allow_outbound(allow);
        Ok(Self { digest, limits })
    }
}

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
    /// Each deployed class's limits, as its `current` record says.
    limits: RwLock<HashMap<ClassName, ClassLimits>>,
}

impl Classes {
    pub(crate) fn new(engine: Arc<dyn GuestEngine>, served: Option<Vec<ClassName>>) -> Self {
        Self {
            engine,
            served,
            loaded: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            limits: RwLock::new(HashMap::new()),
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

    /// What the class's deploy says about each of its actors (the default
    /// for a class this node has not read).
    pub fn limits(&self, class: &ClassName) -> ClassLimits {
        self.limits.read().get(class).cloned().unwrap_or_default()
    }

    /// The class's outbound allow-list (empty for a class this node has
    /// not read): asked at each outbound request, so a redeploy applies to
    /// the next one.
    pub fn allow_outbound(&self, class: &ClassName) -> Arc<AllowList> {
        self.limits
            .read()
            .get(class)
            .map(|limits| Arc::clone(&limits.allow_outbound))
            .unwrap_or_default()
    }

    /// Whether a version of the class is loaded and served here.
    pub(crate) fn is_loaded(&self, class: &ClassName) -> bool {
        self.serves(class) && self.loaded.read().contains_key(class)
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
    limits: ClassLimits,
    runtime: &Runtime,
) -> Result<String> {
    deploy_with(
        bucket,
        keys,
        class,
        bytes,
        limits,
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
    limits: ClassLimits,
    engine: &dyn GuestEngine,
) -> Result<String> {
    // The digest every engine gives a class version (`GuestClass::digest`).
    let digest = hex::encode(Sha256::digest(&bytes));
    let wanted = Current {
        digest: digest.clone(),
        limits,
    };
    if current(bucket, keys, class).await?.as_ref() == Some(&wanted)
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
        .put(&keys.class_current(class), Bytes::from(wanted.to_text()))
        .await?;
    Ok(digest)
}

/// Every deployed class's `current` record, by class name; a record that
/// does not parse is given with why.
pub async fn list(
    bucket: &dyn Bucket,
    keys: &Keys,
) -> Result<Vec<(ClassName, std::result::Result<Current, String>)>> {
    let mut found = Vec::new();
    for meta in bucket.list(&keys.classes_prefix()).await? {
        let Some(class) = keys.parse_class_current_key(&meta.key) else {
            continue;
        };
        match bucket.get(&meta.key).await {
            Ok(object) => found.push((class, Current::parse(&object.bytes))),
            Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// A class's `current` record; `None` when it has none, or one that does
/// not parse (a deploy writes it anew).
pub async fn current(
    bucket: &dyn Bucket,
    keys: &Keys,
    class: &ClassName,
) -> Result<Option<Current>> {
    match bucket.get(&keys.class_current(class)).await {
        Ok(object) => Ok(Current::parse(&object.bytes).ok()),
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
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
            let current = match Current::parse(&object.bytes) {
                Ok(current) => current,
                Err(why) => {
                    tracing::error!(%class, key = %meta.key, why, "the class's current record does not parse; its loaded version and limits stay");
                    continue;
                }
            };
            if self.limits(&class) != current.limits {
                self.limits.write().insert(class.clone(), current.limits);
            }
            if self.digest(&class).as_deref() == Some(current.digest.as_str()) {
                continue;
            }
            changed.push((class, current.digest));
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
                    metrics.class_loads.inc();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_current_record_carries_the_digest_and_the_limits_and_refuses_bad_ones() {
        let current = Current {
            digest: "ab12".into(),
            limits: ClassLimits::new(Some(1 << 20)).expect("above the floor"),
        };
        assert_eq!(
            current.to_text(),
            "ab12\ndatabase-bytes-max 1048576\nretention-ms 604800000\n"
        );
        assert_eq!(Current::parse(current.to_text().as_bytes()), Ok(current));
        let none_kept = Current::parse(b"ab12\nretention-ms 0\n").map(|c| c.limits.retention);
        assert_eq!(none_kept, Ok(std::time::Duration::ZERO));
        // Before ADR 0064 the record was the digest alone.
        assert_eq!(
            Current::parse(b"ab12\n").map(|c| c.limits),
            Ok(ClassLimits::default())
        );
        // A line of a newer deploy is left alone.
        assert_eq!(
            Current::parse(b"ab12\nsomething-new 7\ndatabase-bytes-max 65536\n")
                .map(|c| c.limits.database_bytes_max),
            Ok(65536)
        );
        for bad in [
            &b"ab12\ndatabase-bytes-max lots\n"[..],
            b"ab12\ndatabase-bytes-max 100\n",
            b"ab12\nretention-ms soon\n",
            b"ab12\nretention-ms 99999999999999\n",
            b"not a digest\n",
            b"",
            &[0xff, 0xfe],
        ] {
            assert!(Current::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Current::parse(&vec![b'a'; CURRENT_BYTES_MAX + 1]).is_err());
        assert!(Current::parse(b"ab12\nallow-outbound https://x\n").is_err());
        assert!(ClassLimits::new(Some(DATABASE_BYTES_MIN - 1)).is_err());
    }

    #[test]
    fn a_current_record_carries_the_allow_list_one_entry_per_line() {
        let allow = AllowList::parse(["api.example.com", "*.hooks.example.org:*", "10.0.0.0/8"])
            .expect("valid entries");
        let current = Current {
            digest: "ab12".into(),
            limits: ClassLimits::default().with_allow_outbound(allow),
        };
        assert_eq!(
            current.to_text(),
            "ab12\ndatabase-bytes-max 10737418240\nretention-ms 604800000\nallow-outbound api.example.com\n\
             allow-outbound *.hooks.example.org:*\nallow-outbound 10.0.0.0/8\n"
        );
        assert_eq!(Current::parse(current.to_text().as_bytes()), Ok(current));
        // Before ADR 0066 there was no such line: nothing is allowed.
        assert!(
            Current::parse(b"ab12\ndatabase-bytes-max 65536\n")
                .expect("parses")
                .limits
                .allow_outbound
                .is_empty()
        );
    }
}
