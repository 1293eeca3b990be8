//! Shared by the runtime's tests: the guests built by `scripts/build-guests`,
//! runtimes, and a host that records every call the guest makes.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of this module"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use wasmkeep_runtime::{
    ActorHost, ActorInstance, ClassComponent, LogLevel, Message, Request, Response, Runtime,
    RuntimeConfig, SqlRows, SqlValue,
};
use wasmkeep_types::ActorId;

/// The bytes of guest `name` (an `examples/testing/<name>` crate).
pub fn guest(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm")
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "test guest {} is missing ({error}): run scripts/build-guests",
            path.display()
        )
    })
}

/// Small limits so the limit tests are quick; the pool is small so the many
/// runtimes of a parallel test run reserve little address space.
pub fn small_config() -> RuntimeConfig {
    RuntimeConfig {
        cache_dir: None,
        memory_bytes_max: 32 << 20,
        event_time_max: Duration::from_millis(500),
        instances_max: 16,
        table_elements_max: 20_000,
        outbound: Default::default(),
    }
}

/// One runtime shared by the tests of a binary, as a node shares one.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::new(small_config()).expect("runtime"))
}

pub fn load(name: &str) -> ClassComponent {
    runtime()
        .load_component(&guest(name))
        .expect("test guest loads")
}

pub fn actor_id(name: &str) -> ActorId {
    ActorId::parse(&format!("acme/sink/{name}")).expect("valid actor id")
}

pub async fn instance(name: &str, actor: &str) -> ActorInstance {
    load(name)
        .instantiate(actor_id(actor), Box::new(RecordingHost::default()))
        .await
        .expect("instantiates")
}

pub fn get(path: &str) -> Request {
    Request {
        method: "GET".into(),
        path: path.into(),
        headers: Vec::new(),
        body: Vec::new(),
    }
}

pub fn body_text(response: &Response) -> String {
    String::from_utf8_lossy(&response.body).into_owned()
}

pub fn recorder(instance: &mut ActorInstance) -> &mut RecordingHost {
    instance
        .host()
        .as_any()
        .downcast_mut::<RecordingHost>()
        .expect("the test host is a RecordingHost")
}

/// A host that answers from its fields and records each call the guest made.
#[derive(Default)]
pub struct RecordingHost {
    pub calls: Vec<String>,
    pub sql_error: Option<String>,
    pub sql_rows: SqlRows,
    pub alarm: Option<i64>,
    /// Open sockets and their tags.
    pub sockets: BTreeMap<u64, Option<String>>,
    pub sent: Vec<(u64, Message)>,
    pub closed: Vec<(u64, u16, String)>,
    pub call_requests: Vec<(String, String, Request)>,
    pub call_error: Option<String>,
    /// `actors.call` never returns (a callee that hangs).
    pub call_hangs: bool,
    pub secrets: BTreeMap<String, String>,
    pub logs: Vec<(LogLevel, String)>,
}

#[async_trait::async_trait]
impl ActorHost for RecordingHost {
    fn sql_execute(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<u64, String> {
        assert!(
            wasmkeep_runtime::on_host_stack(),
            "sql.execute runs on the host stack"
        );
        self.calls
            .push(format!("sql.execute {statement} {params:?}"));
        match &self.sql_error {
            Some(error) => Err(error.clone()),
            None => Ok(params.len() as u64),
        }
    }

    fn sql_query(&mut self, statement: &str, params: Vec<SqlValue>) -> Result<SqlRows, String> {
        assert!(
            wasmkeep_runtime::on_host_stack(),
            "sql.query runs on the host stack"
        );
        self.calls.push(format!("sql.query {statement} {params:?}"));
        match &self.sql_error {
            Some(error) => Err(error.clone()),
            None => Ok(self.sql_rows.clone()),
        }
    }

    fn alarm_get(&mut self) -> Option<i64> {
        self.calls.push("alarm.get".into());
        self.alarm
    }

    fn alarm_set(&mut self, at_ms: i64) {
        self.calls.push(format!("alarm.set {at_ms}"));
        self.alarm = Some(at_ms);
    }

    fn alarm_clear(&mut self) {
        self.calls.push("alarm.clear".into());
        self.alarm = None;
    }

    fn socket_send(&mut self, id: u64, message: Message) -> Result<(), String> {
        self.calls.push(format!("sockets.send {id}"));
        if !self.sockets.contains_key(&id) {
            return Err(format!("no socket {id}"));
        }
        self.sent.push((id, message));
        Ok(())
    }

    fn socket_close(&mut self, id: u64, code: u16, reason: String) -> Result<(), String> {
        self.calls.push(format!("sockets.close {id}"));
        if self.sockets.remove(&id).is_none() {
            return Err(format!("no socket {id}"));
        }
        self.closed.push((id, code, reason));
        Ok(())
    }

    fn socket_list(&mut self) -> Vec<u64> {
        self.calls.push("sockets.list".into());
        self.sockets.keys().copied().collect()
    }

    fn socket_set_tag(&mut self, id: u64, tag: String) -> Result<(), String> {
        self.calls.push(format!("sockets.set-tag {id}"));
        match self.sockets.get_mut(&id) {
            Some(slot) => {
                *slot = Some(tag);
                Ok(())
            }
            None => Err(format!("no socket {id}")),
        }
    }

    fn socket_get_tag(&mut self, id: u64) -> Option<String> {
        self.calls.push(format!("sockets.get-tag {id}"));
        self.sockets.get(&id).cloned().flatten()
    }

    async fn call(
        &mut self,
        class: String,
        name: String,
        request: Request,
    ) -> Result<Response, String> {
        self.calls.push(format!("actors.call {class}/{name}"));
        // Really wait, as a call to another actor would.
        tokio::task::yield_now().await;
        if self.call_hangs {
            std::future::pending::<()>().await;
        }
        if let Some(error) = &self.call_error {
            return Err(error.clone());
        }
        let mut body = request.body.clone();
        body.reverse();
        self.call_requests
            .push((class.clone(), name.clone(), request));
        Ok(Response {
            status: 201,
            headers: vec![("x-callee".into(), format!("{class}/{name}"))],
            body,
        })
    }

    fn secret(&mut self, name: &str) -> Option<String> {
        self.calls.push(format!("secrets.get {name}"));
        self.secrets.get(name).cloned()
    }

    fn log(&mut self, level: LogLevel, message: &str) {
        self.logs.push((level, message.to_owned()));
    }

    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
