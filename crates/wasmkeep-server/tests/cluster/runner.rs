//! The cluster test runner: one bucket (a temporary folder, or SeaweedFS
//! under a unique prefix), the deployed classes, a cluster key, optionally a
//! test CA, and N real `wasmkeep serve` processes on loopback ports.
//!
//! Every node's stdout and stderr go to files in the cluster's folder; when a
//! test fails (the cluster is dropped while panicking) the tail of each is
//! printed and the folder is kept. Only the runner's own children are ever
//! signalled, by pid.
//!
//! With [`ClusterOptions::netns`] each node runs in a network namespace of
//! its own (`netns.rs`) and reaches the bucket through a proxy on the test's
//! bridge, so a test can cut and heal its links.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use parking_lot::Mutex;
use wasmkeep_testkit::SeaweedFs;

use crate::client::{Http, Resp};
use crate::fault_proxy::FaultProxy;
use crate::netns::Net;

/// The `wasmkeep` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_wasmkeep");
/// Longest wait for a node to answer `/_wasmkeep/health` with 200.
pub const READY_TIME_MAX: Duration = Duration::from_secs(60);
/// Longest wait for a node to exit after SIGTERM.
pub const STOP_TIME_MAX: Duration = Duration::from_secs(30);
/// Pause between two polls of a node's health or metrics.
pub const POLL_PERIOD: Duration = Duration::from_millis(50);
/// Lines of each log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;
/// Bytes read from the end of a log to find its last lines.
const LOG_TAIL_BYTES: u64 = 64 * 1024;
/// Attempts at starting a node whose port was taken meanwhile.
const START_ATTEMPTS_MAX: usize = 3;
/// The app every cluster test deploys into.
pub const APP: &str = "cluster";

/// Where the cluster keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketKind {
    /// `file://` in the cluster's temporary folder.
    Folder,
    /// The test binary's shared SeaweedFS, under a unique prefix.
    SeaweedFs,
    /// A SeaweedFS of this cluster alone (it may be paused with SIGSTOP).
    PrivateSeaweedFs,
}

/// What [`Cluster::start`] starts.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// A short name for logs and the bucket prefix.
    pub name: String,
    pub nodes: usize,
    pub bucket: BucketKind,
    /// Listeners on https with a test CA.
    pub tls: bool,
    pub heartbeat: Duration,
    pub lease_ttl: Duration,
    /// `(class, guest file name under target/wasm)` deployed before the nodes start.
    pub classes: Vec<(String, String)>,
    /// More flags for every node.
    pub extra_args: Vec<String>,
    /// Nodes started without `--cluster-key-file`: they run alone and do not
    /// advertise `take` (heartbeat line 11), like a node of an older release.
    pub without_cluster_key: Vec<usize>,
    /// The nodes reach the S3 server through a [`FaultProxy`] the test can
    /// tell to refuse some requests (SeaweedFS buckets only).
    pub bucket_proxy: bool,
    /// More environment variables for every node.
    pub env: Vec<(String, String)>,
    /// Each node in a network namespace of its own, the bucket behind a
    /// [`FaultProxy`] on the test's bridge (`netns.rs`; S3 buckets only,
    /// root only: `crate::run` skips the test elsewhere).
    pub netns: bool,
}

impl ClusterOptions {
    /// Three nodes, the counter, heartbeat 300 ms and a 2 s lease.
    pub fn new(name: &str, bucket: BucketKind, tls: bool) -> Self {
        Self {
            name: name.to_owned(),
            nodes: 3,
            bucket,
            tls,
            heartbeat: Duration::from_millis(300),
            lease_ttl: Duration::from_secs(2),
            classes: vec![("counter".to_owned(), "counter".to_owned())],
            extra_args: Vec::new(),
            without_cluster_key: Vec::new(),
            bucket_proxy: false,
            env: Vec::new(),
            netns: false,
        }
    }

    pub fn with_class(mut self, class: &str, guest: &str) -> Self {
        self.classes.push((class.to_owned(), guest.to_owned()));
        self
    }
}

/// The test CA: one self-signed certificate for 127.0.0.1, used by every
/// node as its certificate and by everyone as the root.
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// One node process.
struct NodeProcess {
    id: String,
    port: u16,
    /// Behind a lock so a node can be killed while requests borrow the cluster.
    child: Mutex<Option<Child>>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// A running cluster; dropping it kills every node it started.
pub struct Cluster {
    options: ClusterOptions,
    /// `None` once kept for a failed test.
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    bucket_url: String,
    env: Vec<(String, String)>,
    private_seaweedfs: Option<SeaweedFs>,
    seaweedfs_paused: bool,
    proxy: Option<FaultProxy>,
    /// The namespaces of [`ClusterOptions::netns`]; dropped after the
    /// nodes are killed (`Drop` kills them before the fields drop).
    net: Option<Net>,
    key_file: PathBuf,
    tls: Option<TlsFiles>,
    nodes: Vec<NodeProcess>,
    pub http: Http,
}

/// The `--data-dir` of every node: the compiled-component cache, shared by
/// all tests so each guest compiles once.
/// Where deploys compile components (shared by every cluster test).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasmkeep-cluster-tests-cache")
}

/// `target/wasm/<name>.wasm`, built by scripts/build-guests.
pub fn guest(name: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm")
        .join(format!("{name}.wasm"));
    if !path.is_file() {
        bail!("{} is missing: run scripts/build-guests", path.display());
    }
    Ok(path)
}

/// A short random hex string.
fn unique() -> String {
    hex::encode(rand::random::<[u8; 6]>())
}

fn format_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The last `lines` lines of a file.
fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return "(no log)".to_owned();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut raw = Vec::new();
    let _ = file.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn signal(child: &Child, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: a plain syscall on our own, not yet reaped child.
    unsafe { libc::kill(pid, signal) };
}

impl Cluster {
    /// Prepares the bucket, deploys the classes and starts every node; returns
    /// once all answer `/_wasmkeep/health` with 200.
    pub async fn start(options: ClusterOptions) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("wasmkeep-cluster-{}-", options.name))
            .tempdir()
            .context("creating the cluster folder")?;
        let dir_path = dir.path().to_owned();
        let mut private_seaweedfs = None;
        let (bucket_url, env) = match options.bucket {
            BucketKind::Folder => (
                format!("file://{}", dir_path.join("bucket").display()),
                Vec::new(),
            ),
            BucketKind::SeaweedFs => {
                let server = SeaweedFs::shared().context("starting the shared SeaweedFS")?;
                let prefix = format!("cluster-{}-{}", options.name, unique());
                (server.bucket_url(&prefix), server.env())
            }
            BucketKind::PrivateSeaweedFs => {
                let server = tokio::task::spawn_blocking(SeaweedFs::start)
                    .await
                    .context("SeaweedFS start task")?
                    .context("starting a private SeaweedFS")?;
                let prefix = format!("cluster-{}", options.name);
                let found = (server.bucket_url(&prefix), server.env());
                private_seaweedfs = Some(server);
                found
            }
        };

        let net = if options.netns {
            ensure!(
                options.bucket != BucketKind::Folder,
                "nodes in namespaces reach the bucket over the network: an S3 bucket"
            );
            let nodes = options.nodes;
            Some(
                tokio::task::spawn_blocking(move || Net::create(nodes))
                    .await
                    .context("the namespace setup task")?
                    .context("setting up the nodes' network namespaces")?,
            )
        } else {
            None
        };
        let mut proxy = None;
        let mut env = env;
        if options.bucket_proxy || net.is_some() {
            ensure!(
                options.bucket != BucketKind::Folder,
                "a bucket proxy needs an S3 bucket"
            );
            let endpoint = env
                .iter_mut()
                .find(|(k, _)| k == "AWS_ENDPOINT_URL")
                .context("the S3 environment has no endpoint")?;
            let started = match &net {
                Some(net) => {
                    let listener = tokio::net::TcpListener::from_std(net.bucket_listener()?)
                        .context("the bucket's listener")?;
                    FaultProxy::start_on(listener, &endpoint.1)?
                }
                None => FaultProxy::start(&endpoint.1).await?,
            };
            endpoint.1 = started.endpoint();
            proxy = Some(started);
        }

        let key_file = dir_path.join("cluster.key");
        std::fs::write(&key_file, hex::encode(rand::random::<[u8; 32]>()))
            .context("writing the cluster key")?;

        let tls = if options.tls {
            let mut names = vec!["127.0.0.1".to_owned()];
            if let Some(net) = &net {
                names.extend((0..options.nodes).map(|i| net.node_addr(i).to_string()));
            }
            let rcgen::CertifiedKey { cert, signing_key } =
                rcgen::generate_simple_self_signed(names)
                    .context("generating the test certificate")?;
            let files = TlsFiles {
                cert: dir_path.join("cert.pem"),
                key: dir_path.join("key.pem"),
            };
            std::fs::write(&files.cert, cert.pem()).context("writing cert.pem")?;
            std::fs::write(&files.key, signing_key.serialize_pem()).context("writing key.pem")?;
            Some(files)
        } else {
            None
        };
        let http = Http::new(tls.as_ref().map(|t| t.cert.as_path()))?;

        let mut cluster = Cluster {
            nodes: Vec::new(),
            options,
            dir: Some(dir),
            dir_path,
            bucket_url,
            env,
            private_seaweedfs,
            seaweedfs_paused: false,
            proxy,
            net,
            key_file,
            tls,
            http,
        };
        for (class, guest_name) in cluster.options.classes.clone() {
            let path = guest(&guest_name)?;
            let path = path.display().to_string();
            let cache = data_dir().display().to_string();
            cluster
                .cli(&["deploy", &class, &path, "--data-dir", &cache])
                .await
                .with_context(|| format!("deploying {class}"))?;
        }
        for i in 0..cluster.options.nodes {
            cluster.nodes.push(NodeProcess {
                id: format!("n{i}"),
                port: 0,
                child: Mutex::new(None),
                stdout: cluster.dir_path.join(format!("n{i}.out")),
                stderr: cluster.dir_path.join(format!("n{i}.err")),
            });
        }
        // Start all, then wait for all: their starts overlap.
        for i in 0..cluster.options.nodes {
            cluster.spawn(i, true)?;
        }
        for i in 0..cluster.options.nodes {
            cluster.wait_ready(i).await?;
        }
        Ok(cluster)
    }

    /// Runs `wasmkeep ARGS --bucket URL --app APP` with the bucket's
    /// environment; returns stdout, or an error with stderr.
    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = tokio::process::Command::new(BIN)
            .args(args)
            .args(["--bucket", &self.bucket_url, "--app", APP])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(READY_TIME_MAX, output)
            .await
            .with_context(|| format!("wasmkeep {args:?} did not finish within {READY_TIME_MAX:?}"))?
            .with_context(|| format!("running wasmkeep {args:?}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!(
                "wasmkeep {args:?} failed with {}:\n{}{stdout}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(stdout)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Spawns node `i` (a new port when `new_port`, else its old one).
    fn spawn(&mut self, i: usize, new_port: bool) -> anyhow::Result<()> {
        if new_port {
            self.nodes[i].port = wasmkeep_testkit::free_port().context("picking a port")?;
        }
        let node = &self.nodes[i];
        let listen = format!("{}:{}", self.node_host(i), node.port);
        let advertise = format!("{}://{listen}", self.scheme());
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .args(["--bucket", &self.bucket_url, "--app", APP])
            .args(["--node-id", &node.id])
            .args(["--listen", &listen, "--advertise", &advertise]);
        if !self.options.without_cluster_key.contains(&i) {
            command.arg("--cluster-key-file").arg(&self.key_file);
        }
        command
            .args(["--heartbeat", &format_duration(self.options.heartbeat)])
            .args(["--lease-ttl", &format_duration(self.options.lease_ttl)])
            .arg("--data-dir")
            .arg(data_dir());
        if let Some(tls) = &self.tls {
            command
                .arg("--tls-cert")
                .arg(&tls.cert)
                .arg("--tls-key")
                .arg(&tls.key)
                .arg("--tls-ca")
                .arg(&tls.cert);
        }
        command.args(&self.options.extra_args);
        let open = |path: &Path| {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            writeln!(file, "===== start of {} on {listen} =====", node.id)?;
            anyhow::Ok(file)
        };
        command
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(
                self.options
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .env(
                "RUST_LOG",
                std::env::var("WASMKEEP_TEST_NODE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .current_dir(&self.dir_path)
            .stdin(Stdio::null())
            .stdout(open(&node.stdout)?)
            .stderr(open(&node.stderr)?);
        // SAFETY: the closure only calls async-signal-safe prctl.
        unsafe {
            command.pre_exec(|| {
                // Die with the test if it dies without dropping the cluster.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        if let Some(net) = &self.net {
            let namespace = net.handle(i);
            // SAFETY: setns is async-signal-safe; the handle stays open
            // while `net` lives, past this spawn.
            unsafe {
                command.pre_exec(move || {
                    if libc::setns(namespace, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().context("spawning wasmkeep serve")?;
        *self.nodes[i].child.lock() = Some(child);
        Ok(())
    }

    /// Polls node `i`'s health until 200; restarts it on a new port if the
    /// port was taken meanwhile.
    async fn wait_ready(&mut self, i: usize) -> anyhow::Result<()> {
        let mut attempts = 1;
        let deadline = Instant::now() + READY_TIME_MAX;
        loop {
            let exited = match self.nodes[i].child.lock().as_mut() {
                Some(child) => child.try_wait().context("checking a node")?,
                None => bail!("node {i} is not running"),
            };
            if let Some(status) = exited {
                *self.nodes[i].child.lock() = None;
                let log = tail(&self.nodes[i].stderr, LOG_TAIL_LINES);
                if attempts < START_ATTEMPTS_MAX && log.contains("in use") {
                    attempts += 1;
                    self.spawn(i, true)?;
                    continue;
                }
                bail!(
                    "node {} exited with {status} before it was ready:\n{log}",
                    self.nodes[i].id
                );
            }
            let url = format!("{}/_wasmkeep/health", self.node_url(i));
            if let Ok(r) = self.http.get(&url).await
                && r.status == 200
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {} did not answer {url} with 200 within {READY_TIME_MAX:?}:\n{}",
                    self.nodes[i].id,
                    tail(&self.nodes[i].stderr, LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }

    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s address: loopback, or its namespace's.
    fn node_host(&self, i: usize) -> String {
        match &self.net {
            Some(net) => net.node_addr(i).to_string(),
            None => "127.0.0.1".to_owned(),
        }
    }

    /// `http(s)://ADDRESS:PORT` of node `i`.
    pub fn node_url(&self, i: usize) -> String {
        format!(
            "{}://{}:{}",
            self.scheme(),
            self.node_host(i),
            self.nodes[i].port
        )
    }

    /// The nodes' network namespaces ([`ClusterOptions::netns`]).
    pub fn net(&self) -> anyhow::Result<&Net> {
        self.net
            .as_ref()
            .context("the cluster was started without netns")
    }

    pub fn node_id(&self, i: usize) -> &str {
        &self.nodes[i].id
    }

    /// The index of the node with this id.
    pub fn index_of(&self, node_id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == node_id)
    }

    pub fn bucket_url(&self) -> &str {
        &self.bucket_url
    }

    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.lock().is_some()
    }

    /// `URL_of_node_i + path`
    pub fn url(&self, i: usize, path: &str) -> String {
        format!("{}{path}", self.node_url(i))
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill9(&self, i: usize) {
        let child = self.nodes[i].child.lock().take();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM node `i` and wait for it to exit (SIGKILL after
    /// [`STOP_TIME_MAX`], then an error).
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.nodes[i].child.lock().take() else {
            bail!("node {i} is not running");
        };
        signal(&child, libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIME_MAX;
        loop {
            if let Some(status) = child.try_wait().context("waiting for a node")? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "node {} did not exit within {STOP_TIME_MAX:?} of SIGTERM",
                    self.nodes[i].id
                );
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }

    /// [`stop`](Self::stop) through a shared borrow, so requests may run
    /// meanwhile.
    pub async fn sigterm_and_wait(&self, i: usize) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.nodes[i].child.lock().take() else {
            bail!("node {i} is not running");
        };
        signal(&child, libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIME_MAX;
        loop {
            if let Some(status) = child.try_wait().context("waiting for a node")? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "node {} did not exit within {STOP_TIME_MAX:?} of SIGTERM",
                    self.nodes[i].id
                );
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }

    /// Starts node `i` again (same id, port and URL) and waits until ready.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        if self.is_running(i) {
            bail!("node {i} is still running");
        }
        self.spawn(i, false)?;
        self.wait_ready(i).await
    }

    /// The value of a series of node `i` (summed over its label sets), if present.
    pub async fn metric(&self, i: usize, name: &str) -> anyhow::Result<Option<f64>> {
        let r = self.http.get(&self.url(i, "/_wasmkeep/metrics")).await?;
        if r.status != 200 {
            bail!("metrics of node {i}: status {}", r.status);
        }
        // Summed over its label sets: a series labelled by tenant and
        // class gives the node's value.
        Ok(wasmkeep_server::ops::metrics::sum(&r.text(), name))
    }

    /// Sends until not 503 (or the deadline), to node `i`.
    pub async fn send_retrying(
        &self,
        i: usize,
        method: &str,
        path: &str,
        deadline: Instant,
    ) -> anyhow::Result<Resp> {
        self.http
            .send_retrying_503(method, &self.url(i, path), deadline)
            .await
    }

    /// The SeaweedFS pid of a private bucket server.
    fn private_seaweedfs_pid(&self) -> anyhow::Result<libc::pid_t> {
        let server = self
            .private_seaweedfs
            .as_ref()
            .context("only a PrivateSeaweedFs bucket can be paused")?;
        libc::pid_t::try_from(server.pid()).context("pid out of range")
    }

    /// SIGSTOP the cluster's private SeaweedFS: the bucket stops answering.
    pub fn pause_bucket(&mut self) -> anyhow::Result<()> {
        let pid = self.private_seaweedfs_pid()?;
        // SAFETY: a plain syscall on the SeaweedFS this cluster started.
        if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
            bail!("SIGSTOP failed: {}", std::io::Error::last_os_error());
        }
        self.seaweedfs_paused = true;
        Ok(())
    }

    /// SIGCONT the cluster's private SeaweedFS.
    pub fn resume_bucket(&mut self) -> anyhow::Result<()> {
        let pid = self.private_seaweedfs_pid()?;
        // SAFETY: as in `pause_bucket`.
        if unsafe { libc::kill(pid, libc::SIGCONT) } != 0 {
            bail!("SIGCONT failed: {}", std::io::Error::last_os_error());
        }
        self.seaweedfs_paused = false;
        Ok(())
    }

    /// The cluster's bucket, opened as the nodes open it.
    pub async fn bucket(&self) -> anyhow::Result<std::sync::Arc<dyn wasmkeep_bucket::Bucket>> {
        if let Some(rest) = self.bucket_url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let s3 = wasmkeep_bucket::S3Bucket::from_env_with(bucket, prefix, &self.env)
                .context("opening the cluster's S3 bucket")?;
            return Ok(std::sync::Arc::new(s3));
        }
        wasmkeep_bucket::open(&self.bucket_url)
            .await
            .context("opening the cluster's bucket")
    }

    /// The proxy between the nodes and the S3 server
    /// ([`ClusterOptions::bucket_proxy`]).
    pub fn fault_proxy(&self) -> anyhow::Result<&FaultProxy> {
        self.proxy
            .as_ref()
            .context("the cluster was started without bucket_proxy")
    }

    /// Node `i`'s log (stderr) so far.
    pub fn node_log(&self, i: usize) -> String {
        std::fs::read(&self.nodes[i].stderr)
            .map(|raw| String::from_utf8_lossy(&raw).into_owned())
            .unwrap_or_default()
    }

    /// Prints the tail of every node's logs.
    pub fn print_logs(&self) {
        for node in &self.nodes {
            eprintln!(
                "----- {} stderr ({}) -----\n{}",
                node.id,
                node.stderr.display(),
                tail(&node.stderr, LOG_TAIL_LINES)
            );
            let out = tail(&node.stdout, LOG_TAIL_LINES / 4);
            if !out.trim().is_empty() {
                eprintln!("----- {} stdout -----\n{out}", node.id);
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.seaweedfs_paused {
            let _ = self.resume_bucket();
        }
        for node in &self.nodes {
            let child = node.child.lock().take();
            if let Some(mut child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "===== cluster {} failed; bucket {} =====",
                self.options.name, self.bucket_url
            );
            self.print_logs();
            if let Some(dir) = self.dir.take() {
                eprintln!("===== logs kept in {} =====", dir.keep().display());
            }
        }
    }
}
