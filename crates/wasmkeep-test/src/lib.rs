//! A test harness for wasmkeep actors (ADR 0073, ADR 0075), added as a
//! dev-dependency: one real node on a memory bucket, with a wall clock the
//! test moves.
//!
//! ```no_run
//! # async fn example() -> Result<(), wasmkeep_test::Error> {
//! let node = wasmkeep_test::TestNode::start().await?;
//! node.deploy_file("counter", "counter.wasm").await?;
//! let actor = node.actor("demo/counter/a")?;
//! assert_eq!(actor.post("/increment", b"").await?.text()?, "1");
//! actor.hibernate().await?; // out of memory; the next request restores it
//! let rows = actor.sql("SELECT n FROM counter").await?;
//! assert_eq!(rows.single_integer()?, 1);
//! # Ok(()) }
//! ```
//!
//! Two modes, one API ([`TestNode`] is the first when its feature is on):
//! - [`in_process`] (feature `in-process`, the default): the node runs in
//!   the test's process; requests go straight to it, so a node's refusal
//!   is an [`Error::Node`]. A first `cargo test` compiles the whole node.
//! - [`spawned`] (always there): the harness starts `wasmkeep dev
//!   --test-routes` (the binary of `WASMKEEP_BIN`, else `wasmkeep` on
//!   `PATH`) and drives it over HTTP on loopback; a node's refusal is an
//!   [`Error::Refused`]. A project with `default-features = false` builds
//!   in seconds.
//!
//! [`Error::status`] is the HTTP status a refusal answers with in either
//! mode. Sockets go through the node's HTTP front on a loopback port, as a
//! browser's would. Run in-process tests on a multi-threaded runtime
//! (`#[tokio::test(flavor = "multi_thread")]`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub use wasmkeep_types::ActorId;
pub use wasmkeep_types::sql::SqlValue;

#[cfg(feature = "in-process")]
pub mod in_process;
pub mod spawned;

#[cfg(feature = "in-process")]
pub use in_process::{TestActor, TestNode};
#[cfg(not(feature = "in-process"))]
pub use spawned::{TestActor, TestNode};

/// What a harness operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node refused or failed the operation (the error the HTTP front
    /// would turn into a status; [`Error::status`] says which).
    #[cfg(feature = "in-process")]
    #[error(transparent)]
    Node(#[from] wasmkeep_server::Error),
    /// The guest runtime could not start or load the component.
    #[cfg(feature = "in-process")]
    #[error(transparent)]
    Runtime(#[from] wasmkeep_runtime::Error),
    /// A spawned node refused or failed the operation: its HTTP status and
    /// its error's message.
    #[error("the node answered {status}: {message}")]
    Refused { status: u16, message: String },
    /// A name (actor id, class) does not follow wasmkeep's rules.
    #[error(transparent)]
    Name(#[from] wasmkeep_types::Error),
    /// Reading a component file, making the data folder, binding or
    /// reaching the loopback port, starting the binary.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The `wasmkeep` binary is missing, or it stopped.
    #[error("{0}")]
    Binary(String),
    /// The WebSocket client failed.
    #[error("socket: {0}")]
    Socket(#[from] Box<tungstenite::Error>),
    /// Nothing arrived within the limit.
    #[error("{0} did not happen within {1:?}")]
    Timeout(&'static str, Duration),
    /// The answer is not what the call expects (not UTF-8, not one value,
    /// a binary message where text was asked for).
    #[error("unexpected: {0}")]
    Unexpected(String),
}

impl Error {
    /// The HTTP status of a node's refusal (`409` for an alarm that is not
    /// set, `400` for a bad statement, ...); `None` for the harness's own
    /// failures.
    pub fn status(&self) -> Option<u16> {
        match self {
            #[cfg(feature = "in-process")]
            Error::Node(e) => Some(e.status()),
            Error::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long a socket read waits before it fails the test.
pub const SOCKET_RECV_TIME_MAX: Duration = Duration::from_secs(30);

/// The `wasmkeep` binary the spawned mode and [`build_project`] run:
/// `WASMKEEP_BIN`, else `wasmkeep` on `PATH`.
pub fn wasmkeep_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("WASMKEEP_BIN") {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            return Err(Error::Binary(format!(
                "WASMKEEP_BIN is {}, which is not a file",
                bin.display()
            )));
        }
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("wasmkeep"))
        .find(|bin| bin.is_file())
        .ok_or_else(|| {
            Error::Binary(
                "no wasmkeep binary: set WASMKEEP_BIN to its path, or put wasmkeep on PATH".into(),
            )
        })
}

/// Builds the actor project in `dir` with `wasmkeep build` (the binary of
/// [`wasmkeep_bin`]) and returns the component it wrote, `DIR/NAME.wasm`.
pub fn build_project(dir: impl AsRef<Path>) -> Result<PathBuf> {
    let dir = dir.as_ref();
    let bin = wasmkeep_bin()?;
    let out = std::process::Command::new(&bin)
        .arg("build")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .output()
        .map_err(|source| Error::Io {
            what: format!("running {} build", bin.display()),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Binary(format!(
            "wasmkeep build {} failed ({}):\n{}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // It says `wasmkeep: built PATH (N bytes)` last.
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("wasmkeep: built "))
        .and_then(|rest| rest.rsplit_once(" ("))
        .map(|(path, _)| PathBuf::from(path))
        .ok_or_else(|| Error::Unexpected(format!("wasmkeep build said no component:\n{stderr}")))
}

/// An actor's answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.body)
            .map_err(|_| Error::Unexpected("the response body is not UTF-8".into()))
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Rows a statement returned.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<SqlValue>>,
}

impl Rows {
    /// The one value of a one-row, one-column result.
    pub fn single(&self) -> Result<&SqlValue> {
        match self.rows.as_slice() {
            [row] if row.len() == 1 => Ok(&row[0]),
            _ => Err(Error::Unexpected(format!(
                "{} rows of {} columns, not one value",
                self.rows.len(),
                self.columns.len()
            ))),
        }
    }

    /// [`single`](Self::single), an integer.
    pub fn single_integer(&self) -> Result<i64> {
        match self.single()? {
            SqlValue::Integer(n) => Ok(*n),
            other => Err(Error::Unexpected(format!("{other:?} is not an integer"))),
        }
    }
}

/// What an operator's statement returned (`wasmkeep actor sql --write`'s
/// JSON): its rows (a blob as `{"hex": ...}`) and the rows it changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
    pub changes: i64,
}

/// The `columns` of a statement's JSON answer.
fn json_columns(json: &serde_json::Value) -> Option<Vec<String>> {
    json["columns"]
        .as_array()?
        .iter()
        .map(|c| c.as_str().map(str::to_owned))
        .collect()
}

impl Written {
    /// Reads `{"columns": [...], "rows": [[...]], "changes": N}`.
    fn from_json(json: &serde_json::Value) -> Result<Written> {
        let unexpected = || Error::Unexpected(format!("an operator's statement answered {json}"));
        let columns = json_columns(json).ok_or_else(unexpected)?;
        let rows = json["rows"]
            .as_array()
            .ok_or_else(unexpected)?
            .iter()
            .map(|r| r.as_array().cloned().ok_or_else(unexpected))
            .collect::<Result<Vec<_>>>()?;
        let changes = json["changes"].as_i64().ok_or_else(unexpected)?;
        Ok(Written {
            columns,
            rows,
            changes,
        })
    }
}

/// A message on a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(String),
    Binary(Vec<u8>),
}

/// A WebSocket client of an actor.
pub struct Socket {
    stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket").finish_non_exhaustive()
    }
}

impl Socket {
    /// Opens a socket to `ws://{addr}/{actor}{path}`.
    async fn connect(addr: std::net::SocketAddr, actor: &ActorId, path: &str) -> Result<Socket> {
        let url = format!("ws://{addr}/{actor}{path}");
        let (stream, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .map_err(Box::new)?;
        Ok(Socket { stream })
    }

    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.send(tungstenite::Message::text(text)).await
    }

    pub async fn send_binary(&mut self, bytes: &[u8]) -> Result<()> {
        self.send(tungstenite::Message::binary(bytes.to_vec()))
            .await
    }

    async fn send(&mut self, message: tungstenite::Message) -> Result<()> {
        self.stream.send(message).await.map_err(Box::new)?;
        Ok(())
    }

    /// The next message from the actor; `None` once the socket closed.
    /// Fails after [`SOCKET_RECV_TIME_MAX`].
    pub async fn recv(&mut self) -> Result<Option<Message>> {
        loop {
            let next = tokio::time::timeout(SOCKET_RECV_TIME_MAX, self.stream.next())
                .await
                .map_err(|_| Error::Timeout("a socket message", SOCKET_RECV_TIME_MAX))?;
            match next {
                None | Some(Ok(tungstenite::Message::Close(_))) => return Ok(None),
                Some(Ok(tungstenite::Message::Text(text))) => {
                    return Ok(Some(Message::Text(text.to_string())));
                }
                Some(Ok(tungstenite::Message::Binary(bytes))) => {
                    return Ok(Some(Message::Binary(bytes.to_vec())));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(Box::new(e).into()),
            }
        }
    }

    /// The next message, which must be text.
    pub async fn recv_text(&mut self) -> Result<String> {
        match self.recv().await? {
            Some(Message::Text(text)) => Ok(text),
            Some(Message::Binary(_)) => Err(Error::Unexpected(
                "a binary message where text was expected".into(),
            )),
            None => Err(Error::Unexpected("the socket closed".into())),
        }
    }

    /// Closes the socket (code 1000) and waits for the actor's close.
    pub async fn close(mut self) -> Result<()> {
        self.stream.close(None).await.map_err(Box::new)?;
        // Read to the end: the close handshake completes there.
        let drained = async {
            while let Some(message) = self.stream.next().await {
                match message {
                    Ok(_) => {}
                    Err(
                        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                    ) => break,
                    Err(e) => return Err(Error::from(Box::new(e))),
                }
            }
            Ok(())
        };
        tokio::time::timeout(SOCKET_RECV_TIME_MAX, drained)
            .await
            .map_err(|_| Error::Timeout("the socket's close", SOCKET_RECV_TIME_MAX))?
    }
}

/// Reads a component file for a deploy.
fn read_component(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        what: format!("reading {}", path.display()),
        source,
    })
}

/// Where compiled components are kept between test runs, by both modes
/// (they are keyed by the component's digest and the engine's version).
fn component_cache_dir() -> PathBuf {
    std::env::temp_dir().join("wasmkeep-test-components")
}
