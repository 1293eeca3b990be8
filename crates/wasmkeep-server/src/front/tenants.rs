//! Tenant bearer tokens (ADR 0022): their format, how they are hashed and
//! stored, and [`TenantGate`], which checks a client request's
//! `Authorization: Bearer wk_…` against the tokens of the request's tenant.
//!
//! Only `sha256(token)` is stored, as the last segment of
//! `apps/<app>/tenants/<tenant>/tokens/<sha256 hex>`, so a check is one read
//! of a key computed from the token. Answers are cached for a short while:
//! a revoke takes effect within [`TOKEN_VALID_CACHE`].

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Fenced, Outcome};
use wasmkeep_types::{Keys, TenantName};

use crate::{Error, Result};

/// Every token starts with this, so a leaked one is easy to recognise.
pub const TOKEN_PREFIX: &str = "wk_";
/// Random bytes in a token (written as hex after the prefix).
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// Characters of a token's hash shown as its id.
pub const TOKEN_ID_CHARS: usize = 8;
/// How long a token found valid is trusted without a new look (so a revoke
/// takes effect within this).
pub const TOKEN_VALID_CACHE: Duration = Duration::from_secs(10);
/// How long a token found unknown is refused without a new look (so a new
/// token works within this).
pub const TOKEN_INVALID_CACHE: Duration = Duration::from_secs(1);
/// Cached answers at most; a full cache drops its expired answers, then all.
pub const TOKEN_CACHE_ENTRIES_MAX: usize = 10_000;
/// Body of a stored token hash (the key is what counts).
pub const TOKEN_OBJECT_HEADER: &str = "wasmkeep-tenant-token 1";
/// Body of the policy object `control/tenant-tokens` (its presence is what
/// counts).
pub const POLICY_OBJECT_BODY: &str = "wasmkeep-tenant-tokens 1\nrequired\n";

/// A new random token: `wk_` and 64 hex digits.
pub fn new_token() -> String {
    let bytes: [u8; TOKEN_RANDOM_BYTES] = rand::random();
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// Whether `text` has the shape of a token (checked before any hashing or
/// bucket read).
pub fn is_token_shaped(text: &str) -> bool {
    text.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == TOKEN_RANDOM_BYTES * 2 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The stored form of a token: lowercase hex of its SHA-256.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A token's id as `tenant token list` shows it.
pub fn token_id(digest: &str) -> &str {
    &digest[..TOKEN_ID_CHARS.min(digest.len())]
}

/// What the bucket says of tenant tokens, as this node last read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Not read yet: every client request to a tenant is refused (503),
    /// never let through.
    Unknown,
    /// No policy object: tokens are required only on a node started with
    /// `--tenant-tokens true`.
    Optional,
    /// `control/tenant-tokens` exists: every node requires tokens.
    Required,
}

/// Whether a client request must carry a tenant token, and the cache of
/// recent answers.
#[derive(Debug)]
pub struct TenantGate {
    /// `--tenant-tokens true`: this node requires tokens whatever the
    /// bucket says.
    forced: bool,
    policy: Mutex<Policy>,
    /// (tenant, token digest) → (valid, when it was looked up).
    cache: Mutex<HashMap<(TenantName, String), (bool, Instant)>>,
}

impl TenantGate {
    /// A gate whose policy is not read yet (see [`TenantGate::set_policy`]).
    pub fn new(forced: bool) -> Self {
        Self {
            forced,
            policy: Mutex::new(Policy::Unknown),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this node was started with `--tenant-tokens true`.
    pub fn forced(&self) -> bool {
        self.forced
    }

    /// The bucket's policy as last read.
    pub fn policy(&self) -> Policy {
        *self.policy.lock()
    }

    /// Notes the policy just read; a change is logged.
    pub fn set_policy(&self, policy: Policy) {
        let before = std::mem::replace(&mut *self.policy.lock(), policy);
        if before != policy && before != Policy::Unknown {
            tracing::info!(?policy, "the app's tenant-token policy changed");
        }
    }

    /// Notes the policy that a listing of `control/` (the heartbeat's)
    /// shows.
    pub fn note_listing(&self, keys: &Keys, listed: &[wasmkeep_bucket::ObjectMeta]) {
        let key = keys.tenant_tokens_policy();
        self.set_policy(if listed.iter().any(|meta| meta.key == key) {
            Policy::Required
        } else {
            Policy::Optional
        });
    }

    /// Whether client requests must carry a token: `None` while the policy
    /// is unknown (nothing may pass then).
    pub fn required(&self) -> Option<bool> {
        match self.policy() {
            _ if self.forced => Some(true),
            Policy::Unknown => None,
            Policy::Optional => Some(false),
            Policy::Required => Some(true),
        }
    }

    /// Checks a client request to `tenant` with the given `Authorization`
    /// header value: `Ok` when tokens are not required or the token is one
    /// of the tenant's, `Error::Unauthorized` when it is missing or wrong,
    /// `Error::Unavailable` while the policy is unknown.
    pub async fn check(
        &self,
        bucket: &dyn Bucket,
        keys: &Keys,
        tenant: &TenantName,
        authorization: Option<&str>,
    ) -> Result<()> {
        match self.required() {
            Some(false) => return Ok(()),
            Some(true) => {}
            None => {
                return Err(Error::Unavailable {
                    reason: "this node has not read the app's tenant-token policy yet".into(),
                    retry_after_s: POLICY_UNKNOWN_RETRY_AFTER_S,
                });
            }
        }
        let Some(value) = authorization else {
            return Err(Error::Unauthorized(format!(
                "tenant {tenant} requires a bearer token (Authorization: Bearer wk_…)"
            )));
        };
        let token = value
            .trim()
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(token) = token.filter(|t| is_token_shaped(t)) else {
            return Err(Error::Unauthorized(
                "the Authorization header is not `Bearer wk_…`".into(),
            ));
        };
        let digest = token_digest(token);
        let cache_key = (tenant.clone(), digest);
        let cached = self.cache.lock().get(&cache_key).copied();
        let valid = match cached {
            Some((valid, at)) if at.elapsed() < ttl(valid) => valid,
            _ => {
                let valid = match bucket.head(&keys.tenant_token(tenant, &cache_key.1)).await {
                    Ok(_) => true,
                    Err(wasmkeep_bucket::Error::NotFound { .. }) => false,
                    Err(e) => return Err(e.into()),
                };
                self.remember(cache_key, valid);
                valid
            }
        };
        if valid {
            Ok(())
        } else {
            Err(Error::Unauthorized(format!(
                "the bearer token is not one of tenant {tenant}'s"
            )))
        }
    }

    fn remember(&self, key: (TenantName, String), valid: bool) {
        let mut cache = self.cache.lock();
        if cache.len() >= TOKEN_CACHE_ENTRIES_MAX {
            cache.retain(|_, (valid, at)| at.elapsed() < ttl(*valid));
            if cache.len() >= TOKEN_CACHE_ENTRIES_MAX {
                cache.clear();
            }
        }
        cache.insert(key, (valid, Instant::now()));
    }
}

/// Retry-After while a node has not read the policy.
const POLICY_UNKNOWN_RETRY_AFTER_S: u32 = 1;

/// Reads the policy object: `Required` when it exists, `Optional` when it
/// does not; a bucket error is passed on (the caller keeps what it knew).
pub async fn read_policy(bucket: &dyn Bucket, keys: &Keys) -> Result<Policy> {
    match bucket.head(&keys.tenant_tokens_policy()).await {
        Ok(_) => Ok(Policy::Required),
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(Policy::Optional),
        Err(e) => Err(e.into()),
    }
}

/// Writes the policy object if it is absent: from then on every node of
/// the app requires tenant tokens. True when this call wrote it.
pub async fn require(bucket: &dyn Bucket, keys: &Keys) -> Result<bool> {
    let key = keys.tenant_tokens_policy();
    match Fenced::new(bucket, &key)
        .create(Bytes::from_static(POLICY_OBJECT_BODY.as_bytes()))
        .await
    {
        Ok(Outcome::Done(_)) => Ok(true),
        Ok(Outcome::Conflict) => Ok(false),
        Ok(Outcome::Gone) => Err(Error::Unavailable {
            reason: "the bucket answered not found to writing the tenant-token policy".into(),
            retry_after_s: POLICY_UNKNOWN_RETRY_AFTER_S,
        }),
        Ok(Outcome::Unknown(e)) | Err(e) => Err(e.into()),
    }
}

fn ttl(valid: bool) -> Duration {
    if valid {
        TOKEN_VALID_CACHE
    } else {
        TOKEN_INVALID_CACHE
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use wasmkeep_bucket::MemoryBucket;
    use wasmkeep_types::AppName;

    use super::*;

    fn keys() -> Keys {
        Keys::new(&AppName::default_app())
    }

    #[test]
    fn tokens_have_a_fixed_shape_and_differ() {
        let a = new_token();
        assert!(is_token_shaped(&a), "{a}");
        assert_ne!(a, new_token());
        assert!(!is_token_shaped("wk_123"));
        assert!(!is_token_shaped(&a.replace("wk_", "xx_")));
        assert_eq!(token_digest(&a).len(), 64);
        assert_eq!(token_id(&token_digest(&a)).len(), TOKEN_ID_CHARS);
    }

    #[tokio::test]
    async fn only_stored_tokens_of_the_tenant_pass() {
        let bucket = MemoryBucket::new();
        let a = TenantName::new("a").expect("name");
        let b = TenantName::new("b").expect("name");
        let token = new_token();
        bucket
            .put(
                &keys().tenant_token(&a, &token_digest(&token)),
                Bytes::from_static(b"x"),
            )
            .await
            .expect("put");
        let gate = TenantGate::new(true);
        gate.set_policy(Policy::Optional);
        let bearer = format!("Bearer {token}");
        gate.check(&bucket, &keys(), &a, Some(&bearer))
            .await
            .expect("valid");
        for (tenant, header) in [
            (&b, Some(bearer.as_str())),
            (&a, None),
            (&a, Some(token.as_str())),
            (&a, Some("Bearer wk_nope")),
            (&a, Some("Basic dXNlcjpwYXNz")),
        ] {
            let e = gate
                .check(&bucket, &keys(), tenant, header)
                .await
                .expect_err("refused");
            assert!(matches!(e, Error::Unauthorized(_)), "{e}");
            assert_eq!(e.status(), 401);
        }
        let open = TenantGate::new(false);
        open.set_policy(Policy::Optional);
        open.check(&bucket, &keys(), &b, None)
            .await
            .expect("not required");
    }

    #[tokio::test]
    async fn the_bucket_policy_decides_and_an_unread_one_lets_nothing_through() {
        let bucket = MemoryBucket::new();
        let tenant = TenantName::new("a").expect("name");
        let gate = TenantGate::new(false);
        // Not read yet: refused with 503, not let through.
        let e = gate
            .check(&bucket, &keys(), &tenant, None)
            .await
            .expect_err("policy unknown");
        assert_eq!(e.status(), 503, "{e}");
        // Read: no policy object, so open.
        gate.set_policy(read_policy(&bucket, &keys()).await.expect("read"));
        assert_eq!(gate.policy(), Policy::Optional);
        gate.check(&bucket, &keys(), &tenant, None)
            .await
            .expect("optional");
        // Required: written once (a second require finds it), then every
        // gate that reads it refuses a request without a token.
        assert!(require(&bucket, &keys()).await.expect("written"));
        assert!(!require(&bucket, &keys()).await.expect("already there"));
        gate.set_policy(read_policy(&bucket, &keys()).await.expect("read"));
        assert_eq!(gate.policy(), Policy::Required);
        let e = gate
            .check(&bucket, &keys(), &tenant, None)
            .await
            .expect_err("required");
        assert_eq!(e.status(), 401, "{e}");
        // A listing of control/ without the object makes it optional again.
        gate.note_listing(&keys(), &[]);
        assert_eq!(gate.required(), Some(false));
        let listed = bucket.list(&keys().control_prefix()).await.expect("list");
        gate.note_listing(&keys(), &listed);
        assert_eq!(gate.required(), Some(true));
        // A node started with --tenant-tokens true requires them whatever
        // it read, or before it read anything.
        let forced = TenantGate::new(true);
        assert_eq!(forced.required(), Some(true));
        forced.set_policy(Policy::Optional);
        assert_eq!(forced.required(), Some(true));
    }
}
