//! Peers: every node of the app as seen through heartbeats.
//!
//! A refresh lists the heartbeat prefix once and reads only heartbeats whose
//! etag changed, so its cost grows with the number of nodes, never with the
//! number of actors. A peer whose calls fail is suspect for a while and not
//! eligible for hand-overs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use wasmkeep_bucket::Bucket;
use wasmkeep_types::heartbeat::{DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, AppName, ClassName, Keys, NodeId};

use crate::lease::LeaseObserver;
use crate::{Clock, Result};

/// How long a peer whose call failed stays suspect.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// One peer as this node sees it now.
#[derive(Debug, Clone)]
pub struct Peer {
    pub heartbeat: Heartbeat,
    /// Its lease is valid as this node judges it.
    pub live: bool,
    /// A call to it failed recently.
    pub suspect: bool,
}

impl Peer {
    /// Eligible to receive actors: live, same app, serving, not asked to
    /// drain, not suspect (reachable), serving the class.
    pub fn eligible_for(&self, app: &AppName, class: &ClassName) -> bool {
        self.live
            && !self.suspect
            && &self.heartbeat.app == app
            && self.heartbeat.state == NodeState::Serving
            && self.heartbeat.drain == DrainState::None
            && self.heartbeat.classes.serves(class)
    }
}

#[derive(Debug)]
pub struct Peers {
    bucket: Arc<dyn Bucket>,
    keys: Keys,
    app: AppName,
    me: NodeId,
    clock: Arc<dyn Clock>,
    observer: Arc<LeaseObserver>,
    suspects: Mutex<HashMap<NodeId, Instant>>,
}

impl Peers {
    pub fn new(
        bucket: Arc<dyn Bucket>,
        keys: Keys,
        app: AppName,
        me: NodeId,
        clock: Arc<dyn Clock>,
        observer: Arc<LeaseObserver>,
    ) -> Self {
        Self {
            bucket,
            keys,
            app,
            me,
            clock,
            observer,
            suspects: Mutex::new(HashMap::new()),
        }
    }

    pub fn observer(&self) -> &Arc<LeaseObserver> {
        &self.observer
    }

    /// Lists the heartbeats and reads those that changed.
    pub async fn refresh(&self) -> Result<()> {
        let start = self.clock.now();
        let listed = self.bucket.list(&self.keys.nodes_prefix()).await?;
        let mut present = Vec::with_capacity(listed.len());
        for meta in listed {
            let Ok(node) = self.keys.parse_node_key(&meta.key) else {
                tracing::warn!(
                    key = meta.key,
                    "ignoring a heartbeat key that does not parse"
                );
                continue;
            };
            present.push(node.clone());
            if !self.observer.confirm_unchanged(&node, &meta.etag, start) {
                self.observer.read(&*self.bucket, &meta.key, &node).await?;
            }
        }
        for sighting in self.observer.sightings() {
            if !present.contains(&sighting.heartbeat.node) {
                self.observer
                    .observe_missing(&sighting.heartbeat.node, start);
            }
        }
        Ok(())
    }

    pub fn mark_suspect(&self, node: &NodeId) {
        self.suspects
            .lock()
            .insert(node.clone(), self.clock.now() + SUSPECT_FOR);
    }

    fn is_suspect(&self, node: &NodeId) -> bool {
        let now = self.clock.now();
        let mut suspects = self.suspects.lock();
        match suspects.get(node) {
            Some(until) if now < *until => true,
            Some(_) => {
                suspects.remove(node);
                false
            }
            None => false,
        }
    }

    /// Every node seen, this one included.
    pub fn all(&self) -> Vec<Peer> {
        let mut peers: Vec<Peer> = self
            .observer
            .sightings()
            .into_iter()
            .map(|s| {
                let live = self.observer.live(&s.heartbeat.node).is_some();
                let suspect = self.is_suspect(&s.heartbeat.node);
                Peer {
                    heartbeat: s.heartbeat,
                    live,
                    suspect,
                }
            })
            .collect();
        peers.sort_by(|a, b| a.heartbeat.node.cmp(&b.heartbeat.node));
        peers
    }

    pub fn get(&self, node: &NodeId) -> Option<Peer> {
        self.all().into_iter().find(|p| &p.heartbeat.node == node)
    }

    /// Other nodes that may receive `class` now.
    pub fn eligible(&self, class: &ClassName) -> Vec<Peer> {
        self.all()
            .into_iter()
            .filter(|p| p.heartbeat.node != self.me && p.eligible_for(&self.app, class))
            .collect()
    }

    /// The eligible peer chosen for `actor` by rendezvous hashing, so that
    /// every draining node sends a given actor to the same place.
    pub fn choose(&self, actor: &ActorId) -> Option<Peer> {
        let candidates = self.eligible(&actor.class);
        rendezvous(actor, candidates.iter().map(|p| &p.heartbeat.node))
            .and_then(|node| candidates.into_iter().find(|p| p.heartbeat.node == node))
    }
}

/// Highest-random-weight choice of a node for an actor.
pub fn rendezvous<'a>(actor: &ActorId, nodes: impl Iterator<Item = &'a NodeId>) -> Option<NodeId> {
    let actor = actor.to_string();
    nodes
        .map(|node| {
            let mut h = Sha256::new();
            h.update(actor.as_bytes());
            h.update([0]);
            h.update(node.as_str().as_bytes());
            let digest = h.finalize();
            let mut first = [0u8; 8];
            first.copy_from_slice(&digest[..8]);
            (u64::from_be_bytes(first), node)
        })
        .max()
        .map(|(_, node)| node.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let nodes: Vec<NodeId> = ["a", "b", "c"]
            .iter()
            .map(|n| NodeId::new(*n).unwrap())
            .collect();
        let mut counts = HashMap::new();
        for i in 0..300 {
            let actor = ActorId::parse(&format!("t/c/{i}")).unwrap();
            let first = rendezvous(&actor, nodes.iter()).unwrap();
            let reversed = rendezvous(&actor, nodes.iter().rev()).unwrap();
            assert_eq!(first, reversed);
            *counts.entry(first).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|c| *c > 50), "{counts:?}");
    }

    #[test]
    fn removing_a_node_moves_only_its_actors() {
        let nodes: Vec<NodeId> = ["a", "b", "c"]
            .iter()
            .map(|n| NodeId::new(*n).unwrap())
            .collect();
        for i in 0..200 {
            let actor = ActorId::parse(&format!("t/c/{i}")).unwrap();
            let before = rendezvous(&actor, nodes.iter()).unwrap();
            let after = rendezvous(&actor, nodes.iter().filter(|n| n.as_str() != "c")).unwrap();
            if before.as_str() != "c" {
                assert_eq!(before, after);
            }
        }
    }
}
