//! Signed node calls: HMAC-SHA256 with the cluster key over the method, path,
//! query, every `x-wasmkeep-*` marker header (timestamp, nonce and sender
//! included) and the body's digest. A call is verified within a time window
//! and only once (a bounded nonce cache).
//!
//! Marker headers mean something only on a verified call. The server strips
//! them from client requests and from guests' calls; a call whose signature
//! does not verify is refused as a signed call and, per the seed's
//! compatibility rule, treated as an ordinary request without its markers.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::{Clock, Error, Random, Result};

pub const MARKER_PREFIX: &str = "x-wasmkeep-";
pub const HEADER_SIGNATURE: &str = "x-wasmkeep-signature";
pub const HEADER_TIMESTAMP: &str = "x-wasmkeep-timestamp";
pub const HEADER_NONCE: &str = "x-wasmkeep-nonce";
pub const HEADER_FROM: &str = "x-wasmkeep-from";

/// A signed call older or newer than this (by the receiver's wall clock) is
/// refused. It also bounds how long nonces must be remembered.
pub const SIGNATURE_WINDOW: Duration = Duration::from_secs(30);
/// Most nonces remembered; when full of unexpired ones, signed calls are
/// refused rather than risk accepting a replay.
pub const NONCES_MAX: usize = 200_000;
pub const CLUSTER_KEY_BYTES_MIN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Whether a header name is a marker (case-insensitive).
pub fn is_marker(name: &str) -> bool {
    name.len() >= MARKER_PREFIX.len()
        && name[..MARKER_PREFIX.len()].eq_ignore_ascii_case(MARKER_PREFIX)
}

/// The call to sign or verify. `markers` are the `x-wasmkeep-*` headers the
/// call carries besides the signature itself.
#[derive(Debug, Clone)]
pub struct SignedCall<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub markers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl SignedCall<'_> {
    fn canonical(&self) -> Vec<u8> {
        let mut markers: Vec<(String, &str)> = self
            .markers
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(HEADER_SIGNATURE))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str()))
            .collect();
        markers.sort();
        let mut out = format!(
            "wasmkeep-signed-call 1\n{}\n{}\n{}\n",
            self.method.to_ascii_uppercase(),
            self.path,
            self.query
        );
        for (name, value) in markers {
            out.push_str(&name);
            out.push(':');
            out.push_str(value);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&hex::encode(Sha256::digest(self.body)));
        out.into_bytes()
    }
}

/// The outcome of checking an incoming request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A valid, fresh, first-seen signed call: its markers may be honoured.
    Verified {
        from: String,
        markers: Vec<(String, String)>,
    },
    /// No signature: an ordinary request.
    Unsigned,
    /// A signature that does not verify, is stale or was seen before. The
    /// request is handled as an ordinary one, without its markers.
    Refused(&'static str),
}

#[derive(Debug, Default)]
struct NonceCache {
    expiry_by_nonce: HashMap<String, i64>,
    order: VecDeque<(i64, String)>,
}

impl NonceCache {
    /// Records a nonce; false if it was seen before or the cache is full.
    fn insert(&mut self, nonce: &str, expires_ms: i64, now_ms: i64) -> Result<(), &'static str> {
        while let Some((exp, _)) = self.order.front() {
            if *exp > now_ms {
                break;
            }
            if let Some((_, old)) = self.order.pop_front() {
                self.expiry_by_nonce.remove(&old);
            }
        }
        if self.expiry_by_nonce.contains_key(nonce) {
            return Err("replayed: nonce already used");
        }
        if self.expiry_by_nonce.len() >= NONCES_MAX {
            return Err("nonce cache full");
        }
        self.expiry_by_nonce.insert(nonce.to_owned(), expires_ms);
        // Expiries are pushed roughly in order; an out-of-order one only
        // delays its own removal.
        self.order.push_back((expires_ms, nonce.to_owned()));
        Ok(())
    }
}

/// Signs outgoing node calls and verifies incoming ones.
#[derive(Debug)]
pub struct Signer {
    key: Vec<u8>,
    node: String,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    nonces: Mutex<NonceCache>,
}

impl Signer {
    pub fn new(
        key: Vec<u8>,
        node: String,
        clock: Arc<dyn Clock>,
        random: Arc<dyn Random>,
    ) -> Result<Self> {
        if key.len() < CLUSTER_KEY_BYTES_MIN {
            return Err(Error::ClusterKey(format!(
                "the cluster key must have at least {CLUSTER_KEY_BYTES_MIN} bytes, this one has {}",
                key.len()
            )));
        }
        Ok(Self {
            key,
            node,
            clock,
            random,
            nonces: Mutex::new(NonceCache::default()),
        })
    }

    /// Reads a key file: the key's bytes, or hex text (whitespace ignored).
    pub fn from_key_file(
        path: &Path,
        node: String,
        clock: Arc<dyn Clock>,
        random: Arc<dyn Random>,
    ) -> Result<Self> {
        let raw = std::fs::read(path)
            .map_err(|e| Error::ClusterKey(format!("cannot read {}: {e}", path.display())))?;
        let text: String = String::from_utf8_lossy(&raw).split_whitespace().collect();
        let key = match hex::decode(&text) {
            Ok(bytes) if !text.is_empty() => bytes,
            _ => raw,
        };
        Self::new(key, node, clock, random)
    }

    /// The headers to add to a call: the given markers plus timestamp, nonce,
    /// sender and signature.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        query: &str,
        markers: &[(String, String)],
        body: &[u8],
    ) -> Vec<(String, String)> {
        let mut headers: Vec<(String, String)> = markers.to_vec();
        headers.push((HEADER_TIMESTAMP.into(), self.clock.wall_ms().to_string()));
        headers.push((HEADER_NONCE.into(), self.random.token_hex(16)));
        headers.push((HEADER_FROM.into(), self.node.clone()));
        let call = SignedCall {
            method,
            path,
            query,
            markers: &headers,
            body,
        };
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(&call.canonical());
        headers.push((
            HEADER_SIGNATURE.into(),
            format!("v1={}", hex::encode(mac.finalize().into_bytes())),
        ));
        headers
    }

    /// Checks a request's markers. `headers` may hold every header of the
    /// request; only markers are looked at.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        query: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Verdict {
        let markers: Vec<(String, String)> = headers
            .iter()
            .filter(|(n, _)| is_marker(n))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
            .collect();
        let find = |name: &str| {
            markers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let Some(signature) = find(HEADER_SIGNATURE) else {
            return Verdict::Unsigned;
        };
        if markers
            .iter()
            .filter(|(n, _)| n == HEADER_SIGNATURE)
            .count()
            != 1
        {
            return Verdict::Refused("more than one signature");
        }
        let Some(sig_hex) = signature.strip_prefix("v1=") else {
            return Verdict::Refused("unknown signature version");
        };
        let Ok(sig) = hex::decode(sig_hex) else {
            return Verdict::Refused("signature is not hex");
        };
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(
            &SignedCall {
                method,
                path,
                query,
                markers: &markers,
                body,
            }
            .canonical(),
        );
        if mac.verify_slice(&sig).is_err() {
            return Verdict::Refused("signature does not verify");
        }
        let (Some(ts), Some(nonce), Some(from)) = (
            find(HEADER_TIMESTAMP),
            find(HEADER_NONCE),
            find(HEADER_FROM),
        ) else {
            return Verdict::Refused("timestamp, nonce or sender missing");
        };
        let Ok(ts) = ts.parse::<i64>() else {
            return Verdict::Refused("timestamp is not a number");
        };
        let now = self.clock.wall_ms();
        let window = i64::try_from(SIGNATURE_WINDOW.as_millis()).unwrap_or(i64::MAX);
        if (now - ts).abs() > window {
            return Verdict::Refused("stale: outside the signature window");
        }
        if nonce.len() < 16 {
            return Verdict::Refused("nonce too short");
        }
        if let Err(reason) = self.nonces.lock().insert(nonce, ts + window, now) {
            return Verdict::Refused(reason);
        }
        Verdict::Verified {
            from: from.to_owned(),
            markers,
        }
    }
}

/// Drops every marker header (from client requests and guests' calls).
pub fn strip_markers(headers: &mut Vec<(String, String)>) {
    headers.retain(|(n, _)| !is_marker(n));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SeededRandom, SystemClock};

    fn signer(key: &[u8]) -> Signer {
        Signer::new(
            key.to_vec(),
            "n1".into(),
            Arc::new(SystemClock),
            Arc::new(SeededRandom::new(7)),
        )
        .unwrap()
    }

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_signed_call_verifies_once() {
        let s = signer(KEY);
        let markers = vec![("x-wasmkeep-take".to_owned(), "1".to_owned())];
        let headers = s.sign("POST", "/t/c/a/x", "q=1", &markers, b"wasmkeep-take 1\nt\n");
        let v = s.verify("POST", "/t/c/a/x", "q=1", &headers, b"wasmkeep-take 1\nt\n");
        assert!(
            matches!(&v, Verdict::Verified { from, markers } if from == "n1" && markers.iter().any(|(n, _)| n == "x-wasmkeep-take"))
        );
        assert_eq!(
            s.verify("POST", "/t/c/a/x", "q=1", &headers, b"wasmkeep-take 1\nt\n"),
            Verdict::Refused("replayed: nonce already used")
        );
    }

    #[test]
    fn the_signature_covers_every_marker_path_query_and_body() {
        let s = signer(KEY);
        let markers = vec![("x-wasmkeep-take".to_owned(), "1".to_owned())];
        let headers = s.sign("POST", "/p", "q", &markers, b"body");
        let check =
            |method: &str, path: &str, query: &str, headers: &[(String, String)], body: &[u8]| {
                matches!(
                    s.verify(method, path, query, headers, body),
                    Verdict::Refused(_)
                )
            };
        assert!(check("GET", "/p", "q", &headers, b"body"));
        assert!(check("POST", "/other", "q", &headers, b"body"));
        assert!(check("POST", "/p", "q2", &headers, b"body"));
        assert!(check("POST", "/p", "q", &headers, b"bodz"));
        // Adding a marker the signer did not sign (e.g. a take marker on a
        // forwarded call) breaks the signature.
        let mut added = headers.clone();
        added.push(("x-wasmkeep-forwarded".into(), "1".into()));
        assert!(check("POST", "/p", "q", &added, b"body"));
        let mut removed = headers.clone();
        removed.retain(|(n, _)| n != "x-wasmkeep-take");
        assert!(check("POST", "/p", "q", &removed, b"body"));
    }

    #[test]
    fn a_node_with_another_key_is_refused() {
        let a = signer(KEY);
        let b = signer(b"another key of at least thirty-two bytes!");
        let headers = a.sign("GET", "/p", "", &[], b"");
        assert!(matches!(
            b.verify("GET", "/p", "", &headers, b""),
            Verdict::Refused(_)
        ));
    }

    #[test]
    fn stale_and_unsigned_calls() {
        let s = signer(KEY);
        assert_eq!(
            s.verify("GET", "/p", "", &[("host".into(), "x".into())], b""),
            Verdict::Unsigned
        );
        let mut headers = s.sign("GET", "/p", "", &[], b"");
        for (n, v) in headers.iter_mut() {
            if n == HEADER_TIMESTAMP {
                *v = "1000".into();
            }
        }
        assert!(matches!(
            s.verify("GET", "/p", "", &headers, b""),
            Verdict::Refused(_)
        ));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(
            Signer::new(
                b"short".to_vec(),
                "n".into(),
                Arc::new(SystemClock),
                Arc::new(SeededRandom::new(1))
            )
            .is_err()
        );
    }

    #[test]
    fn markers_are_stripped_case_insensitively() {
        let mut headers = vec![
            ("X-Wasmkeep-Take".to_owned(), "1".to_owned()),
            ("content-type".to_owned(), "text/plain".to_owned()),
        ];
        strip_markers(&mut headers);
        assert_eq!(
            headers,
            vec![("content-type".to_owned(), "text/plain".to_owned())]
        );
    }
}
