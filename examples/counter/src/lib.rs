//! The counter actor (DESIGN.md, "Examples"):
//!
//! - `POST /increment` adds one and returns the new count as plain text;
//! - `GET /value` returns the count (0 before the first increment);
//! - `POST /alarm?in_ms=N` sets the alarm N ms ahead and returns its time
//!   (ms since the epoch); each firing adds one to a separate count, read by
//!   `GET /alarms`;
//! - a WebSocket (the host opens it on `/ws`): each text message `inc` is
//!   answered with the new count; any other message is echoed back. Each
//!   socket close adds one to a third count, read by `GET /closes`.
//!
//! Both counts are rows of one table. An increment is one statement, like
//! the benchmark's peer; the table is created only when that statement finds
//! it missing, so the hot path never pays for the schema.

use std::time::Duration;

use wasmkeep_sdk::{Actor, Error, Message, Params, Request, Response, Result, Router};
use wasmkeep_sdk::{alarm, log, params, sockets, sql};

/// The row of the request count.
const INCREMENTS: i64 = 1;
/// The row of the alarm count.
const ALARMS: i64 = 2;
/// The row of the socket-close count.
const CLOSES: i64 = 3;

/// The furthest ahead an alarm may be set: a year.
const ALARM_DELAY_MS_MAX: u64 = 366 * 24 * 3600 * 1000;

const CREATE: &str =
    "CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)";
const INCREMENT: &str =
    "INSERT INTO counter(id, n) VALUES (?, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n";
const VALUE: &str = "SELECT n FROM counter WHERE id = ?";

const HELP: &str = "counter actor
  POST /increment        add one; returns the new count
  GET  /value            the count
  POST /alarm?in_ms=N    set the alarm N ms ahead; returns its time (ms since the epoch)
  GET  /alarms           how many times the alarm has fired
  GET  /closes           how many sockets have closed
  WebSocket /ws          send \"inc\", receive the new count
";

/// Adds one to row `id` and returns its new value: one statement, plus the
/// table's creation the first time.
fn increment(id: i64) -> Result<i64> {
    match sql::query_row::<(i64,)>(INCREMENT, params![id]) {
        Err(err) if err.is_missing_table() => {
            sql::execute(CREATE, params![])?;
            sql::query_row::<(i64,)>(INCREMENT, params![id]).map(|(n,)| n)
        }
        other => other.map(|(n,)| n),
    }
}

/// The value of row `id`; 0 before its first increment.
fn value(id: i64) -> Result<i64> {
    match sql::query_value::<i64>(VALUE, params![id]) {
        Err(err) if err.is_missing_table() => Ok(0),
        other => other.map(|n| n.unwrap_or(0)),
    }
}

struct Counter {
    router: Router<Counter>,
}

impl Counter {
    fn increment(&self, _: &Request, _: &Params) -> Result<String> {
        increment(INCREMENTS).map(|n| n.to_string())
    }

    fn value(&self, _: &Request, _: &Params) -> Result<String> {
        value(INCREMENTS).map(|n| n.to_string())
    }

    fn alarms(&self, _: &Request, _: &Params) -> Result<String> {
        value(ALARMS).map(|n| n.to_string())
    }

    fn closes(&self, _: &Request, _: &Params) -> Result<String> {
        value(CLOSES).map(|n| n.to_string())
    }

    fn set_alarm(&self, request: &Request, _: &Params) -> Result<String> {
        let delay_ms: u64 = request
            .query_parse("in_ms")?
            .ok_or_else(|| Error::BadRequest("missing query parameter in_ms".to_owned()))?;
        if delay_ms > ALARM_DELAY_MS_MAX {
            return Err(Error::BadRequest(format!(
                "in_ms={delay_ms} is more than {ALARM_DELAY_MS_MAX} (a year)"
            )));
        }
        Ok(alarm::set_in(Duration::from_millis(delay_ms)).to_string())
    }
}

impl Actor for Counter {
    fn new() -> Self {
        let router = Router::new()
            .get("/", |_, _, _| HELP)
            .post("/increment", Counter::increment)
            .get("/value", Counter::value)
            .post("/alarm", Counter::set_alarm)
            .get("/alarms", Counter::alarms)
            .get("/closes", Counter::closes);
        Counter { router }
    }

    fn fetch(&self, request: Request) -> Response {
        self.router.handle(self, &request)
    }

    fn alarm(&self, _scheduled_ms: i64, _retry_count: u32) -> std::result::Result<(), String> {
        increment(ALARMS).map(drop).map_err(|err| err.to_string())
    }

    fn socket_message(&self, socket: u64, message: Message) {
        let reply = match message {
            Message::Text(text) if text == "inc" => match increment(INCREMENTS) {
                Ok(n) => Message::Text(n.to_string()),
                Err(err) => Message::Text(format!("error: {err}")),
            },
            other => other,
        };
        // The client may have gone meanwhile; its close event follows.
        if let Err(err) = sockets::send(socket, &reply) {
            log::debug!("reply not sent: {err}");
        }
    }

    fn socket_close(&self, _socket: u64, _code: u16, _reason: String) {
        if let Err(err) = increment(CLOSES) {
            log::warn!("counting a socket close failed: {err}");
        }
    }
}

wasmkeep_sdk::export_actor!(Counter);
