//! Owner hints: "actor X is owned by node N", kept at most [`HINT_TTL`].
//!
//! A hint saves a bucket read per forwarded event. It is only a guess: the
//! node it names answers for itself (it forwards or claims), so a stale hint
//! costs one extra hop, never correctness.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use wasmkeep_types::{ActorId, NodeId};

use crate::Clock;

/// How long a hint is believed.
pub const HINT_TTL: Duration = Duration::from_secs(1);
/// Most hints kept; past this the oldest are dropped.
pub const HINTS_MAX: usize = 100_000;

#[derive(Debug)]
pub struct Hints {
    clock: Arc<dyn Clock>,
    map: Mutex<HashMap<ActorId, (NodeId, Instant)>>,
}

impl Hints {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn learn(&self, actor: &ActorId, owner: &NodeId) {
        let now = self.clock.now();
        let mut map = self.map.lock();
        if map.len() >= HINTS_MAX {
            map.retain(|_, (_, at)| now.duration_since(*at) < HINT_TTL);
            if map.len() >= HINTS_MAX {
                // Still full of fresh hints: forgetting some only costs reads.
                map.clear();
            }
        }
        map.insert(actor.clone(), (owner.clone(), now));
    }

    /// The owner learned at most [`HINT_TTL`] ago, if any.
    pub fn get(&self, actor: &ActorId) -> Option<NodeId> {
        let now = self.clock.now();
        let mut map = self.map.lock();
        match map.get(actor) {
            Some((node, at)) if now.duration_since(*at) < HINT_TTL => Some(node.clone()),
            Some(_) => {
                map.remove(actor);
                None
            }
            None => None,
        }
    }

    pub fn forget(&self, actor: &ActorId) {
        self.map.lock().remove(actor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SystemClock;

    #[tokio::test(start_paused = true)]
    async fn hints_expire_after_one_second() {
        let hints = Hints::new(Arc::new(SystemClock));
        let actor = ActorId::parse("t/c/a").unwrap();
        let node = NodeId::new("n2").unwrap();
        hints.learn(&actor, &node);
        assert_eq!(hints.get(&actor), Some(node));
        tokio::time::advance(HINT_TTL).await;
        assert_eq!(hints.get(&actor), None);
    }

    #[tokio::test(start_paused = true)]
    async fn forgotten_hint_is_gone() {
        let hints = Hints::new(Arc::new(SystemClock));
        let actor = ActorId::parse("t/c/a").unwrap();
        hints.learn(&actor, &NodeId::new("n2").unwrap());
        hints.forget(&actor);
        assert_eq!(hints.get(&actor), None);
    }
}
