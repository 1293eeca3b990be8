//! The app's secrets (ADR 0016). SKELETON: filled in by the secrets work.
//!
//! `Secrets` is loaded at start from the bucket with the node's
//! `--secrets-identity`, refreshed once per heartbeat, read by guests through
//! `secrets.get`, and asked by the take job whether this node can open the
//! app's secrets.

use std::path::Path;

use wasmkeep_bucket::Bucket;
use wasmkeep_types::Keys;

use crate::Result;

/// The app's secrets as this node can read them.
#[derive(Debug, Default)]
pub struct Secrets {}

impl Secrets {
    /// Loads the identity (a wrong or unreadable file is an error: no
    /// half-working node) and the app's secrets.
    pub async fn load(_bucket: &dyn Bucket, _keys: &Keys, _identity: Option<&Path>) -> Result<Self> {
        Ok(Self::default())
    }

    /// Heartbeat line 10: this node was given the app's identity.
    pub fn readable(&self) -> bool {
        false
    }

    /// Whether this node can open the app's secrets (the take job refuses
    /// with 503 otherwise).
    pub fn can_open(&self) -> bool {
        true
    }

    /// A secret's value, for `secrets.get`.
    pub fn get(&self, _name: &str) -> Option<String> {
        None
    }

    /// Re-reads the app's secrets (once per heartbeat period).
    pub async fn refresh(&self, _bucket: &dyn Bucket, _keys: &Keys) {}
}
