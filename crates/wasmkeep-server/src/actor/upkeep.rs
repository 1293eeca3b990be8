//! The node's upkeep, one part (`crate::parts`) on one tick of the
//! heartbeat period: the alarm sweep (when its period has passed), the
//! class poll and the heap trim. One task rather than three: their order
//! within a tick stays fixed, so a simulation run repeats, and the sweep
//! keeps the tick's timing it always had. Never renews the lease.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::node::Node;

/// The alarm sweep, the class poll and the heap trim.
pub(crate) struct Upkeep {
    node: Arc<Node>,
}

impl Upkeep {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self { node }
    }
}

impl crate::parts::Part for Upkeep {
    const NAME: &'static str = "upkeep";
    // Without it no deployment reaches this node, and the alarms of
    // actors nobody holds never fire.
    const NEEDED: bool = true;

    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let node = self.node;
        let heap_trim = crate::ops::heap::HeapTrim::default();
        let mut next_sweep = Instant::now();
        loop {
            if Instant::now() >= next_sweep {
                if let Err(e) = node.sweep_alarms().await {
                    tracing::warn!(error = %e, "alarm sweep failed");
                }
                next_sweep = Instant::now() + node.config.alarm_sweep_period;
            }
            tokio::select! {
                // Checked in order: a run replays the same way (ADR 0006).
                biased;
                _ = tokio::time::sleep(node.config.heartbeat_period) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            if let Err(e) = node.poll_classes().await {
                tracing::warn!(error = %e, "class poll failed");
            }
            heap_trim.after_unloads(&node.metrics);
        }
    }
}
