//! Owner hints: "actor X is owned by node N", kept at most [`HINT_TTL`],
//! in the service ([`Hints`], one map per node) and in the actor's own state
//! ([`ActorHint`], one per stub).
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

/// The owner hint kept in one actor's own state (its stub): read first,
/// without the node's map lock. Empty, it allocates nothing and takes 16
/// bytes, since every resident actor carries one.
#[derive(Debug, Default)]
pub struct ActorHint(Mutex<Option<Box<(NodeId, Instant)>>>);

impl ActorHint {
    /// Remembers `owner` as learned at `now` (the node clock's time).
    pub fn learn(&self, owner: &NodeId, now: Instant) {
        *self.0.lock() = Some(Box::new((owner.clone(), now)));
    }

    /// The owner learned less than [`HINT_TTL`] before `now`, if any; an
    /// expired hint is dropped.
    pub fn get(&self, now: Instant) -> Option<NodeId> {
        let mut slot = self.0.lock();
        match slot.as_deref() {
            Some((node, at)) if now.saturating_duration_since(*at) < HINT_TTL => Some(node.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    pub fn forget(&self) {
        *self.0.lock() = None;
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
    async fn an_actor_hint_expires_after_one_second() {
        let hint = ActorHint::default();
        let node = NodeId::new("n2").unwrap();
        let learned = Instant::now();
        hint.learn(&node, learned);
        assert_eq!(hint.get(learned), Some(node.clone()));
        tokio::time::advance(HINT_TTL - Duration::from_millis(1)).await;
        assert_eq!(hint.get(Instant::now()), Some(node));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(hint.get(Instant::now()), None);
        // Dropped once expired: no allocation left behind.
        assert!(hint.0.lock().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_actor_hint_is_gone() {
        let hint = ActorHint::default();
        hint.learn(&NodeId::new("n2").unwrap(), Instant::now());
        hint.forget();
        assert_eq!(hint.get(Instant::now()), None);
    }

    #[test]
    fn an_empty_actor_hint_is_small() {
        // One per resident actor: a pointer and a lock byte, padded.
        assert!(std::mem::size_of::<ActorHint>() <= 16);
        assert!(ActorHint::default().0.lock().is_none());
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
