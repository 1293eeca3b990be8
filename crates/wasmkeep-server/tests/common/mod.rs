//! Test harness: starts the real `wasmkeep` binary on a free loopback port,
//! waits for `/_wasmkeep/health`, and talks plain HTTP/1.1 to it.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_wasmkeep");

/// How long a test waits for something that should happen soon.
pub const WAIT_MAX: Duration = Duration::from_secs(60);

pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-guests",
        path.display()
    );
    path
}

/// The compiled-component cache shared by every test (saves compile time).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasmkeep-server-tests-cache")
}

/// A guest component's bytes (for nodes started in the test's process).
pub fn guest_bytes(name: &str) -> Vec<u8> {
    std::fs::read(guest(name)).unwrap()
}

/// A runtime for nodes started in the test's process, compiling into the
/// shared cache.
pub fn runtime(instances_max: u32) -> wasmkeep_runtime::Runtime {
    wasmkeep_runtime::Runtime::new(wasmkeep_runtime::RuntimeConfig {
        cache_dir: Some(data_dir().join("components")),
        instances_max,
        ..wasmkeep_runtime::RuntimeConfig::default()
    })
    .unwrap()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Server {
    pub child: Child,
    pub addr: String,
    pub log: PathBuf,
}

impl Server {
    /// Starts `wasmkeep <args...> --listen 127.0.0.1:<free> --data-dir <cache>`
    /// in `dir` and waits until it is healthy.
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        Self::start_on(dir, args, free_port())
    }

    pub fn start_on(dir: &Path, args: &[&str], port: u16) -> Server {
        Self::start_with_env(dir, args, port, &[])
    }

    pub fn start_with_env(
        dir: &Path,
        args: &[&str],
        port: u16,
        env: &[(String, String)],
    ) -> Server {
        Self::start_full(dir, args, port, env, &data_dir())
    }

    /// [`start`](Self::start) with its own `--data-dir` (compiles anew).
    pub fn start_with_data_dir(dir: &Path, args: &[&str], data: &Path) -> Server {
        Self::start_full(dir, args, free_port(), &[], data)
    }

    fn start_full(
        dir: &Path,
        args: &[&str],
        port: u16,
        env: &[(String, String)],
        data: &Path,
    ) -> Server {
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join(format!("node-{port}-{}.log", rand_suffix()));
        let stderr = std::fs::File::create(&log).unwrap();
        let stdout = std::fs::File::create(log.with_extension("out")).unwrap();
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            data.display().to_string(),
        ]);
        let child = Command::new(BIN)
            .args(&all)
            .current_dir(dir)
            .env("RUST_LOG", "info,wasmkeep_server=debug")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut server = Server { child, addr, log };
        server.wait_healthy();
        server
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "wasmkeep exited with {status} before it was healthy:\n{}",
                    self.logs()
                );
            }
            if let Ok(r) = try_request(&self.addr, "GET", "/_wasmkeep/health", &[], b"")
                && r.status == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "wasmkeep never became healthy:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn req(&self, method: &str, path: &str) -> Resp {
        request(&self.addr, method, path, &[], b"")
    }

    pub fn metric(&self, name: &str) -> f64 {
        metric_in(&self.req("GET", "/_wasmkeep/metrics").text(), name)
    }

    /// Polls `check` until it is true.
    pub fn wait_until(&self, what: &str, mut check: impl FnMut(&Server) -> bool) {
        let deadline = Instant::now() + WAIT_MAX;
        while !check(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// SIGTERM and wait; returns whether the exit was clean.
    pub fn stop(mut self) -> bool {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status.success()
    }

    /// SIGKILL (kill -9) and wait.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish() % 1_000_000
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json_code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", self.text()));
        v["code"].as_str().unwrap_or_default().to_owned()
    }
}

pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    try_request(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// One request on a fresh connection (`Connection: close`).
pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(WAIT_MAX))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    let mut has_length = false;
    for (name, value) in headers {
        has_length |= name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding");
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_length {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> std::io::Result<Resp> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap_or("0").trim(), 16)
                .unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

/// The value of the series `name` in a metrics page, summed over its
/// label sets (a series labelled by tenant and class: the node's value).
pub fn metric_in(text: &str, name: &str) -> f64 {
    wasmkeep_server::ops::metrics::sum(text, name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// The sample of `name` with exactly these labels in a metrics page.
pub fn metric_labelled(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    wasmkeep_server::ops::metrics::labelled(text, name, labels)
}

/// The value of the bundled counter `/demo/counter/<actor>` (must answer 200).
pub fn count(server: &Server, actor: &str) -> u64 {
    let r = server.req("GET", &format!("/demo/counter/{actor}/value"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text().trim().parse().unwrap()
}

/// `file://` URL of a folder bucket inside `dir`.
pub fn folder_bucket(dir: &Path) -> String {
    format!("file://{}", dir.join("bucket").display())
}

/// The stdout of a CLI command that must succeed (its stderr in the failure).
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The stderr of a CLI command that must fail (its stdout in the failure).
pub fn failed(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "succeeded unexpectedly: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}
