//! [`ClassComponent`]: one validated, compiled version of a class, ready to
//! instantiate; and the on-disk cache of precompiled components.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmkeep_types::ActorId;
use wasmtime::component::Component;

use crate::bindings::ActorPre;
use crate::error::Error;
use crate::host::ActorHost;
use crate::instance::ActorInstance;
use crate::runtime::{Runtime, RuntimeInner};
use crate::state::State;

/// The exports world `actor` requires.
const REQUIRED_EXPORTS: [&str; 2] = [
    "wasmkeep:actor/handler@0.1.0",
    "wasmkeep:actor/events@0.1.0",
];
/// The preamble of a core module: magic, then version 1, layer 0.
const CORE_MODULE_PREAMBLE: [u8; 8] = *b"\0asm\x01\0\0\0";
const WASM_MAGIC: [u8; 4] = *b"\0asm";

/// One version of a class, compiled and type-checked against the host. Cheap
/// to clone.
#[derive(Clone)]
pub struct ClassComponent {
    inner: Arc<ClassInner>,
}

struct ClassInner {
    digest: String,
    from_cache: bool,
    pre: ActorPre<State>,
    runtime: Arc<RuntimeInner>,
}

impl ClassComponent {
    /// SHA-256 (hex) of the component's bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// True when the precompiled cache was hit (nothing was compiled).
    pub fn from_cache(&self) -> bool {
        self.inner.from_cache
    }

    /// A live instance for actor `id`, owning the node's `host` for it.
    pub async fn instantiate(
        &self,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> Result<ActorInstance, Error> {
        ActorInstance::new(self.clone(), id, host).await
    }

    pub(crate) fn pre(&self) -> &ActorPre<State> {
        &self.inner.pre
    }

    pub(crate) fn runtime(&self) -> &Arc<RuntimeInner> {
        &self.inner.runtime
    }

    pub(crate) fn load(runtime: &Runtime, bytes: &[u8]) -> Result<Self, Error> {
        let inner = &runtime.inner;
        let digest = hex::encode(Sha256::digest(bytes));
        let cache_path = inner
            .config
            .cache_dir
            .as_ref()
            .map(|dir| dir.join(format!("{digest}-{}.cwasm", inner.engine_key)));

        if let Some(path) = &cache_path
            && path.is_file()
        {
            // SAFETY: `deserialize_file` trusts the file to be a component
            // precompiled by wasmtime. We wrote it ourselves (below, after full
            // validation), named by the SHA-256 of the source bytes and by the
            // engine's version and compatibility hash, and renamed it into
            // place only once complete; the cache directory is ours alone.
            match unsafe { Component::deserialize_file(&inner.engine, path) } {
                Ok(component) => return Self::check(inner, digest, component, true),
                Err(error) => {
                    // Stale or damaged: compile again and overwrite it.
                    tracing::warn!(path = %path.display(), error = %format!("{error:#}"), "ignoring unusable precompiled component");
                }
            }
        }

        if !bytes.starts_with(&WASM_MAGIC) {
            return Err(Error::NotWasm);
        }
        if bytes.starts_with(&CORE_MODULE_PREAMBLE) {
            return Err(Error::CoreModule);
        }
        let serialized = inner
            .engine
            .precompile_component(bytes)
            .map_err(|e| Error::Compile(format!("{e:#}")))?;
        // SAFETY: `serialized` was produced just above by this same engine.
        let component = unsafe { Component::deserialize(&inner.engine, &serialized) }
            .map_err(|e| Error::Compile(format!("{e:#}")))?;
        let class = Self::check(inner, digest, component, false)?;
        if let Some(path) = &cache_path
            && let Err(error) = write_atomically(path, &serialized)
        {
            // The cache only saves compile time; a load must not fail for it.
            tracing::warn!(%error, "could not write the precompiled component cache");
        }
        Ok(class)
    }

    /// Checks the component against world `actor` and the linker; on success
    /// it is ready to instantiate.
    fn check(
        runtime: &Arc<RuntimeInner>,
        digest: String,
        component: Component,
        from_cache: bool,
    ) -> Result<Self, Error> {
        let engine = &runtime.engine;
        let ty = component.component_type();
        let missing: Vec<&str> = REQUIRED_EXPORTS
            .into_iter()
            .filter(|name| ty.get_export(engine, name).is_none())
            .collect();
        if !missing.is_empty() {
            let exported: Vec<String> = ty
                .exports(engine)
                .map(|(name, _)| format!("`{name}`"))
                .collect();
            let exported = if exported.is_empty() {
                "nothing".to_owned()
            } else {
                exported.join(", ")
            };
            return Err(Error::WrongWorld(format!(
                "missing export(s) {}; it exports {exported}",
                missing
                    .iter()
                    .map(|name| format!("`{name}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let instance_pre = runtime
            .linker
            .instantiate_pre(&component)
            .map_err(|e| Error::Imports(format!("{e:#}")))?;
        let pre = ActorPre::new(instance_pre).map_err(|e| Error::WrongWorld(format!("{e:#}")))?;
        Ok(Self {
            inner: Arc::new(ClassInner {
                digest,
                from_cache,
                pre,
                runtime: runtime.clone(),
            }),
        })
    }
}

/// Writes `bytes` to a temporary file next to `path`, then renames it into
/// place, so a reader never sees a partial file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let cache_error = |path: &Path| {
        let path = path.to_path_buf();
        move |error| Error::Cache { path, error }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(cache_error(dir))?;
    }
    let tmp = PathBuf::from(format!(
        "{}.tmp-{}-{}",
        path.display(),
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, bytes).map_err(cache_error(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|error| {
        let _ = std::fs::remove_file(&tmp);
        Error::Cache {
            path: path.to_path_buf(),
            error,
        }
    })
}
