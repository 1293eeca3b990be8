//! The app's secrets (ADR 0016): the age (X25519) format of identities,
//! recipients and encrypted values, the rules for secret names, and
//! [`Secrets`], a node's decrypted copy of the app's secrets.
//!
//! `Secrets` is loaded at start from the bucket with the node's
//! `--secrets-identity`, refreshed once per heartbeat, read by guests through
//! `secrets.get`, and asked by the take job whether this node can open the
//! app's secrets. A secret's value is never logged nor written in clear: logs
//! name secrets only, and the bucket holds only ciphertext.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;

use age::secrecy::ExposeSecret as _;
use bytes::Bytes;
use parking_lot::RwLock;
use wasmkeep_bucket::{Bucket, Etag};
use wasmkeep_types::Keys;
use zeroize::Zeroizing;

use crate::{Error, Result};

/// Longest secret name (names are 1 to 64 of `[A-Za-z0-9_.-]`).
pub const SECRET_NAME_BYTES_MAX: usize = 64;
/// Largest secret value.
pub const SECRET_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Largest encrypted secret read from the bucket (the value plus age's
/// header and per-chunk tags, with room to spare).
pub const SECRET_OBJECT_BYTES_MAX: usize = SECRET_VALUE_BYTES_MAX + 4096;
/// Secrets of one app a node keeps; more are logged and skipped.
pub const SECRETS_MAX: usize = 1000;
/// Largest identity file read (an age identity file is a few lines).
pub const IDENTITY_FILE_BYTES_MAX: u64 = 16 * 1024;
/// Largest recipient object read from the bucket.
pub const RECIPIENT_BYTES_MAX: usize = 1024;

/// The identity, in the form `age-keygen` writes (comments, then the key).
pub type Identity = age::x25519::Identity;
/// The app's public key, stored at `Keys::recipient`.
pub type Recipient = age::x25519::Recipient;

/// Checks a secret name: 1 to 64 characters of `[A-Za-z0-9_.-]`, and not `.`
/// nor `..` (a name is a bucket key's last segment).
pub fn validate_name(name: &str) -> Result<()> {
    let refuse = |reason: &str| {
        Err(Error::Config(format!(
            "invalid secret name {name:?}: {reason}"
        )))
    };
    if name.is_empty() || name.len() > SECRET_NAME_BYTES_MAX {
        return refuse("use 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return refuse("use only letters, digits, '_', '.' and '-'");
    }
    if name == "." || name == ".." {
        return refuse("'.' and '..' are not names");
    }
    Ok(())
}

/// Parses an identity file: `#` comments and blank lines, then exactly one
/// `AGE-SECRET-KEY-1…` line.
pub fn parse_identity(text: &str) -> Result<Identity> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return Err(Error::Config(
            "not an age identity file: expected exactly one AGE-SECRET-KEY-1… line".into(),
        ));
    };
    // The parse error is a static description; it never contains the key.
    line.parse::<Identity>()
        .map_err(|e| Error::Config(format!("not an age X25519 identity ({e})")))
}

/// Reads and parses the identity file at `path`.
pub fn read_identity(path: &Path) -> Result<Identity> {
    let file = std::fs::File::open(path).map_err(|e| {
        Error::Config(format!(
            "cannot read the secrets identity {}: {e}",
            path.display()
        ))
    })?;
    // Room for the whole file up front (a growing string would leave
    // copies of the key in freed memory); zeroed when dropped.
    let mut text = Zeroizing::new(String::with_capacity(IDENTITY_FILE_BYTES_MAX as usize + 1));
    file.take(IDENTITY_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| {
            Error::Config(format!(
                "cannot read the secrets identity {}: {e} (is it a text file?)",
                path.display()
            ))
        })?;
    if text.len() as u64 > IDENTITY_FILE_BYTES_MAX {
        return Err(Error::Config(format!(
            "{} is larger than an age identity file ({IDENTITY_FILE_BYTES_MAX} bytes at most)",
            path.display()
        )));
    }
    parse_identity(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// The text of a new identity file (as `age-keygen` lays it out), zeroed
/// when dropped.
pub fn identity_file_text(identity: &Identity) -> Zeroizing<String> {
    Zeroizing::new(format!(
        "# wasmkeep app secrets identity (ADR 0016): give it to nodes with --secrets-identity\n# public key: {}\n{}\n",
        identity.to_public(),
        identity.to_string().expose_secret()
    ))
}

/// Parses the recipient object stored at `Keys::recipient`.
pub fn parse_recipient(bytes: &[u8]) -> Result<Recipient> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::Config("the app's recipient is not text".into()))?;
    text.trim()
        .parse::<Recipient>()
        .map_err(|e| Error::Config(format!("the app's recipient is not an age recipient ({e})")))
}

/// Reads the app's recipient; `None` when no `secret keygen` ran.
pub async fn read_recipient(bucket: &dyn Bucket, keys: &Keys) -> Result<Option<Recipient>> {
    match bucket.get(&keys.recipient()).await {
        Ok(object) => {
            if object.bytes.len() > RECIPIENT_BYTES_MAX {
                return Err(Error::Config(format!(
                    "the app's recipient is larger than {RECIPIENT_BYTES_MAX} bytes"
                )));
            }
            parse_recipient(&object.bytes).map(Some)
        }
        Err(wasmkeep_bucket::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Encrypts a value to the recipient (age binary format).
pub fn encrypt(recipient: &Recipient, value: &[u8]) -> Result<Vec<u8>> {
    age::encrypt(recipient, value).map_err(|e| Error::Config(format!("encryption failed: {e}")))
}

/// Decrypts a value with the identity. The error never holds plaintext.
pub fn decrypt(identity: &Identity, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
    age::decrypt(identity, ciphertext)
        .map(Zeroizing::new)
        .map_err(|e| Error::Config(format!("decryption failed: {e}")))
}

/// One secret as last read: its object's etag, and its value (`None` when it
/// could not be decrypted; kept so the failure is logged once per version).
struct Entry {
    etag: Etag,
    /// Overwritten with zeros when dropped (replaced, removed, node gone).
    value: Option<Zeroizing<String>>,
}

#[derive(Default)]
struct State {
    /// The app has a recipient (`secret keygen` ran).
    recipient_present: bool,
    /// This node's identity opens the app's secrets: it matches the
    /// recipient, or there is no recipient yet.
    identity_matches: bool,
    entries: BTreeMap<String, Entry>,
}

/// The app's secrets as this node can read them.
#[derive(Default)]
pub struct Secrets {
    identity: Option<Identity>,
    state: RwLock<State>,
}

impl std::fmt::Debug for Secrets {
    // Names only: neither the identity nor a value may reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.read();
        f.debug_struct("Secrets")
            .field("identity", &self.identity.as_ref().map(|_| "<given>"))
            .field("recipient_present", &state.recipient_present)
            .field("identity_matches", &state.identity_matches)
            .field("names", &state.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// Loads the identity (a wrong or unreadable file is an error: no
    /// half-working node) and the app's secrets.
    pub async fn load(bucket: &dyn Bucket, keys: &Keys, identity: Option<&Path>) -> Result<Self> {
        let identity = identity.map(read_identity).transpose()?;
        let recipient = read_recipient(bucket, keys).await?;
        if let (Some(identity), Some(recipient)) = (&identity, &recipient)
            && identity.to_public() != *recipient
        {
            return Err(Error::Config(format!(
                "--secrets-identity: the identity does not match the app's recipient: it was made for another app or replaced (the app's recipient is {recipient}, the identity's is {})",
                identity.to_public()
            )));
        }
        let secrets = Self {
            state: RwLock::new(State {
                recipient_present: recipient.is_some(),
                identity_matches: identity.is_some(),
                entries: BTreeMap::new(),
            }),
            identity,
        };
        if secrets.identity.is_some() {
            secrets.reload(bucket, keys).await?;
            let count = secrets.state.read().entries.len();
            tracing::info!(
                secrets = count,
                "the app's secrets are readable on this node"
            );
        } else if recipient.is_some() {
            tracing::info!(
                "no --secrets-identity: guests of this node read no secrets, and it takes no actors by move"
            );
        }
        Ok(secrets)
    }

    /// Heartbeat line 10: this node was given the app's identity, and it
    /// opens the app's secrets.
    pub fn readable(&self) -> bool {
        self.identity.is_some() && self.state.read().identity_matches
    }

    /// Whether this node can open the app's secrets: the app has no
    /// recipient, or this node's identity matches it (the take job refuses
    /// with 503 otherwise).
    pub fn can_open(&self) -> bool {
        !self.state.read().recipient_present || self.readable()
    }

    /// A secret's value, for `secrets.get`: a copy, overwritten with zeros
    /// when dropped.
    pub fn get(&self, name: &str) -> Option<Zeroizing<String>> {
        self.state.read().entries.get(name)?.value.clone()
    }

    /// The names of the secrets this node holds (decrypted or not).
    pub fn names(&self) -> Vec<String> {
        self.state.read().entries.keys().cloned().collect()
    }

    /// Re-reads the app's recipient and secrets (once per heartbeat period):
    /// new and changed secrets (by etag) are decrypted, removed ones dropped.
    /// A failure is logged and the last good state kept.
    pub async fn refresh(&self, bucket: &dyn Bucket, keys: &Keys) {
        if let Err(e) = self.reload(bucket, keys).await {
            tracing::warn!(error = %e, "refreshing the app's secrets failed; keeping the last ones read");
        }
    }

    async fn reload(&self, bucket: &dyn Bucket, keys: &Keys) -> Result<()> {
        let recipient = read_recipient(bucket, keys).await?;
        let matches = match (&self.identity, &recipient) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(identity), Some(recipient)) => identity.to_public() == *recipient,
        };
        {
            let mut state = self.state.write();
            state.recipient_present = recipient.is_some();
            if state.identity_matches && !matches {
                tracing::warn!(
                    "the app's recipient changed (secret keygen --force): this node's identity no longer opens the app's secrets"
                );
            }
            state.identity_matches = matches;
            if !matches {
                // Line 10 says `no`: guests read nothing here either.
                state.entries.clear();
            }
        }
        let Some(identity) = self.identity.as_ref().filter(|_| matches) else {
            return Ok(());
        };
        let prefix = keys.secrets_prefix();
        let listed = bucket.list(&prefix).await?;
        let mut wanted: Vec<(String, Etag)> = Vec::new();
        for meta in listed {
            let Some(name) = meta.key.strip_prefix(&prefix) else {
                continue;
            };
            if validate_name(name).is_err() {
                tracing::warn!(key = %meta.key, "skipping an object that is not a secret");
                continue;
            }
            if wanted.len() == SECRETS_MAX {
                tracing::warn!(
                    limit = SECRETS_MAX,
                    "the app has more secrets than a node keeps; the rest are skipped"
                );
                break;
            }
            wanted.push((name.to_owned(), meta.etag));
        }
        // Decrypt what is new or changed outside the lock: a slow bucket
        // never blocks a guest's `secrets.get`.
        let mut fresh: Vec<(String, Entry)> = Vec::new();
        for (name, etag) in &wanted {
            let known = {
                let state = self.state.read();
                state.entries.get(name).is_some_and(|e| &e.etag == etag)
            };
            if known {
                continue;
            }
            let object = match bucket.get(&keys.secret(name)).await {
                Ok(object) => object,
                // Removed between the listing and the read.
                Err(wasmkeep_bucket::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let value = open_value(identity, name, &object.bytes);
            fresh.push((
                name.clone(),
                Entry {
                    etag: object.meta.etag,
                    value,
                },
            ));
        }
        let mut state = self.state.write();
        state
            .entries
            .retain(|name, _| wanted.iter().any(|(n, _)| n == name));
        for (name, entry) in fresh {
            state.entries.insert(name, entry);
        }
        Ok(())
    }
}

/// Decrypts one stored secret; a failure is logged by name only.
fn open_value(identity: &Identity, name: &str, ciphertext: &Bytes) -> Option<Zeroizing<String>> {
    if ciphertext.len() > SECRET_OBJECT_BYTES_MAX {
        tracing::warn!(
            secret = name,
            "skipping a secret larger than {SECRET_OBJECT_BYTES_MAX} bytes"
        );
        return None;
    }
    match decrypt(identity, ciphertext) {
        // The buffer moves into the string (no copy); on an error it comes
        // back and is zeroed.
        Ok(mut bytes) => match String::from_utf8(std::mem::take(&mut *bytes)) {
            Ok(value) => Some(Zeroizing::new(value)),
            Err(e) => {
                drop(Zeroizing::new(e.into_bytes()));
                tracing::warn!(secret = name, "skipping a secret whose value is not UTF-8");
                None
            }
        },
        Err(e) => {
            tracing::warn!(secret = name, error = %e, "skipping a secret that does not decrypt with this node's identity");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wasmkeep_bucket::MemoryBucket;
    use wasmkeep_types::AppName;

    use super::*;

    fn keys() -> Keys {
        Keys::new(&AppName::default_app())
    }

    async fn setup(bucket: &dyn Bucket, dir: &Path) -> (std::path::PathBuf, Recipient) {
        let identity = Identity::generate();
        let path = dir.join("id.txt");
        std::fs::write(&path, identity_file_text(&identity).as_bytes()).expect("write identity");
        let recipient = identity.to_public();
        bucket
            .put(&keys().recipient(), Bytes::from(recipient.to_string()))
            .await
            .expect("put recipient");
        (path, recipient)
    }

    async fn put_secret(bucket: &dyn Bucket, recipient: &Recipient, name: &str, value: &str) {
        let sealed = encrypt(recipient, value.as_bytes()).expect("encrypt");
        bucket
            .put(&keys().secret(name), Bytes::from(sealed))
            .await
            .expect("put secret");
    }

    #[test]
    fn secret_names_follow_the_rules() {
        for good in ["A", "db_password", "api.key-2", &"x".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "a/b", "..", ".", "sp ace", "é", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn identity_files_parse_with_comments_and_refuse_anything_else() {
        let identity = Identity::generate();
        let parsed = parse_identity(&identity_file_text(&identity)).expect("parses");
        assert_eq!(parsed.to_public(), identity.to_public());
        assert!(parse_identity("").is_err());
        assert!(parse_identity("# only a comment\n").is_err());
        assert!(parse_identity(&identity.to_public().to_string()).is_err());
        let two = format!(
            "{}\n{}\n",
            identity.to_string().expose_secret(),
            identity.to_string().expose_secret()
        );
        assert!(parse_identity(&two).is_err());
    }

    #[test]
    fn values_round_trip_and_other_identities_cannot_open_them() {
        let identity = Identity::generate();
        let sealed = encrypt(&identity.to_public(), b"hunter2").expect("encrypt");
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(
            decrypt(&identity, &sealed).expect("decrypt").as_slice(),
            b"hunter2"
        );
        assert!(decrypt(&Identity::generate(), &sealed).is_err());
    }

    #[tokio::test]
    async fn load_decrypts_and_refresh_follows_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let (path, recipient) = setup(&*bucket, dir.path()).await;
        put_secret(&*bucket, &recipient, "a", "one").await;
        put_secret(&*bucket, &recipient, "b", "two").await;
        let secrets = Secrets::load(&*bucket, &keys(), Some(&path))
            .await
            .expect("load");
        assert!(secrets.readable() && secrets.can_open());
        assert_eq!(secrets.get("a").as_deref().map(String::as_str), Some("one"));
        assert_eq!(secrets.get("b").as_deref().map(String::as_str), Some("two"));

        put_secret(&*bucket, &recipient, "a", "uno").await;
        bucket.delete(&keys().secret("b")).await.expect("delete");
        put_secret(&*bucket, &recipient, "c", "three").await;
        // A secret sealed to another key is skipped, not fatal.
        put_secret(&*bucket, &Identity::generate().to_public(), "d", "four").await;
        secrets.refresh(&*bucket, &keys()).await;
        assert_eq!(secrets.get("a").as_deref().map(String::as_str), Some("uno"));
        assert_eq!(secrets.get("b"), None);
        assert_eq!(
            secrets.get("c").as_deref().map(String::as_str),
            Some("three")
        );
        assert_eq!(secrets.get("d"), None);
        assert_eq!(secrets.names(), vec!["a", "c", "d"]);
        assert!(!format!("{secrets:?}").contains("uno"));
    }

    #[tokio::test]
    async fn a_node_without_the_identity_reads_nothing_and_cannot_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let empty = Secrets::load(&*bucket, &keys(), None).await.expect("load");
        assert!(!empty.readable());
        assert!(
            empty.can_open(),
            "an app without a recipient has nothing to open"
        );

        let (_, recipient) = setup(&*bucket, dir.path()).await;
        put_secret(&*bucket, &recipient, "a", "one").await;
        let secrets = Secrets::load(&*bucket, &keys(), None).await.expect("load");
        assert!(!secrets.readable());
        assert!(!secrets.can_open());
        assert_eq!(secrets.get("a"), None);
        empty.refresh(&*bucket, &keys()).await;
        assert!(!empty.can_open(), "refresh sees the new recipient");
    }

    #[tokio::test]
    async fn a_wrong_identity_is_refused_at_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        setup(&*bucket, dir.path()).await;
        let other = dir.path().join("other.txt");
        std::fs::write(&other, identity_file_text(&Identity::generate()).as_bytes())
            .expect("write");
        let e = Secrets::load(&*bucket, &keys(), Some(&other))
            .await
            .expect_err("refused");
        assert!(e.to_string().contains("does not match"), "{e}");
        let garbage = dir.path().join("garbage.txt");
        std::fs::write(&garbage, "not a key\n").expect("write");
        let e = Secrets::load(&*bucket, &keys(), Some(&garbage))
            .await
            .expect_err("refused");
        assert!(e.to_string().contains("age"), "{e}");
        let missing = dir.path().join("missing.txt");
        assert!(
            Secrets::load(&*bucket, &keys(), Some(&missing))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_replaced_recipient_closes_the_secrets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let (path, recipient) = setup(&*bucket, dir.path()).await;
        put_secret(&*bucket, &recipient, "a", "one").await;
        let secrets = Secrets::load(&*bucket, &keys(), Some(&path))
            .await
            .expect("load");
        bucket
            .put(
                &keys().recipient(),
                Bytes::from(Identity::generate().to_public().to_string()),
            )
            .await
            .expect("put");
        secrets.refresh(&*bucket, &keys()).await;
        assert!(!secrets.readable());
        assert!(!secrets.can_open());
        assert_eq!(
            secrets.get("a"),
            None,
            "a node that says `no` serves nothing"
        );
    }
}
