//! A test harness for wasmkeep actors (ADR 0073), added as a
//! dev-dependency: one real node in the test's process, on a memory bucket
//! and a temporary data folder, with a wall clock the test moves.
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
//! Requests go straight to the node (what the HTTP front would call), so a
//! node's refusal is an [`Error::Node`], not a 503 response. Sockets go
//! through the node's HTTP front on a loopback port, as a browser's would.
//! Run the tests on a multi-threaded runtime
//! (`#[tokio::test(flavor = "multi_thread")]`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_cluster::Clock;
use wasmkeep_runtime::{Runtime, RuntimeConfig};
use wasmkeep_server::actor::classes;
use wasmkeep_server::{Node, NodeConfig, Platform};
use wasmkeep_types::{ActorId, AppName, ClassName, NodeId};

pub use wasmkeep_runtime::Message;
pub use wasmkeep_server::AlarmRun;
pub use wasmkeep_types::sql::SqlValue;

/// What a harness operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node refused or failed the operation (the error the HTTP front
    /// would turn into a status; `status()` on it says which).
    #[error(transparent)]
    Node(#[from] wasmkeep_server::Error),
    /// The guest runtime could not start or load the component.
    #[error(transparent)]
    Runtime(#[from] wasmkeep_runtime::Error),
    /// A name (actor id, class) does not follow wasmkeep's rules.
    #[error(transparent)]
    Name(#[from] wasmkeep_types::Error),
    /// Reading a component file, making the data folder, binding the
    /// loopback port.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The WebSocket client failed.
    #[error("socket: {0}")]
    Socket(#[from] Box<tungstenite::Error>),
    /// Nothing arrived within the limit.
    #[error("{0} did not happen within {1:?}")]
    Timeout(&'static str, Duration),
    /// The answer is not what the call expects (not UTF-8, not one value,
    /// a binary message where text was asked for, an alarm that was not set).
    #[error("unexpected: {0}")]
    Unexpected(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long a socket read waits before it fails the test.
pub const SOCKET_RECV_TIME_MAX: Duration = Duration::from_secs(30);

/// How long [`TestNode::stop`] gives the node to hand its actors over.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The node's wall clock: the system's, plus what the test added. Alarm
/// times are wall-clock milliseconds of this clock; the guest's own
/// clock (`wasi:clocks`) stays the system's, so an alarm a guest sets
/// "60 s from now" is due once the test advanced 60 s.
#[derive(Debug, Default)]
pub struct TestClock {
    offset_ms: AtomicI64,
}

impl TestClock {
    /// Moves the wall clock forward (the node's timer sees it within a
    /// second; [`TestNode::advance`] also runs the alarms it made due).
    pub fn advance(&self, by: Duration) {
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(by_ms, Ordering::SeqCst);
    }

    /// Milliseconds since the Unix epoch, as the node reads them.
    pub fn now_ms(&self) -> i64 {
        self.wall_ms()
    }
}

impl Clock for TestClock {
    fn now(&self) -> tokio::time::Instant {
        // Monotonic time (leases, timeouts) is not moved: only the wall
        // clock is the test's.
        tokio::time::Instant::now()
    }

    fn wall_ms(&self) -> i64 {
        wasmkeep_cluster::SystemClock
            .wall_ms()
            .saturating_add(self.offset_ms.load(Ordering::SeqCst))
    }
}

/// Where compiled components are kept between test runs (they are keyed
/// by the component's digest and the engine's version).
fn default_cache_dir() -> PathBuf {
    std::env::temp_dir().join("wasmkeep-test-components")
}

/// One node in the test's process (see the crate's documentation).
pub struct TestNode {
    node: Arc<Node>,
    runtime: Runtime,
    clock: Arc<TestClock>,
    addr: SocketAddr,
    stop_tx: watch::Sender<bool>,
    // Removed when the node is dropped.
    _data_dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNode")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TestNode {
    /// Starts a node: a new memory bucket, a temporary data folder, the
    /// default app, its HTTP front on a free loopback port.
    pub async fn start() -> Result<TestNode> {
        let data_dir = tempfile::tempdir().map_err(|source| Error::Io {
            what: "making the data folder".into(),
            source,
        })?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(default_cache_dir()),
            ..RuntimeConfig::default()
        })?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| Error::Io {
                what: "binding a loopback port".into(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            what: "reading the loopback port".into(),
            source,
        })?;
        let config = NodeConfig::new(
            AppName::default_app(),
            NodeId::new("test")?,
            addr,
            data_dir.path().to_path_buf(),
        );
        let clock = Arc::new(TestClock::default());
        let platform = Platform {
            clock: Arc::clone(&clock) as Arc<dyn Clock>,
            ..Platform::production(runtime.clone())
        };
        let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
        let node = Node::start_with(config, bucket, platform).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(wasmkeep_server::front::http::serve(
            Arc::clone(&node),
            listener,
            stop_rx,
            STOP_GRACE,
        ));
        Ok(TestNode {
            node,
            runtime,
            clock,
            addr,
            stop_tx,
            _data_dir: data_dir,
        })
    }

    /// Deploys a component as `class` (validated and compiled as `wasmkeep
    /// deploy` does) and loads it on the node; a new version of a class
    /// already deployed is used from each actor's next event.
    pub async fn deploy(&self, class: &str, component: &[u8]) -> Result<()> {
        let class = ClassName::new(class)?;
        classes::deploy(
            &*self.node.bucket,
            &self.node.keys,
            &class,
            component.to_vec(),
            classes::ClassLimits::default(),
            &self.runtime,
        )
        .await?;
        self.node.poll_classes().await?;
        Ok(())
    }

    /// [`deploy`](Self::deploy) of a `.wasm` file.
    pub async fn deploy_file(&self, class: &str, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        self.deploy(class, &bytes).await
    }

    /// A handle on the actor `TENANT/CLASS/NAME` (nothing runs until it is
    /// asked something).
    pub fn actor(&self, id: &str) -> Result<TestActor> {
        Ok(TestActor {
            node: Arc::clone(&self.node),
            id: ActorId::parse(id)?,
            addr: self.addr,
        })
    }

    /// The node's wall clock.
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// Moves the clock forward by `by` and runs every alarm due by then,
    /// each in its actor's mailbox; returns once they ran (and their
    /// writes are durable), with the actors whose alarm ran. A failed
    /// handler is an error (its retry is scheduled as usual).
    pub async fn advance(&self, by: Duration) -> Result<Vec<ActorId>> {
        self.clock.advance(by);
        Ok(self.node.run_due_alarms().await?)
    }

    /// The HTTP front's address, for any other client (`http://{addr}/...`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The node itself, for what the harness does not offer.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops the node as `wasmkeep dev` would at Ctrl-C: hands every actor
    /// over (their writes are in the bucket already) and stops serving.
    /// Dropping the node without it leaves that to the end of the test's
    /// runtime.
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        self.node.shutdown(STOP_GRACE).await;
    }
}

/// One actor of a [`TestNode`].
#[derive(Debug, Clone)]
pub struct TestActor {
    node: Arc<Node>,
    id: ActorId,
    addr: SocketAddr,
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

    /// Any request, run as an event of the actor (activating it if
    /// needed); the answer once its writes are durable.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let request = wasmkeep_runtime::Request {
            method: method.to_owned(),
            path: path.to_owned(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.to_vec(),
        };
        let response = self
            .node
            .request(&self.id, request, vec![self.id.clone()])
            .await?;
        Ok(Response {
            status: response.status,
            headers: response.headers,
            body: response.body,
        })
    }

    /// A read-only statement on the actor's database as the bucket holds
    /// it (every acknowledged write), as `wasmkeep actor sql` runs it:
    /// nothing of the actor runs, and nothing is written.
    pub async fn sql(&self, statement: &str) -> Result<Rows> {
        let store = wasmkeep_server::ops::survey::open_reader(
            Arc::clone(&self.node.bucket),
            self.node.keys.clone(),
            &self.id,
        )
        .await?;
        let Some(mut store) = store else {
            return Err(Error::Unexpected(format!(
                "actor {} has nothing in the bucket yet",
                self.id
            )));
        };
        let rows = store.query(statement, &[]).map_err(|e| {
            Error::Node(wasmkeep_server::Error::BadRequest(format!(
                "actor {}: {}",
                self.id, e.message
            )))
        })?;
        store.rollback_event();
        Ok(Rows {
            columns: rows.columns,
            rows: rows.rows,
        })
    }

    /// A statement that may write, run as one event of the actor
    /// (activating it if needed), as `wasmkeep actor sql --write` runs
    /// it; its answer once its writes are durable.
    pub async fn sql_write(&self, statement: &str) -> Result<Written> {
        let json = self.node.operator_sql(&self.id, statement).await?;
        let unexpected = || Error::Unexpected(format!("an operator's statement answered {json}"));
        let columns = json["columns"]
            .as_array()
            .ok_or_else(unexpected)?
            .iter()
            .map(|c| c.as_str().map(str::to_owned).ok_or_else(unexpected))
            .collect::<Result<Vec<_>>>()?;
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

    /// Runs the actor's alarm now, whatever time it is set for; an error
    /// if none is set or its handler fails.
    pub async fn fire_alarm(&self) -> Result<()> {
        match self.node.run_alarm_now(&self.id).await? {
            AlarmRun::Ran => Ok(()),
            other => Err(Error::Unexpected(format!(
                "actor {}: no alarm ran ({other:?})",
                self.id
            ))),
        }
    }

    /// Hibernates the actor (instance and database closed, ownership
    /// released, out of memory) and returns once it left; its next event
    /// restores it from the bucket. An open socket keeps it: an error.
    pub async fn hibernate(&self) -> Result<()> {
        self.node.hibernate(&self.id).await?;
        Ok(())
    }

    /// Whether the actor is in the node's memory now.
    pub fn is_resident(&self) -> bool {
        self.node.residents.has_stub(&self.id)
    }

    /// Opens a WebSocket to the actor at `path` through the node's HTTP
    /// front (on its loopback port).
    pub async fn socket(&self, path: &str) -> Result<Socket> {
        let url = format!("ws://{}/{}{}", self.addr, self.id, path);
        let (stream, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .map_err(Box::new)?;
        Ok(Socket { stream })
    }
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
