//! The folder's layout and what its files mean: the object `a/b` is the
//! file `<root>/a/b`; `.locks`, `.tmp` and `.wal` are the backend's own and
//! never keys; an object's etag is a hash of its bytes; and what a failed
//! file operation on a key tells the caller.
//!
//! Names and answers only: nothing here touches the disk, and this file
//! uses no other part of the folder backend.

use std::io;

use sha2::{Digest, Sha256};

use crate::{Error, Etag, Result};

pub(super) const LOCKS_DIR: &str = ".locks";
pub(crate) const TEMP_DIR: &str = ".tmp";

/// The journal folder under the bucket's root (reserved, never an object).
pub(crate) const JOURNAL_DIR: &str = ".wal";

/// The etag of a body: SHA-256 truncated to 16 bytes, hex.
pub fn content_etag(bytes: &[u8]) -> Etag {
    let digest = Sha256::digest(bytes);
    let mut text = [0_u8; 32];
    // `hex::encode` builds its string a char at a time (ADR 0046).
    hex::encode_to_slice(&digest[..16], &mut text).expect("16 bytes are 32 hex digits");
    Etag(String::from_utf8(text.to_vec()).expect("hex digits are UTF-8"))
}

/// Keys whose first segment is reserved for the backend's own files.
pub(super) fn check_not_reserved(key: &str) -> Result<()> {
    let first = key.split('/').next().unwrap_or_default();
    if first == LOCKS_DIR || first == TEMP_DIR || first == JOURNAL_DIR {
        return Err(Error::InvalidKey {
            key: key.to_owned(),
            reason: "`.locks`, `.tmp` and `.wal` are reserved by the folder backend",
        });
    }
    Ok(())
}

pub(super) fn is_missing(e: &io::Error) -> bool {
    // ENOTDIR: a parent "folder" of the key is an object, so the key is absent.
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

pub(super) fn prefix_collision(key: &str) -> Error {
    Error::InvalidKey {
        key: key.to_owned(),
        reason: "the folder backend cannot hold a key that is also the folder of other keys (`a` and `a/b`)",
    }
}

/// The error of a rename into place at `key`.
pub(super) fn rename_error(key: &str, e: &io::Error) -> Error {
    if e.kind() == io::ErrorKind::IsADirectory || e.raw_os_error() == Some(libc::ENOTDIR) {
        prefix_collision(key)
    } else {
        io_unavailable(key, "rename into place", e)
    }
}

pub(super) fn io_unavailable(key: &str, what: &str, e: &io::Error) -> Error {
    Error::Unavailable {
        key: key.to_owned(),
        reason: format!("{what}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_is_the_first_half_of_sha256_in_lower_case_hex() {
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 ...
        assert_eq!(content_etag(b"abc").0, "ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(content_etag(b"").0, "e3b0c44298fc1c149afbf4c8996fb924");
    }
}
