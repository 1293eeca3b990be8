//! The node in the test's process (ADR 0073): `Node::start_with` on a new
//! `MemoryBucket`, a temporary data folder, the default app and a
//! [`TestClock`]; every operation is a method of [`wasmkeep_server::direct`].

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_cluster::Clock;
use wasmkeep_runtime::{Runtime, RuntimeConfig};
use wasmkeep_server::{Node, NodeConfig, Platform};
use wasmkeep_types::{ActorId, AppName, ClassName, NodeId};

pub use wasmkeep_cluster::TestClock;
pub use wasmkeep_server::AlarmRun;

use crate::{Error, Response, Result, Rows, Socket, Written};

/// How long [`TestNode::stop`] gives the node to hand its actors over.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One node in the test's process (see the crate's documentation).
pub struct TestNode {
    node: Arc<Node>,
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
            cache_dir: Some(crate::component_cache_dir()),
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
            ..Platform::production(runtime)
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
        self.node.deploy_now(&class, component.to_vec()).await?;
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
            node: Arc::clone(&self.node),
            id: ActorId::parse(id)?,
            addr: self.addr,
        })
    }

    /// The node's wall clock: [`TestClock::advance`] moves it without
    /// running anything (the node's timer sees it within a second).
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// The node's wall clock now, in milliseconds since the Unix epoch
    /// (alarm times are on it).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
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
    /// nothing of the actor runs, and nothing is written. A statement that
    /// writes is refused (400); an actor with nothing in the bucket is 404.
    pub async fn sql(&self, statement: &str) -> Result<Rows> {
        let rows = self.node.read_sql(&self.id, statement).await?;
        Ok(Rows {
            columns: rows.columns,
            rows: rows.rows,
        })
    }

    /// A statement that may write, run as one event of the actor
    /// (activating it if needed), as `wasmkeep actor sql --write` runs
    /// it; its answer once its writes are durable.
    pub async fn sql_write(&self, statement: &str) -> Result<Written> {
        Written::from_json(&self.node.operator_sql(&self.id, statement).await?)
    }

    /// Runs the actor's alarm now, whatever time it is set for; refused
    /// (409) if none is set, an error if its handler fails.
    pub async fn fire_alarm(&self) -> Result<()> {
        match self.node.run_alarm_now(&self.id).await? {
            AlarmRun::Ran => Ok(()),
            AlarmRun::NotSet | AlarmRun::NotDue => Err(Error::Node(
                wasmkeep_server::Error::Conflict(format!("actor {} has no alarm set", self.id)),
            )),
        }
    }

    /// Hibernates the actor (instance and database closed, ownership
    /// released, out of memory) and returns once it left; its next event
    /// restores it from the bucket. An open socket keeps it: refused (409).
    pub async fn hibernate(&self) -> Result<()> {
        self.node.hibernate(&self.id).await?;
        Ok(())
    }

    /// Whether the actor is in the node's memory now.
    pub async fn is_resident(&self) -> Result<bool> {
        Ok(self.node.residents.has_stub(&self.id))
    }

    /// Opens a WebSocket to the actor at `path` through the node's HTTP
    /// front (on its loopback port).
    pub async fn socket(&self, path: &str) -> Result<Socket> {
        Socket::connect(self.addr, &self.id, path).await
    }
}
