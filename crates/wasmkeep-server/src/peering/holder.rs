//! The data dir's lock and token (ADR 0054). A process holds a lock in its
//! data dir for its node identity (bucket, app and node id; an advisory
//! lock the kernel drops when the process dies) for as long as it runs, and
//! writes the token kept in that lock file into its heartbeat. A later
//! process of the same identity that takes the lock and finds the token in
//! its node id's heartbeat knows that the writer was an earlier process of
//! this dir, dead since, and takes the node id over at once; any other
//! heartbeat it first watches for a lease TTL.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use sha2::{Digest, Sha256};
use wasmkeep_cluster::{OsRandom, Random};
use wasmkeep_types::heartbeat::is_holder_token;

use crate::{Error, Result};

/// Bytes of randomness in a token (hex: twice as many digits).
const TOKEN_BYTES: usize = 16;

/// One identity's lock in a data dir, held while this value lives.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    token: String,
}

impl DataDirLock {
    /// Takes the lock of `identity` in `dir` (which exists) and reads or
    /// makes its token. `None` when another live process holds it, or the
    /// file system does not lock: this process then proves nothing about
    /// its past.
    pub fn acquire(dir: &Path, identity: &str) -> Result<Option<Self>> {
        let io = |what: &str, e: std::io::Error| {
            Error::Config(format!("{what} in data dir {}: {e}", dir.display()))
        };
        let holders = dir.join("holders");
        std::fs::create_dir_all(&holders).map_err(|e| io("creating holders/", e))?;
        let name = hex::encode(&Sha256::digest(identity.as_bytes())[..8]);
        let path = holders.join(name);
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io("opening the holder lock", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                tracing::warn!(path = %path.display(), "another wasmkeep process with this bucket, app and node id runs on this data dir: this one will wait for its heartbeat to stop, or refuse to start");
                return Ok(None);
            }
            Err(TryLockError::Error(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "the data dir cannot be locked: a heartbeat this node id left behind is watched for a lease TTL before it is taken over");
                return Ok(None);
            }
        }
        let mut text = String::new();
        // Unreadable text (a torn write) is replaced like a missing token.
        let _ = file.read_to_string(&mut text);
        let token = if is_holder_token(text.trim()) {
            text.trim().to_owned()
        } else {
            let token = OsRandom.token_hex(TOKEN_BYTES);
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(format!("{token}\n").as_bytes()))
                .and_then(|()| file.sync_all())
                .map_err(|e| io("writing the holder token", e))?;
            token
        };
        Ok(Some(Self { _file: file, token }))
    }

    pub fn token(&self) -> &str {
        &self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_holds_the_lock_and_the_token_outlives_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = DataDirLock::acquire(dir.path(), "file:///b\ndefault\nn1")
            .expect("acquire")
            .expect("free");
        assert!(is_holder_token(first.token()));
        // A second open of the lock file conflicts, as another process's would;
        // another identity has its own lock.
        assert!(
            DataDirLock::acquire(dir.path(), "file:///b\ndefault\nn1")
                .expect("acquire")
                .is_none()
        );
        let other = DataDirLock::acquire(dir.path(), "file:///b\ndefault\nn2")
            .expect("acquire")
            .expect("another identity is free");
        assert_ne!(other.token(), first.token());
        let token = first.token().to_owned();
        drop(first);
        let again = DataDirLock::acquire(dir.path(), "file:///b\ndefault\nn1")
            .expect("acquire")
            .expect("free again");
        assert_eq!(again.token(), token);
    }

    #[test]
    fn a_damaged_token_is_replaced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let identity = "file:///b\ndefault\nn1";
        let token = DataDirLock::acquire(dir.path(), identity)
            .expect("acquire")
            .expect("free")
            .token()
            .to_owned();
        let file = std::fs::read_dir(dir.path().join("holders"))
            .expect("holders/")
            .next()
            .expect("one lock file")
            .expect("entry")
            .path();
        std::fs::write(&file, "not hex\n").expect("write");
        let lock = DataDirLock::acquire(dir.path(), identity)
            .expect("acquire")
            .expect("free");
        assert!(is_holder_token(lock.token()));
        assert_ne!(lock.token(), token);
        assert_eq!(
            std::fs::read_to_string(&file).expect("read").trim(),
            lock.token()
        );
    }
}
