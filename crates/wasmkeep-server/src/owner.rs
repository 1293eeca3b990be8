//! Ownership records (`Keys::owner(actor)`): which node holds an actor.
//!
//! One node only so far: a record naming this node (any incarnation) or a
//! released record is taken over with put-if-match; a record naming another
//! node means the actor is held elsewhere. The cluster work extends
//! [`acquire`] with node leases; the record format already carries what it
//! needs (node, incarnation, a nonce so that two bodies never share an etag).

use std::sync::Arc;

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Etag};
use wasmkeep_types::{ActorId, Keys, NodeId};

use crate::{Error, Result};

const MAGIC: &str = "wasmkeep-owner 1";

/// The body of an ownership record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    pub node: String,
    pub incarnation: String,
    pub nonce: String,
    /// `held` or `released` (written instead of a delete where the bucket
    /// has no conditional delete).
    pub released: bool,
}

impl OwnerRecord {
    pub fn encode(&self) -> Bytes {
        let state = if self.released { "released" } else { "held" };
        Bytes::from(format!(
            "{MAGIC}\n{}\n{}\n{}\n{state}\n",
            self.node, self.incarnation, self.nonce
        ))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("does not start with {MAGIC:?}"));
        }
        let mut next = |what: &str| {
            lines
                .next()
                .map(str::to_owned)
                .ok_or_else(|| format!("missing {what}"))
        };
        let node = next("node")?;
        let incarnation = next("incarnation")?;
        let nonce = next("nonce")?;
        let released = match next("state")?.as_str() {
            "held" => false,
            "released" => true,
            other => return Err(format!("unknown state {other:?}")),
        };
        Ok(Self {
            node,
            incarnation,
            nonce,
            released,
        })
    }
}

/// This node's hold on one actor: the record's key and the etag we wrote.
#[derive(Debug, Clone)]
pub struct Hold {
    pub key: String,
    pub etag: Etag,
}

/// What [`acquire`] found.
#[derive(Debug)]
pub enum Acquired {
    Held(Hold),
    /// Another node's record; the actor is not ours to run.
    Elsewhere {
        node: String,
    },
}

/// Who this node is, for ownership records and log records.
#[derive(Debug, Clone)]
pub struct Me {
    pub node: NodeId,
    pub incarnation: String,
}

fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Acquires the ownership record of `actor` for this node.
pub async fn acquire(
    bucket: &Arc<dyn Bucket>,
    keys: &Keys,
    actor: &ActorId,
    me: &Me,
) -> Result<Acquired> {
    let key = keys.owner(actor);
    let body = || {
        OwnerRecord {
            node: me.node.to_string(),
            incarnation: me.incarnation.clone(),
            nonce: nonce(),
            released: false,
        }
        .encode()
    };
    // Two rounds: a record that vanishes or changes between our read and our
    // conditional write is retried once before the caller is told to retry.
    for _ in 0..3 {
        match bucket.put_if_absent(&key, body()).await {
            Ok(meta) => {
                return Ok(Acquired::Held(Hold {
                    key,
                    etag: meta.etag,
                }));
            }
            Err(wasmkeep_bucket::Error::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let current = match bucket.get(&key).await {
            Ok(object) => object,
            Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let takeover = match OwnerRecord::decode(&current.bytes) {
            Ok(record) => record.released || record.node == me.node.as_str(),
            Err(reason) => {
                // An unreadable record holds nothing: take it over and say so.
                tracing::warn!(%actor, %key, %reason, "ownership record does not parse; taking it over");
                true
            }
        };
        if !takeover {
            let node = OwnerRecord::decode(&current.bytes)
                .map(|r| r.node)
                .unwrap_or_default();
            return Ok(Acquired::Elsewhere { node });
        }
        match bucket.put_if_match(&key, body(), &current.meta.etag).await {
            Ok(meta) => {
                return Ok(Acquired::Held(Hold {
                    key,
                    etag: meta.etag,
                }));
            }
            Err(
                wasmkeep_bucket::Error::Conflict { .. } | wasmkeep_bucket::Error::NotFound { .. },
            ) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::unavailable(format!(
        "the ownership record of {actor} keeps changing"
    )))
}

/// Releases a hold: deletes the record if it is still ours, or writes a
/// released body where the bucket has no conditional delete.
pub async fn release(bucket: &Arc<dyn Bucket>, hold: &Hold, me: &Me) -> Result<()> {
    match bucket.delete_if_match(&hold.key, &hold.etag).await {
        Ok(()) => Ok(()),
        Err(wasmkeep_bucket::Error::Unsupported(_)) => {
            let body = OwnerRecord {
                node: me.node.to_string(),
                incarnation: me.incarnation.clone(),
                nonce: nonce(),
                released: true,
            }
            .encode();
            match bucket.put_if_match(&hold.key, body, &hold.etag).await {
                Ok(_) => Ok(()),
                // Someone else holds it now: nothing of ours to release.
                Err(
                    wasmkeep_bucket::Error::Conflict { .. }
                    | wasmkeep_bucket::Error::NotFound { .. },
                ) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(wasmkeep_bucket::Error::Conflict { .. } | wasmkeep_bucket::Error::NotFound { .. }) => {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_refuses_garbage() {
        let r = OwnerRecord {
            node: "n1".into(),
            incarnation: "abc".into(),
            nonce: "01".into(),
            released: false,
        };
        assert_eq!(OwnerRecord::decode(&r.encode()).expect("decodes"), r);
        let released = OwnerRecord {
            released: true,
            ..r
        };
        assert_eq!(
            OwnerRecord::decode(&released.encode()).expect("decodes"),
            released
        );
        assert!(OwnerRecord::decode(b"hello").is_err());
        assert!(OwnerRecord::decode(b"wasmkeep-owner 1\nn1\n").is_err());
        assert!(OwnerRecord::decode(b"wasmkeep-owner 1\nn1\ni\nn\nmaybe\n").is_err());
    }
}
