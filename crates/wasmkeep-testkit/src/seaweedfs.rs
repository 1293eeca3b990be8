//! Starts, waits for, and stops one `weed mini` process.
//!
//! The child is spawned from a keeper thread that lives as long as the
//! server, with `PR_SET_PDEATHSIG = SIGKILL`: if the test process dies, the
//! kernel kills `weed` too. A dropped [`SeaweedFs`] kills and reaps its child
//! (by pid, through the keeper) and removes its data folder; the shared
//! instance is stopped the same way by an `atexit` hook.

use std::hash::BuildHasher;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::{Error, Result, io_error};

/// Test credentials written into the server's `s3.json`.
pub const S3_ACCESS_KEY: &str = "wasmkeep-test";
pub const S3_SECRET_KEY: &str = "wasmkeep-test-secret";
pub const S3_REGION: &str = "us-east-1";
/// Longest wait for the server to answer S3 requests on its bucket.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for one step of a readiness probe.
const PROBE_STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// The object the readiness probe writes and deletes again.
const READY_PROBE_KEY: &str = "wasmkeep-testkit-ready-probe";
/// Pause between two readiness probes.
const READY_POLL_PERIOD: Duration = Duration::from_millis(100);
/// Attempts at starting when a port was taken between picking and binding.
const START_ATTEMPTS_MAX: usize = 3;
/// Bytes of the weed log shown when the start fails.
const LOG_TAIL_BYTES: u64 = 4000;
/// SeaweedFS puts each gRPC port at its HTTP port + this.
const GRPC_PORT_OFFSET: u16 = 10_000;

/// True when `WASMKEEP_S3_TESTS=skip`; prints a loud notice naming `test`.
pub fn s3_tests_skipped(test: &str) -> bool {
    let skip = std::env::var("WASMKEEP_S3_TESTS").is_ok_and(|v| v == "skip");
    if skip {
        eprintln!("!!!!! SKIPPED S3 TEST {test}: WASMKEEP_S3_TESTS=skip !!!!!");
    }
    skip
}

/// The workspace's tool folder, as `scripts/install-prereqs` picks it.
const DEFAULT_TOOLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.tools");

/// `weed` from `WASMKEEP_WEED` if set, else from the tool folder
/// (`WASMKEEP_TOOLS`, default the workspace's `.tools`), else from `PATH`.
pub fn find_weed() -> Result<PathBuf> {
    let tools = std::env::var_os("WASMKEEP_TOOLS")
        .map_or_else(|| PathBuf::from(DEFAULT_TOOLS_DIR), PathBuf::from);
    find_weed_in(
        std::env::var_os("WASMKEEP_WEED"),
        &tools,
        std::env::var_os("PATH"),
    )
}

/// [`find_weed`] on given values, so that its order can be tested without
/// changing the process's environment.
fn find_weed_in(
    explicit: Option<std::ffi::OsString>,
    tools: &Path,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    if let Some(explicit) = explicit {
        let explicit = PathBuf::from(explicit);
        return if explicit.is_file() {
            Ok(explicit)
        } else {
            Err(Error::WeedPathInvalid(explicit.display().to_string()))
        };
    }
    let installed = tools.join("venv-sw/bin/weed");
    if installed.is_file() {
        return Ok(installed);
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("weed"))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::WeedNotFound {
            tools: tools.display().to_string(),
        })
}

/// A running SeaweedFS with one bucket.
#[derive(Debug)]
pub struct SeaweedFs {
    s3_port: u16,
    bucket: String,
    pid: u32,
    dir: PathBuf,
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<std::thread::JoinHandle<()>>,
}

static SHARED: OnceLock<Result<SeaweedFs, String>> = OnceLock::new();
/// (pid, data folder) of the shared instance, for the exit hook.
static SHARED_CLEANUP: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

extern "C" fn stop_shared_at_exit() {
    let Ok(mut guard) = SHARED_CLEANUP.lock() else {
        return;
    };
    if let Some((pid, dir)) = guard.take() {
        kill_pid(pid);
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn kill_pid(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain syscall; the pid is our own child, not yet reaped
        // (the keeper reaps it only after this kill).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The lowest HTTP port [`port_pairs`] picks.
const PICKED_PORT_MIN: u16 = 10_000;
/// One past the highest gRPC port [`port_pairs`] picks: Linux hands out
/// ephemeral ports (the local side of outgoing connections) from 32768 up.
const PICKED_PORT_END: u16 = 32_768;

/// `count` ports `p` with `p` and `p + 10000` both free (HTTP and gRPC).
///
/// They come from below the ephemeral range, not from binding port 0: a
/// port the kernel handed out as ephemeral can be handed out again as the
/// local side of an outgoing connection, and weed's own components connect
/// to each other while it starts them one by one. A volume server whose
/// port was taken that way never joins, and every write waits forever.
fn port_pairs(count: usize) -> Result<Vec<u16>> {
    let span = PICKED_PORT_END - GRPC_PORT_OFFSET - PICKED_PORT_MIN;
    let seed = std::collections::hash_map::RandomState::new();
    let mut ports = Vec::with_capacity(count);
    let mut held = Vec::new(); // keep them bound until all are chosen
    for attempt in 0..count * 200 {
        if ports.len() == count {
            break;
        }
        let offset = u16::try_from(seed.hash_one(attempt) % u64::from(span))
            .expect("the offset is below span, a u16");
        let port = PICKED_PORT_MIN + offset;
        let grpc = port + GRPC_PORT_OFFSET;
        if ports.contains(&port) || ports.contains(&grpc) {
            continue;
        }
        let (Ok(a), Ok(b)) = (
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)),
            TcpListener::bind((Ipv4Addr::LOCALHOST, grpc)),
        ) else {
            continue;
        };
        held.push(a);
        held.push(b);
        ports.push(port);
    }
    if ports.len() == count {
        Ok(ports)
    } else {
        Err(Error::NoFreePorts)
    }
}

fn log_tail(path: &Path) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    text
}

impl SeaweedFs {
    /// The one server of this test binary, started on first use. Never
    /// stopped before the process exits.
    pub fn shared() -> Result<&'static SeaweedFs> {
        let started = SHARED.get_or_init(|| {
            let server = SeaweedFs::start().map_err(|e| e.to_string())?;
            if let Ok(mut guard) = SHARED_CLEANUP.lock() {
                *guard = Some((server.pid, server.dir.clone()));
                // SAFETY: registers a plain extern "C" fn with no captured state.
                unsafe { libc::atexit(stop_shared_at_exit) };
            }
            Ok(server)
        });
        started.as_ref().map_err(|e| Error::SharedFailed(e.clone()))
    }

    /// A private server, stopped when dropped.
    pub fn start() -> Result<SeaweedFs> {
        let weed = find_weed()?;
        let mut last = Error::NoFreePorts;
        for _ in 0..START_ATTEMPTS_MAX {
            match Self::start_once(&weed) {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(weed: &Path) -> Result<SeaweedFs> {
        let dir = tempfile::Builder::new()
            .prefix("wasmkeep-seaweedfs-")
            .tempdir()
            .map_err(io_error("create data folder"))?
            .keep();
        let ports = port_pairs(5)?;
        let (s3, master, volume, filer, admin) = (ports[0], ports[1], ports[2], ports[3], ports[4]);
        let bucket = "wasmkeep-test".to_owned();
        let config = dir.join("s3.json");
        std::fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"test","credentials":[{{"accessKey":"{S3_ACCESS_KEY}","secretKey":"{S3_SECRET_KEY}"}}],"actions":["Admin","Read","List","Tagging","Write"]}}]}}"#
            ),
        )
        .map_err(io_error("write s3.json"))?;
        let log_path = dir.join("weed.log");
        let log = std::fs::File::create(&log_path).map_err(io_error("create weed.log"))?;
        let log_err = log.try_clone().map_err(io_error("clone weed.log"))?;
        let mut command = Command::new(weed);
        command
            .arg("mini")
            .arg(format!("-dir={}", dir.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-s3.port={s3}"))
            .arg(format!("-master.port={master}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-filer.port={filer}"))
            .arg(format!("-admin.port={admin}"))
            .arg(format!("-s3.config={}", config.display()))
            .arg(format!("-bucket={bucket}"))
            .arg(format!("-s3.localSocket={}", dir.join("s3.sock").display()))
            .arg(format!(
                "-filer.localSocket={}",
                dir.join("filer.sock").display()
            ))
            .args([
                "-webdav=false",
                "-admin.ui=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.telemetry=false",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        // SAFETY: the closure only calls async-signal-safe prctl.
        unsafe {
            command.pre_exec(|| {
                // Die with the thread that spawned us (the keeper).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }

        // The keeper spawns, waits for readiness, reports, then holds the
        // child until told to stop.
        let (ready_tx, ready_rx) = mpsc::channel::<Result<u32>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let endpoint = format!("http://127.0.0.1:{s3}");
        let probe_bucket = bucket.clone();
        let probe_log = log_path.clone();
        let keeper = std::thread::Builder::new()
            .name("seaweedfs-keeper".to_owned())
            .spawn(move || {
                let mut child = match command.spawn() {
                    Ok(child) => child,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Io {
                            what: "spawn weed".to_owned(),
                            error: e,
                        }));
                        return;
                    }
                };
                let ready = wait_ready(&mut child, s3, &endpoint, &probe_bucket, &probe_log);
                let failed = ready.is_err();
                let _ = ready_tx.send(ready.map(|()| child.id()));
                if !failed {
                    // Until the owner drops (or the process exits).
                    let _ = stop_rx.recv();
                }
                let _ = child.kill();
                let _ = child.wait();
            })
            .map_err(io_error("start keeper thread"))?;
        let pid = match ready_rx.recv() {
            Ok(Ok(pid)) => pid,
            Ok(Err(e)) => {
                let _ = keeper.join();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
            Err(_) => {
                return Err(Error::NotReady {
                    reason: "keeper thread died".to_owned(),
                    log_tail: log_tail(&log_path),
                });
            }
        };
        Ok(SeaweedFs {
            s3_port: s3,
            bucket,
            pid,
            dir,
            stop: Some(stop_tx),
            keeper: Some(keeper),
        })
    }

    /// The S3 port's address on loopback.
    pub fn s3_addr(&self) -> std::net::SocketAddr {
        (std::net::Ipv4Addr::LOCALHOST, self.s3_port).into()
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The bucket created at start.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://BUCKET/PREFIX` (prefix may be empty).
    pub fn bucket_url(&self, prefix: &str) -> String {
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{prefix}", self.bucket)
        }
    }

    /// The `AWS_*` variables a client needs (for a child process's
    /// environment, or `S3Bucket::from_env_with`).
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY.to_owned()),
            ("AWS_REGION", S3_REGION.to_owned()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The process id of `weed`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's data folder (holds `weed.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One readiness probe: a signed listing, then a write, a read and a delete
/// of one object. A listing alone is not enough: it answers as soon as the
/// filer does, while a write also needs a volume server that has joined the
/// master, and a write issued before that waits (up to the client's 30 s
/// timeout per request) instead of failing.
async fn probe_bucket(store: &object_store::aws::AmazonS3) -> std::result::Result<(), String> {
    let step = |what: &'static str| {
        move |e: tokio::time::error::Elapsed| format!("{what} timed out after {e}")
    };
    let mut listing = store.list(None);
    match tokio::time::timeout(PROBE_STEP_TIMEOUT, listing.next())
        .await
        .map_err(step("listing"))?
    {
        None | Some(Ok(_)) => {}
        Some(Err(e)) => return Err(format!("listing: {e}")),
    }
    let path = object_store::path::Path::from(READY_PROBE_KEY);
    tokio::time::timeout(
        PROBE_STEP_TIMEOUT,
        store.put(&path, object_store::PutPayload::from_static(b"ready")),
    )
    .await
    .map_err(step("write"))?
    .map_err(|e| format!("write: {e}"))?;
    let read = tokio::time::timeout(PROBE_STEP_TIMEOUT, async {
        store.get(&path).await?.bytes().await
    })
    .await
    .map_err(step("read"))?
    .map_err(|e| format!("read: {e}"))?;
    if read.as_ref() != b"ready" {
        return Err(format!("read back {} bytes, not the probe's", read.len()));
    }
    tokio::time::timeout(PROBE_STEP_TIMEOUT, store.delete(&path))
        .await
        .map_err(step("delete"))?
        .map_err(|e| format!("delete: {e}"))
}

/// Polls until the S3 port accepts connections and the bucket takes a
/// write and gives it back ([`probe_bucket`]), the child exits, or
/// [`STARTUP_TIMEOUT`] passes.
fn wait_ready(
    child: &mut Child,
    port: u16,
    endpoint: &str,
    bucket: &str,
    log_path: &Path,
) -> Result<()> {
    let not_ready = |reason: String| Error::NotReady {
        reason,
        log_tail: log_tail(log_path),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_error("probe runtime"))?;
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_access_key_id(S3_ACCESS_KEY)
        .with_secret_access_key(S3_SECRET_KEY)
        .with_region(S3_REGION)
        .with_allow_http(true)
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .map_err(|e| not_ready(format!("probe client: {e}")))?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut last = String::from("not probed yet");
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(not_ready(format!("weed exited early with {status}")));
        }
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            let probe = runtime.block_on(probe_bucket(&store));
            match probe {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        } else {
            last = "S3 port not accepting connections".to_owned();
        }
        std::thread::sleep(READY_POLL_PERIOD);
    }
    let _ = child.kill();
    Err(not_ready(format!(
        "timed out after {STARTUP_TIMEOUT:?}; last probe: {last}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with an empty file at `rel`, returned with the file's path.
    fn with_file(rel: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join(rel);
        std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&file, b"").expect("write");
        (dir, file)
    }

    #[test]
    fn weed_is_found_in_the_explicit_path_then_the_tools_then_path() {
        let (tools, installed) = with_file("venv-sw/bin/weed");
        let (on_path, path_weed) = with_file("bin/weed");
        let (other, explicit) = with_file("my-weed");
        let path = Some(on_path.path().join("bin").into_os_string());

        let found = find_weed_in(
            Some(explicit.clone().into_os_string()),
            tools.path(),
            path.clone(),
        );
        assert_eq!(found.expect("explicit"), explicit);

        let found = find_weed_in(None, tools.path(), path.clone());
        assert_eq!(found.expect("installed"), installed);

        let found = find_weed_in(None, other.path(), path);
        assert_eq!(found.expect("on PATH"), path_weed);
    }

    #[test]
    fn a_missing_weed_names_where_it_looked() {
        let empty = tempfile::tempdir().expect("temp dir");
        let (tools, _installed) = with_file("venv-sw/bin/weed");
        let bad = empty.path().join("nope");

        // An explicit path that is not a file is refused, not replaced.
        let err = find_weed_in(Some(bad.clone().into_os_string()), tools.path(), None)
            .expect_err("not a file");
        assert!(matches!(&err, Error::WeedPathInvalid(p) if *p == bad.display().to_string()));
        assert!(err.to_string().contains("WASMKEEP_WEED="), "{err}");

        let err = find_weed_in(None, empty.path(), Some(empty.path().into())).expect_err("nowhere");
        assert!(
            err.to_string()
                .contains(&empty.path().display().to_string()),
            "names the tools folder: {err}"
        );
        assert!(err.to_string().contains("scripts/install-prereqs"), "{err}");
    }
}
