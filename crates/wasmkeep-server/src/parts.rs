//! The node's long-running parts, all of one shape: a type that implements
//! [`Part`] (its name, whether the node needs it, and `run(shutdown)`),
//! started by [`Parts::spawn`]. A part that panics is contained there: the
//! panic is logged with the part's name, counted
//! (`wasmkeep_part_panics_total`), and a part the node needs turns its
//! health answer into 503 naming the part, so an orchestrator restarts the
//! process instead of leaving, say, a node whose lease is no longer renewed.
//!
//! Never restarts a part: a panic is a bug whose state is unknown, and a
//! process restart is the one recovery every part already survives.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::ops::metrics::Metrics;

/// One long-running part of the node.
pub(crate) trait Part: Send + 'static {
    /// The part's name in logs, metrics and the health answer.
    const NAME: &'static str;
    /// Whether the node cannot serve without it: its stop turns the
    /// node's health answer into 503.
    const NEEDED: bool;
    /// Runs until `shutdown` turns true (or the part's own end condition).
    fn run(self, shutdown: watch::Receiver<bool>) -> impl Future<Output = ()> + Send;
}

/// How a part stopped before the node shut down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Its `run` returned while the node was not shutting down.
    Ended,
    /// It panicked, with this message.
    Panicked(String),
}

/// The parts of one node: which stopped, and how.
#[derive(Debug)]
pub struct Parts {
    metrics: Arc<Metrics>,
    stopped: Mutex<BTreeMap<&'static str, (bool, Stopped)>>,
}

impl Parts {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            stopped: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts `part` on its own task, its panic contained.
    pub(crate) fn spawn<P: Part>(
        self: &Arc<Self>,
        part: P,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let parts = Arc::clone(self);
        let ending = shutdown.clone();
        tokio::spawn(async move {
            match AssertUnwindSafe(part.run(shutdown)).catch_unwind().await {
                Ok(()) if *ending.borrow() => {}
                Ok(()) => parts.stop(P::NAME, P::NEEDED, Stopped::Ended),
                Err(panic) => {
                    parts.metrics.part_panics.inc();
                    parts.stop(P::NAME, P::NEEDED, Stopped::Panicked(panic_text(&*panic)));
                }
            }
        })
    }

    fn stop(&self, name: &'static str, needed: bool, how: Stopped) {
        match &how {
            Stopped::Ended => {
                tracing::error!(
                    part = name,
                    needed,
                    "a part of the node ended before the node stopped (a wasmkeep bug)"
                );
            }
            Stopped::Panicked(what) => {
                tracing::error!(part = name, needed, panic = %what, "a part of the node panicked and stopped (a wasmkeep bug)");
            }
        }
        self.stopped.lock().insert(name, (needed, how));
    }

    /// Why the node is unhealthy: the needed parts that stopped, as one
    /// sentence; `None` while every needed part runs.
    pub fn unhealthy(&self) -> Option<String> {
        let stopped = self.stopped.lock();
        let needed: Vec<String> = stopped
            .iter()
            .filter(|(_, (needed, _))| *needed)
            .map(|(name, (_, how))| match how {
                Stopped::Ended => format!("{name} ended"),
                Stopped::Panicked(what) => format!("{name} panicked: {what}"),
            })
            .collect();
        (!needed.is_empty())
            .then(|| format!("a part the node needs stopped ({})", needed.join("; ")))
    }

    /// How the part named `name` stopped, if it did.
    pub fn stopped(&self, name: &str) -> Option<Stopped> {
        self.stopped.lock().get(name).map(|(_, how)| how.clone())
    }
}

/// A panic's message, where it has one.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;
    impl Part for Panics {
        const NAME: &'static str = "panics";
        const NEEDED: bool = true;
        #[allow(clippy::manual_async_fn)] // the trait's shape: `impl Future + Send`
        fn run(self, _shutdown: watch::Receiver<bool>) -> impl Future<Output = ()> + Send {
            async { panic!("planted in a test") }
        }
    }

    struct Optional;
    impl Part for Optional {
        const NAME: &'static str = "optional";
        const NEEDED: bool = false;
        #[allow(clippy::manual_async_fn)] // the trait's shape: `impl Future + Send`
        fn run(self, _shutdown: watch::Receiver<bool>) -> impl Future<Output = ()> + Send {
            async {}
        }
    }

    struct UntilShutdown;
    impl Part for UntilShutdown {
        const NAME: &'static str = "until-shutdown";
        const NEEDED: bool = true;
        #[allow(clippy::manual_async_fn)] // the trait's shape: `impl Future + Send`
        fn run(self, mut shutdown: watch::Receiver<bool>) -> impl Future<Output = ()> + Send {
            async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            }
        }
    }

    #[tokio::test]
    async fn a_needed_part_that_panics_is_counted_and_makes_the_node_unhealthy() {
        let metrics = Arc::new(Metrics::default());
        let parts = Arc::new(Parts::new(Arc::clone(&metrics)));
        let (_shutdown_tx, shutdown) = watch::channel(false);
        assert_eq!(parts.unhealthy(), None);
        parts
            .spawn(Panics, shutdown)
            .await
            .expect("the panic is contained in the part's task");
        assert_eq!(metrics.part_panics.get(), 1);
        assert_eq!(
            parts.stopped("panics"),
            Some(Stopped::Panicked("planted in a test".into()))
        );
        let why = parts.unhealthy().expect("a needed part stopped");
        assert!(why.contains("panics panicked: planted in a test"), "{why}");
    }

    #[tokio::test]
    async fn a_part_the_node_does_not_need_ends_without_making_it_unhealthy() {
        let parts = Arc::new(Parts::new(Arc::new(Metrics::default())));
        let (_shutdown_tx, shutdown) = watch::channel(false);
        parts.spawn(Optional, shutdown).await.expect("ends");
        assert_eq!(parts.stopped("optional"), Some(Stopped::Ended));
        assert_eq!(parts.unhealthy(), None);
    }

    #[tokio::test]
    async fn a_part_that_ends_at_shutdown_has_not_stopped_early() {
        let parts = Arc::new(Parts::new(Arc::new(Metrics::default())));
        let (shutdown_tx, shutdown) = watch::channel(false);
        let task = parts.spawn(UntilShutdown, shutdown);
        shutdown_tx.send(true).expect("the part listens");
        task.await.expect("ends");
        assert_eq!(parts.stopped("until-shutdown"), None);
        assert_eq!(parts.unhealthy(), None);
    }
}
