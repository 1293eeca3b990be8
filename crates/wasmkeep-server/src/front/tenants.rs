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

use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use wasmkeep_bucket::Bucket;
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

/// Whether a client request must carry a tenant token, and the cache of
/// recent answers.
#[derive(Debug, Default)]
pub struct TenantGate {
    pub required: bool,
    /// (tenant, token digest) → (valid, when it was looked up).
    cache: Mutex<HashMap<(TenantName, String), (bool, Instant)>>,
}

impl TenantGate {
    pub fn new(required: bool) -> Self {
        Self {
            required,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Checks a client request to `tenant` with the given `Authorization`
    /// header value: `Ok` when tokens are not required or the token is one
    /// of the tenant's, `Error::Unauthorized` when it is missing or wrong.
    pub async fn check(
        &self,
        bucket: &dyn Bucket,
        keys: &Keys,
        tenant: &TenantName,
        authorization: Option<&str>,
    ) -> Result<()> {
        if !self.required {
            return Ok(());
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
        open.check(&bucket, &keys(), &b, None)
            .await
            .expect("not required");
    }
}
