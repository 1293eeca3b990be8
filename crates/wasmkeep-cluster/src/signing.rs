//! Signed node calls: HMAC-SHA256 with the cluster key over the method, path,
//! query, every `x-wasmkeep-*` marker header (timestamp, nonce and sender
//! included) and the body's digest. A call is verified within a time window
//! and only once.
//!
//! Once is checked per sender's stream: a signer numbers its calls
//! (`x-wasmkeep-nonce: s<stream>-<n>`, the stream drawn at random when the
//! signer is made), and a verifier keeps, per stream, the highest number
//! seen and which of the [`STREAM_WINDOW_CALLS`] before it were seen. That
//! is a few hundred bytes per sender, whatever the rate of calls, where a
//! cache of random nonces held every nonce of the window (ADR 0060). A
//! random nonce (a node of an older version) still goes to that cache.
//!
//! Marker headers mean something only on a verified call. The server strips
//! them from client requests and from guests' calls; a call whose signature
//! does not verify is refused as a signed call and, per the seed's
//! compatibility rule, treated as an ordinary request without its markers.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// Most random nonces remembered; when full of unexpired ones, signed calls
/// with random nonces are refused rather than risk accepting a replay.
pub const NONCES_MAX: usize = 200_000;
/// How far behind its stream's highest number a call may arrive (calls on
/// pooled connections overtake each other) and still be checked; an older
/// one is refused.
pub const STREAM_WINDOW_CALLS: u64 = 4096;
/// Most senders' streams remembered at once (a sender's restart starts a
/// new stream; an old one is forgotten once its calls are stale).
pub const STREAMS_MAX: usize = 4096;
/// What starts a numbered nonce.
const STREAM_NONCE_PREFIX: &str = "s";
pub const CLUSTER_KEY_BYTES_MIN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Whether a header name is a marker (case-insensitive).
pub fn is_marker(name: &str) -> bool {
    // Bytes, not a `str` slice: a name whose 11th byte is inside a
    // character is no marker (and slicing it there panicked).
    name.as_bytes()
        .get(..MARKER_PREFIX.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(MARKER_PREFIX.as_bytes()))
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
    /// A valid signature of `from` whose timestamp is further from this
    /// node's clock than [`SIGNATURE_WINDOW`]: the two clocks disagree by
    /// `skew_ms` (positive: the sender's is ahead). Not honoured, and not an
    /// ordinary request either: it is a peer's call, refused for its clock.
    Skewed { from: String, skew_ms: i64 },
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

/// The calls seen of one sender's stream: the highest number, and a ring
/// of the [`STREAM_WINDOW_CALLS`] numbers up to it.
#[derive(Debug)]
struct Stream {
    highest: u64,
    seen: Box<[u64; (STREAM_WINDOW_CALLS / 64) as usize]>,
    /// The newest timestamp accepted: once it is stale, so is every call of
    /// the stream, and the stream may be forgotten.
    newest_ms: i64,
}

impl Stream {
    fn new(first: u64, ts: i64) -> Self {
        let mut stream = Self {
            highest: first,
            seen: Box::new([0; (STREAM_WINDOW_CALLS / 64) as usize]),
            newest_ms: ts,
        };
        stream.mark(first);
        stream
    }

    fn slot(n: u64) -> (usize, u64) {
        let bit = n % STREAM_WINDOW_CALLS;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn mark(&mut self, n: u64) {
        let (word, mask) = Self::slot(n);
        self.seen[word] |= mask;
    }

    /// Records call `n`; an error if it was seen or is too far behind.
    fn accept(&mut self, n: u64, ts: i64) -> Result<(), &'static str> {
        if n > self.highest {
            if n - self.highest >= STREAM_WINDOW_CALLS {
                self.seen.fill(0);
            } else {
                for skipped in self.highest + 1..n {
                    let (word, mask) = Self::slot(skipped);
                    self.seen[word] &= !mask;
                }
            }
            self.highest = n;
        } else if self.highest - n >= STREAM_WINDOW_CALLS {
            return Err(
                "replay window passed: the call is too far behind its sender's newer calls",
            );
        } else {
            let (word, mask) = Self::slot(n);
            if self.seen[word] & mask != 0 {
                return Err("replayed: call number already used");
            }
        }
        self.mark(n);
        self.newest_ms = self.newest_ms.max(ts);
        Ok(())
    }
}

/// Every sender stream seen whose calls are not stale yet.
#[derive(Debug, Default)]
struct Streams {
    by_sender: HashMap<(String, u64), Stream>,
}

impl Streams {
    fn accept(
        &mut self,
        from: &str,
        stream: u64,
        n: u64,
        ts: i64,
        now_ms: i64,
        window_ms: i64,
    ) -> Result<(), &'static str> {
        if let Some(known) = self.by_sender.get_mut(&(from.to_owned(), stream)) {
            return known.accept(n, ts);
        }
        if self.by_sender.len() >= STREAMS_MAX {
            self.by_sender
                .retain(|_, known| known.newest_ms + window_ms >= now_ms);
            if self.by_sender.len() >= STREAMS_MAX {
                return Err("too many senders' streams");
            }
        }
        self.by_sender
            .insert((from.to_owned(), stream), Stream::new(n, ts));
        Ok(())
    }
}

/// A numbered nonce's stream and number, if `nonce` is one.
fn parse_stream_nonce(nonce: &str) -> Option<(u64, u64)> {
    let (stream, n) = nonce.strip_prefix(STREAM_NONCE_PREFIX)?.split_once('-')?;
    if stream.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(stream, 16).ok()?, n.parse().ok()?))
}

/// Signs outgoing node calls and verifies incoming ones.
#[derive(Debug)]
pub struct Signer {
    key: Vec<u8>,
    node: String,
    clock: Arc<dyn Clock>,
    /// This signer's stream, and the number of its next call.
    stream: u64,
    next_call: AtomicU64,
    nonces: Mutex<NonceCache>,
    streams: Mutex<Streams>,
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
            stream: random.next_u64(),
            next_call: AtomicU64::new(1),
            nonces: Mutex::new(NonceCache::default()),
            streams: Mutex::new(Streams::default()),
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
        let n = self.next_call.fetch_add(1, Ordering::Relaxed);
        headers.push((
            HEADER_NONCE.into(),
            format!("{STREAM_NONCE_PREFIX}{:016x}-{n}", self.stream),
        ));
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
        // Saturating: a timestamp near i64::MIN overflowed `now - ts`.
        let skew_ms = ts.saturating_sub(now);
        if skew_ms.unsigned_abs() > window.unsigned_abs() {
            return Verdict::Skewed {
                from: from.to_owned(),
                skew_ms,
            };
        }
        if nonce.len() < 16 {
            return Verdict::Refused("nonce too short");
        }
        let once = match parse_stream_nonce(nonce) {
            Some((stream, n)) => self.streams.lock().accept(from, stream, n, ts, now, window),
            None => self.nonces.lock().insert(nonce, ts + window, now),
        };
        if let Err(reason) = once {
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
            Verdict::Refused("replayed: call number already used")
        );
    }

    /// Calls of one sender arriving out of order within the window each
    /// verify once; a replay of any of them, or a call further behind than
    /// the window, is refused; another sender's stream is its own.
    #[test]
    fn numbered_calls_verify_once_in_any_order_within_the_window() {
        let s = signer(KEY);
        let other = Signer::new(
            KEY.to_vec(),
            "n2".into(),
            Arc::new(SystemClock),
            Arc::new(SeededRandom::new(8)),
        )
        .unwrap();
        let calls: Vec<_> = (0..100)
            .map(|_| s.sign("GET", "/p", "", &[], b""))
            .collect();
        let verified = |headers: &[(String, String)]| {
            matches!(
                s.verify("GET", "/p", "", headers, b""),
                Verdict::Verified { .. }
            )
        };
        // Newest first, then the rest from the oldest: all new to the verifier.
        assert!(verified(&calls[99]));
        for call in &calls[..99] {
            assert!(verified(call));
        }
        for call in &calls {
            assert_eq!(
                s.verify("GET", "/p", "", call, b""),
                Verdict::Refused("replayed: call number already used")
            );
        }
        // Another sender's numbers start over without clashing.
        assert!(verified(&other.sign("GET", "/p", "", &[], b"")));
        // A call overtaken by a full window of newer ones is refused, not
        // checked against a slot that newer calls reuse.
        let late = s.sign("GET", "/p", "", &[], b"");
        for _ in 0..STREAM_WINDOW_CALLS {
            assert!(verified(&s.sign("GET", "/p", "", &[], b"")));
        }
        assert!(matches!(
            s.verify("GET", "/p", "", &late, b""),
            Verdict::Refused(reason) if reason.starts_with("replay window passed")
        ));
    }

    #[test]
    fn a_random_nonce_of_an_older_node_still_verifies_once() {
        let s = signer(KEY);
        let mut headers = s.sign("GET", "/p", "", &[], b"");
        let random = SeededRandom::new(3).token_hex(16);
        for (n, v) in headers.iter_mut() {
            if n == HEADER_NONCE {
                *v = random.clone();
            }
        }
        // Re-signed with the random nonce, as an older node signs.
        headers.retain(|(n, _)| n != HEADER_SIGNATURE);
        let call = SignedCall {
            method: "GET",
            path: "/p",
            query: "",
            markers: &headers,
            body: b"",
        };
        let mut mac = HmacSha256::new_from_slice(KEY).unwrap();
        mac.update(&call.canonical());
        headers.push((
            HEADER_SIGNATURE.into(),
            format!("v1={}", hex::encode(mac.finalize().into_bytes())),
        ));
        assert!(matches!(
            s.verify("GET", "/p", "", &headers, b""),
            Verdict::Verified { .. }
        ));
        assert_eq!(
            s.verify("GET", "/p", "", &headers, b""),
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
        // The timestamp is signed: changed, the signature fails.
        assert!(matches!(
            s.verify("GET", "/p", "", &headers, b""),
            Verdict::Refused(_)
        ));
        // Signed by a node whose clock is a minute ahead: skewed, with the
        // sender and by how much.
        #[derive(Debug)]
        struct Ahead;
        impl Clock for Ahead {
            fn now(&self) -> tokio::time::Instant {
                tokio::time::Instant::now()
            }
            fn wall_ms(&self) -> i64 {
                SystemClock.wall_ms() + 60_000
            }
        }
        let ahead = Signer::new(
            KEY.to_vec(),
            "n9".into(),
            Arc::new(Ahead),
            Arc::new(SeededRandom::new(9)),
        )
        .unwrap();
        let headers = ahead.sign("GET", "/p", "", &[], b"");
        assert!(matches!(
            s.verify("GET", "/p", "", &headers, b""),
            Verdict::Skewed { from, skew_ms } if from == "n9" && (59_000..=61_000).contains(&skew_ms)
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
