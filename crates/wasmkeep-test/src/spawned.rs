//! The node as a process (ADR 0075): `wasmkeep dev --test-routes` on a
//! memory bucket, a temporary data folder and a free loopback port, driven
//! over HTTP through its test routes (`front::test_routes`, which call the
//! same `direct` methods as the in-process mode). The project that uses it
//! compiles no node: only this crate, hyper's client and tungstenite.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use wasmkeep_types::{ActorId, ClassName};

use crate::{Error, Response, Result, Rows, Socket, SqlValue, Written};

/// How long the binary may take to start serving (it compiles nothing at
/// start; a slow machine under load takes seconds).
const START_TIME_MAX: Duration = Duration::from_secs(60);

/// How long one HTTP call to the node may take (a deploy compiles a
/// TypeScript component: some seconds).
const CALL_TIME_MAX: Duration = Duration::from_secs(300);

/// How many of the node's last log lines an error about it quotes.
const LOG_TAIL_LINES_MAX: usize = 40;

/// What `wasmkeep dev` prints on stdout once it serves.
const SERVING_PREFIX: &str = "wasmkeep dev: serving on http://";

/// The node's last log lines (its stderr), for errors.
#[derive(Debug, Default)]
struct LogTail(Mutex<VecDeque<String>>);

impl LogTail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == LOG_TAIL_LINES_MAX {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().map(|l| format!("  {l}\n")).collect()
    }
}

/// The node's address and the client calls to it.
#[derive(Debug)]
struct Client {
    addr: SocketAddr,
}

/// A call's answer: status, headers, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);

impl Client {
    /// One HTTP/1.1 request on a new loopback connection.
    async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Answer> {
        let io_error = |what: &str| {
            let what = format!("{what} {method} {path} on {}", self.addr);
            move |source| Error::Io { what, source }
        };
        let http_error = |e: hyper::Error| Error::Io {
            what: format!("{method} {path} on {}", self.addr),
            source: std::io::Error::other(e),
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(io_error("connecting for"))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(http_error)?;
            tokio::spawn(connection);
            let mut request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, self.addr.to_string());
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let request = request
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| Error::Unexpected(format!("{method} {path}: {e}")))?;
            let response = sender.send_request(request).await.map_err(http_error)?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(http_error)?
                .to_bytes()
                .to_vec();
            Ok((status, headers, body))
        };
        tokio::time::timeout(CALL_TIME_MAX, exchange)
            .await
            .map_err(|_| Error::Timeout("the node's answer", CALL_TIME_MAX))?
    }

    /// A test route: its JSON answer (`null` for none); any status but
    /// 2xx is the node's refusal.
    async fn test_route(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<serde_json::Value> {
        let (status, _, body) = self
            .call(method, &format!("/_wasmkeep/test{path}"), &[], body)
            .await?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|json| json["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            return Err(Error::Refused { status, message });
        }
        if body.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&body)
            .map_err(|e| Error::Unexpected(format!("{path} answered no JSON: {e}")))
    }
}

/// One `wasmkeep dev --test-routes` process (see the crate's
/// documentation); killed when dropped.
#[derive(Debug)]
pub struct TestNode {
    child: Child,
    client: Arc<Client>,
    /// The node's wall clock minus this machine's, as last read (only
    /// [`advance`](TestNode::advance) moves it).
    offset_ms: AtomicI64,
    _log: Arc<LogTail>,
    // Removed when the node is dropped (after the process is killed).
    _data_dir: tempfile::TempDir,
}

impl TestNode {
    /// Starts `wasmkeep dev --test-routes` (the binary of
    /// [`crate::wasmkeep_bin`]) on a memory bucket, a temporary data folder
    /// and a free loopback port, and waits until it serves.
    pub async fn start() -> Result<TestNode> {
        Self::start_binary(&crate::wasmkeep_bin()?).await
    }

    /// [`start`](Self::start) with the given binary.
    pub async fn start_binary(bin: &Path) -> Result<TestNode> {
        let data_dir = tempfile::tempdir().map_err(|source| Error::Io {
            what: "making the data folder".into(),
            source,
        })?;
        share_component_cache(data_dir.path());
        let mut child = Command::new(bin)
            .args(["dev", "--test-routes", "--bucket", "memory://"])
            .args(["--listen", "127.0.0.1:0", "--console", "off"])
            .arg("--data-dir")
            .arg(data_dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Io {
                what: format!("starting {} dev --test-routes", bin.display()),
                source,
            })?;
        let log = Arc::new(LogTail::default());
        if let Some(stderr) = child.stderr.take() {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.push(line);
                }
            });
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Unexpected("the node's stdout was not piped".into()))?;
        let addr = match tokio::time::timeout(START_TIME_MAX, serving_addr(stdout)).await {
            Ok(Some(addr)) => addr,
            Ok(None) => {
                let status = child.wait().await.ok();
                return Err(Error::Binary(format!(
                    "{} dev --test-routes stopped before serving ({}):\n{}",
                    bin.display(),
                    status.map_or_else(|| "status unknown".into(), |s| s.to_string()),
                    log.text()
                )));
            }
            Err(_) => {
                return Err(Error::Binary(format!(
                    "{} dev --test-routes did not serve within {START_TIME_MAX:?}:\n{}",
                    bin.display(),
                    log.text()
                )));
            }
        };
        let node = TestNode {
            child,
            client: Arc::new(Client { addr }),
            offset_ms: AtomicI64::new(0),
            _log: log,
            _data_dir: data_dir,
        };
        node.wait_healthy().await?;
        Ok(node)
    }

    /// Polls the health route until it answers 200.
    async fn wait_healthy(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIME_MAX;
        loop {
            if let Ok((200, _, _)) = self
                .client
                .call("GET", "/_wasmkeep/health", &[], Vec::new())
                .await
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout("the node's health answer", START_TIME_MAX));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deploys a component as `class` (validated and compiled as `wasmkeep
    /// deploy` does) and loads it on the node; a new version of a class
    /// already deployed is used from each actor's next event.
    pub async fn deploy(&self, class: &str, component: &[u8]) -> Result<()> {
        let class = ClassName::new(class)?;
        self.client
            .test_route("POST", &format!("/classes/{class}"), component.to_vec())
            .await?;
        Ok(())
    }

    /// [`deploy`](Self::deploy) of a `.wasm` file.
    pub async fn deploy_file(&self, class: &str, path: impl AsRef<Path>) -> Result<()> {
        self.deploy(class, &crate::read_component(path.as_ref())?)
            .await
    }

    /// A handle on the actor `TENANT/CLASS/NAME` (nothing runs until it is
    /// asked something).
    pub fn actor(&self, id: &str) -> Result<TestActor> {
        Ok(TestActor {
            client: Arc::clone(&self.client),
            id: ActorId::parse(id)?,
        })
    }

    /// The node's wall clock now, in milliseconds since the Unix epoch
    /// (alarm times are on it): this machine's, plus how far
    /// [`advance`](Self::advance) moved it.
    pub fn now_ms(&self) -> i64 {
        system_ms().saturating_add(self.offset_ms.load(Ordering::SeqCst))
    }

    /// Moves the clock forward by `by` and runs every alarm due by then,
    /// each in its actor's mailbox; returns once they ran (and their
    /// writes are durable), with the actors whose alarm ran.
    pub async fn advance(&self, by: Duration) -> Result<Vec<ActorId>> {
        let ms = by.as_millis();
        let answer = self
            .client
            .test_route("POST", &format!("/clock/advance?ms={ms}"), Vec::new())
            .await;
        // The node moved its clock if it took the call, even if an alarm
        // then failed: read where it stands either way.
        self.sync_clock().await?;
        let answer = answer?;
        answer["ran"]
            .as_array()
            .ok_or_else(|| Error::Unexpected(format!("clock/advance answered {answer}")))?
            .iter()
            .map(|id| {
                let id = id
                    .as_str()
                    .ok_or_else(|| Error::Unexpected(format!("clock/advance answered {answer}")))?;
                Ok(ActorId::parse(id)?)
            })
            .collect()
    }

    /// Reads the node's clock and keeps its offset from this machine's.
    async fn sync_clock(&self) -> Result<()> {
        let answer = self.client.test_route("GET", "/clock", Vec::new()).await?;
        let node_ms = answer["now_ms"]
            .as_i64()
            .ok_or_else(|| Error::Unexpected(format!("clock answered {answer}")))?;
        self.offset_ms
            .store(node_ms.saturating_sub(system_ms()), Ordering::SeqCst);
        Ok(())
    }

    /// The node's HTTP address, for any other client (`http://{addr}/...`).
    pub fn addr(&self) -> SocketAddr {
        self.client.addr
    }

    /// Stops the node (killed: its memory bucket goes with it).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// This machine's wall clock, in milliseconds since the Unix epoch.
fn system_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// Reads the node's stdout until it says where it serves; `None` if it
/// ended first. The rest of stdout is read and dropped.
async fn serving_addr(stdout: tokio::process::ChildStdout) -> Option<SocketAddr> {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(rest) = line.strip_prefix(SERVING_PREFIX) else {
            continue;
        };
        let addr = rest.split_whitespace().next()?.parse().ok()?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        return Some(addr);
    }
    None
}

/// Points the node's compiled-component cache at the one both modes share
/// between runs; without it (the link fails) each node compiles anew.
fn share_component_cache(data_dir: &Path) {
    let cache: PathBuf = crate::component_cache_dir();
    if std::fs::create_dir_all(&cache).is_ok() {
        #[cfg(unix)]
        let _ = std::os::unix::fs::symlink(&cache, data_dir.join("components"));
    }
}

/// One actor of a spawned [`TestNode`].
#[derive(Debug, Clone)]
pub struct TestActor {
    client: Arc<Client>,
    id: ActorId,
}

impl TestActor {
    /// The actor's id.
    pub fn id(&self) -> &ActorId {
        &self.id
    }

    /// `GET path` (the path inside the actor, with its query: `/value?x=1`).
    pub async fn get(&self, path: &str) -> Result<Response> {
        self.request("GET", path, &[], b"").await
    }

    /// `POST path` with `body`.
    pub async fn post(&self, path: &str, body: &[u8]) -> Result<Response> {
        self.request("POST", path, &[], body).await
    }

    /// Any request, over HTTP to the actor's path; the answer once its
    /// writes are durable. A node's refusal (503, 404 for an unknown
    /// class) is an answer here too, with its JSON body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let (status, headers, body) = self
            .client
            .call(
                method,
                &format!("/{}{path}", self.id),
                headers,
                body.to_vec(),
            )
            .await?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    fn route(&self, op: &str) -> String {
        format!("/actors/{}/{op}", self.id)
    }

    /// A read-only statement on the actor's database as the bucket holds
    /// it (every acknowledged write), as `wasmkeep actor sql` runs it:
    /// nothing of the actor runs, and nothing is written. A statement that
    /// writes is refused (400); an actor with nothing in the bucket is 404.
    pub async fn sql(&self, statement: &str) -> Result<Rows> {
        let json = self
            .client
            .test_route("POST", &self.route("sql"), statement.as_bytes().to_vec())
            .await?;
        rows_from_json(&json)
    }

    /// A statement that may write, run as one event of the actor
    /// (activating it if needed), as `wasmkeep actor sql --write` runs
    /// it; its answer once its writes are durable.
    pub async fn sql_write(&self, statement: &str) -> Result<Written> {
        let json = self
            .client
            .test_route(
                "POST",
                &format!("{}?write=1", self.route("sql")),
                statement.as_bytes().to_vec(),
            )
            .await?;
        Written::from_json(&json)
    }

    /// Runs the actor's alarm now, whatever time it is set for; refused
    /// (409) if none is set, an error if its handler fails.
    pub async fn fire_alarm(&self) -> Result<()> {
        self.client
            .test_route("POST", &self.route("alarm"), Vec::new())
            .await?;
        Ok(())
    }

    /// Hibernates the actor (instance and database closed, ownership
    /// released, out of memory) and returns once it left; its next event
    /// restores it from the bucket. An open socket keeps it: refused (409).
    pub async fn hibernate(&self) -> Result<()> {
        self.client
            .test_route("POST", &self.route("hibernate"), Vec::new())
            .await?;
        Ok(())
    }

    /// Whether the actor is in the node's memory now.
    pub async fn is_resident(&self) -> Result<bool> {
        let json = self
            .client
            .test_route("GET", &self.route("resident"), Vec::new())
            .await?;
        json["resident"]
            .as_bool()
            .ok_or_else(|| Error::Unexpected(format!("resident answered {json}")))
    }

    /// Opens a WebSocket to the actor at `path` through the node's HTTP
    /// front.
    pub async fn socket(&self, path: &str) -> Result<Socket> {
        Socket::connect(self.client.addr, &self.id, path).await
    }
}

/// Reads `{"columns": [...], "rows": [[...]]}` (a blob as `{"hex": ...}`).
fn rows_from_json(json: &serde_json::Value) -> Result<Rows> {
    let unexpected = || Error::Unexpected(format!("a statement answered {json}"));
    let columns = crate::json_columns(json).ok_or_else(unexpected)?;
    let rows = json["rows"]
        .as_array()
        .ok_or_else(unexpected)?
        .iter()
        .map(|row| {
            row.as_array()
                .ok_or_else(unexpected)?
                .iter()
                .map(|v| sql_value(v).ok_or_else(unexpected))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Rows { columns, rows })
}

/// A cell of the node's JSON rows (`survey::json_value`'s inverse).
fn sql_value(value: &serde_json::Value) -> Option<SqlValue> {
    Some(match value {
        serde_json::Value::Null => SqlValue::Null,
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => SqlValue::Real(n.as_f64()?),
        },
        serde_json::Value::String(s) => SqlValue::Text(s.clone()),
        serde_json::Value::Object(o) => SqlValue::Blob(hex_decode(o.get("hex")?.as_str()?)?),
        serde_json::Value::Bool(_) | serde_json::Value::Array(_) => return None,
    })
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_cells_read_back_as_the_node_wrote_them() {
        let json = serde_json::json!({
            "columns": ["i", "r", "t", "b", "n"],
            "rows": [[7, 1.5, "x", {"hex": "00ff"}, null]],
        });
        let rows = rows_from_json(&json).expect("rows");
        assert_eq!(
            rows.rows,
            [[
                SqlValue::Integer(7),
                SqlValue::Real(1.5),
                SqlValue::Text("x".into()),
                SqlValue::Blob(vec![0, 255]),
                SqlValue::Null
            ]]
        );
        assert!(
            rows_from_json(&serde_json::json!({"columns": ["b"], "rows": [[{"hex": "0"}]]}))
                .is_err()
        );
        assert!(rows_from_json(&serde_json::json!({"rows": []})).is_err());
    }
}
