//! The host side of each imported interface of the world, one `impl` per WIT
//! interface, each forwarding to [`ActorHost`](crate::ActorHost). The WIT's
//! `result` errors are values handed back to the guest; none of these traps.

use crate::bindings::wasmkeep::actor::{
    actors, alarm, identity, log, secrets, sockets, sql, types,
};
use crate::host::{LogLevel, Message, Request, Response, SqlRows, SqlValue};
use crate::host_stack;
use crate::state::State;

impl types::Host for State {}

impl sql::Host for State {
    fn execute(&mut self, statement: String, params: Vec<sql::Value>) -> Result<u64, String> {
        let params = params.into_iter().map(SqlValue::from).collect();
        let host = &mut self.host;
        host_stack::run(|| host.sql_execute(&statement, params))
    }

    fn query(&mut self, statement: String, params: Vec<sql::Value>) -> Result<sql::Rows, String> {
        let params = params.into_iter().map(SqlValue::from).collect();
        let host = &mut self.host;
        host_stack::run(|| host.sql_query(&statement, params)).map(sql::Rows::from)
    }
}

impl alarm::Host for State {
    fn get(&mut self) -> Option<i64> {
        self.host.alarm_get()
    }

    fn set(&mut self, at_ms: i64) {
        self.host.alarm_set(at_ms);
    }

    fn clear(&mut self) {
        self.host.alarm_clear();
    }
}

impl sockets::Host for State {
    fn send(&mut self, id: u64, message: types::Message) -> Result<(), String> {
        self.host.socket_send(id, message.into())
    }

    fn close(&mut self, id: u64, code: u16, reason: String) -> Result<(), String> {
        self.host.socket_close(id, code, reason)
    }

    fn list(&mut self) -> Vec<u64> {
        self.host.socket_list()
    }

    fn set_tag(&mut self, id: u64, tag: String) -> Result<(), String> {
        self.host.socket_set_tag(id, tag)
    }

    fn get_tag(&mut self, id: u64) -> Option<String> {
        self.host.socket_get_tag(id)
    }
}

impl actors::Host for State {
    /// A call ends before its caller's event does: one still waiting when
    /// the caller's time is nearly up fails with an error the caller can
    /// handle (otherwise the caller's event would be stopped at its limit,
    /// still waiting). A tenth of the time left, at most a second, is kept.
    async fn call(
        &mut self,
        class: String,
        name: String,
        request: types::Request,
    ) -> Result<types::Response, String> {
        let wait = crate::state::wait_before_answer(self.event_deadline);
        let target = format!("{class}/{name}");
        match tokio::time::timeout(wait, self.host.call(class, name, request.into())).await {
            Ok(answered) => answered.map(types::Response::from),
            Err(_) => Err(format!(
                "call to {target} timed out after {} ms: the calling event's time limit is near",
                wait.as_millis()
            )),
        }
    }
}

impl secrets::Host for State {
    fn get(&mut self, name: String) -> Option<String> {
        self.host.secret(&name)
    }
}

impl log::Host for State {
    fn log(&mut self, level: log::Level, message: String) {
        self.host.log(level.into(), &message);
    }
}

impl identity::Host for State {
    fn id(&mut self) -> types::ActorId {
        types::ActorId {
            tenant: self.id.tenant.to_string(),
            class: self.id.class.to_string(),
            name: self.id.name().to_owned(),
        }
    }
}

// --- conversions between the generated types and the crate's plain types ---

impl From<sql::Value> for SqlValue {
    fn from(value: sql::Value) -> Self {
        match value {
            sql::Value::Null => SqlValue::Null,
            sql::Value::Integer(i) => SqlValue::Integer(i),
            sql::Value::Real(r) => SqlValue::Real(r),
            sql::Value::Text(t) => SqlValue::Text(t),
            sql::Value::Blob(b) => SqlValue::Blob(b),
        }
    }
}

impl From<SqlValue> for sql::Value {
    fn from(value: SqlValue) -> Self {
        match value {
            SqlValue::Null => sql::Value::Null,
            SqlValue::Integer(i) => sql::Value::Integer(i),
            SqlValue::Real(r) => sql::Value::Real(r),
            SqlValue::Text(t) => sql::Value::Text(t),
            SqlValue::Blob(b) => sql::Value::Blob(b),
        }
    }
}

impl From<SqlRows> for sql::Rows {
    fn from(rows: SqlRows) -> Self {
        sql::Rows {
            columns: rows.columns,
            rows: rows
                .rows
                .into_iter()
                .map(|row| row.into_iter().map(sql::Value::from).collect())
                .collect(),
        }
    }
}

impl From<types::Message> for Message {
    fn from(message: types::Message) -> Self {
        match message {
            types::Message::Text(t) => Message::Text(t),
            types::Message::Binary(b) => Message::Binary(b),
        }
    }
}

impl From<Message> for types::Message {
    fn from(message: Message) -> Self {
        match message {
            Message::Text(t) => types::Message::Text(t),
            Message::Binary(b) => types::Message::Binary(b),
        }
    }
}

impl From<types::Request> for Request {
    fn from(r: types::Request) -> Self {
        Request {
            method: r.method,
            path: r.path,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl From<Request> for types::Request {
    fn from(r: Request) -> Self {
        types::Request {
            method: r.method,
            path: r.path,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl From<types::Response> for Response {
    fn from(r: types::Response) -> Self {
        Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl From<Response> for types::Response {
    fn from(r: Response) -> Self {
        types::Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl From<log::Level> for LogLevel {
    fn from(level: log::Level) -> Self {
        match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        }
    }
}
