//! The guest runtime as the node sees it: an engine that loads classes, a
//! class that instantiates actors, an instance that runs events. The node
//! reaches guests only through these traits, so the simulation (sim/) runs
//! the node's real code with a small built-in actor instead of wasmtime.
//! [`WasmtimeEngine`] is the production adapter over `wasmkeep-runtime`.

use std::any::Any;
use std::sync::Arc;

use wasmkeep_runtime::{
    ActorHost, ActorInstance, ClassComponent, EventError, Message, Request, Response, Runtime,
};
use wasmkeep_types::ActorId;

use crate::{Error, Result};

/// Loads classes from their bytes.
#[async_trait::async_trait]
pub trait GuestEngine: Send + Sync + 'static {
    /// Validates and compiles (or finds in a cache) one class version. A
    /// refused component is `Error::Component` with the reason.
    async fn load(&self, bytes: Vec<u8>) -> Result<Arc<dyn GuestClass>>;
}

/// One loaded class version. Cheap to share.
#[async_trait::async_trait]
pub trait GuestClass: Send + Sync + 'static {
    /// SHA-256 (hex) of the component's bytes.
    fn digest(&self) -> &str;
    /// True when nothing had to be compiled.
    fn was_cached(&self) -> bool;
    /// A live instance for `id`, owning the node's host for it.
    async fn instantiate(
        &self,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> Result<Box<dyn GuestInstance>>;
    /// Lets an engine's instance downcast a class of its own engine.
    fn as_any(&self) -> &dyn Any;
}

/// One actor's instance; events run one at a time (`&mut self`).
#[async_trait::async_trait]
pub trait GuestInstance: Send + 'static {
    /// The node's per-actor host state.
    fn host(&mut self) -> &mut dyn ActorHost;
    /// The class version events run on from the next event on.
    fn set_component(&mut self, class: Arc<dyn GuestClass>);
    /// Frees the guest's memory but keeps the host.
    fn unload(&mut self);
    fn is_loaded(&self) -> bool;
    fn component_digest(&self) -> &str;
    async fn handle(&mut self, request: Request) -> std::result::Result<Response, EventError>;
    async fn alarm(
        &mut self,
        scheduled_ms: i64,
        retry_count: u32,
    ) -> std::result::Result<std::result::Result<(), String>, EventError>;
    async fn socket_message(
        &mut self,
        id: u64,
        message: Message,
    ) -> std::result::Result<(), EventError>;
    async fn socket_close(
        &mut self,
        id: u64,
        code: u16,
        reason: String,
    ) -> std::result::Result<(), EventError>;
}

/// The production engine: wasmtime through `wasmkeep-runtime`.
#[derive(Clone)]
pub struct WasmtimeEngine {
    runtime: Runtime,
}

impl WasmtimeEngine {
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

#[async_trait::async_trait]
impl GuestEngine for WasmtimeEngine {
    async fn load(&self, bytes: Vec<u8>) -> Result<Arc<dyn GuestClass>> {
        let runtime = self.runtime.clone();
        // Compiling takes long: off the async threads.
        let component = tokio::task::spawn_blocking(move || runtime.load_component(&bytes))
            .await
            .map_err(|e| Error::Runtime(format!("compile task failed: {e}")))?
            .map_err(|e| Error::Component(e.to_string()))?;
        Ok(Arc::new(WasmtimeClass(component)))
    }
}

struct WasmtimeClass(ClassComponent);

#[async_trait::async_trait]
impl GuestClass for WasmtimeClass {
    fn digest(&self) -> &str {
        self.0.digest()
    }

    fn was_cached(&self) -> bool {
        self.0.from_cache()
    }

    async fn instantiate(
        &self,
        id: ActorId,
        host: Box<dyn ActorHost>,
    ) -> Result<Box<dyn GuestInstance>> {
        let instance = self
            .0
            .instantiate(id, host)
            .await
            .map_err(|e| Error::Runtime(e.to_string()))?;
        Ok(Box::new(WasmtimeInstance(instance)))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct WasmtimeInstance(ActorInstance);

#[async_trait::async_trait]
impl GuestInstance for WasmtimeInstance {
    fn host(&mut self) -> &mut dyn ActorHost {
        self.0.host()
    }

    fn set_component(&mut self, class: Arc<dyn GuestClass>) {
        match class.as_any().downcast_ref::<WasmtimeClass>() {
            Some(class) => self.0.set_component(class.0.clone()),
            None => tracing::error!("a class of another engine was given to a wasmtime instance"),
        }
    }

    fn unload(&mut self) {
        self.0.unload();
    }

    fn is_loaded(&self) -> bool {
        self.0.is_loaded()
    }

    fn component_digest(&self) -> &str {
        self.0.component_digest()
    }

    async fn handle(&mut self, request: Request) -> std::result::Result<Response, EventError> {
        self.0.handle(request).await
    }

    async fn alarm(
        &mut self,
        scheduled_ms: i64,
        retry_count: u32,
    ) -> std::result::Result<std::result::Result<(), String>, EventError> {
        self.0.alarm(scheduled_ms, retry_count).await
    }

    async fn socket_message(
        &mut self,
        id: u64,
        message: Message,
    ) -> std::result::Result<(), EventError> {
        self.0.socket_message(id, message).await
    }

    async fn socket_close(
        &mut self,
        id: u64,
        code: u16,
        reason: String,
    ) -> std::result::Result<(), EventError> {
        self.0.socket_close(id, code, reason).await
    }
}
