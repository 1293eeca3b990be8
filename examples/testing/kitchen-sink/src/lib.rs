//! Test guest that exercises every import and export of the `actor` world.
//!
//! Each request path drives one import so the runtime's tests can assert, on a
//! recording host, exactly what crossed the boundary. Answers are plain text so
//! a failing assertion prints something readable.

wit_bindgen::generate!({ path: "../../../wit", world: "actor" });

use exports::wasmkeep::actor::{events, handler};
use wasmkeep::actor::types::{Message, Request, Response};
use wasmkeep::actor::{actors, alarm, identity, log, secrets, sockets, sql};

struct KitchenSink;

fn text(status: u16, body: impl Into<String>) -> Response {
    Response {
        status,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body.into().into_bytes(),
    }
}

/// The value of `key` in the query string of `path` (no percent-decoding: the
/// tests only pass plain words and numbers).
fn param<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = path.split_once('?')?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then_some(v)
    })
}

fn param_u64(path: &str, key: &str) -> u64 {
    param(path, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// One parameter of each SQL value type, including the edges of each range.
fn every_value() -> Vec<sql::Value> {
    vec![
        sql::Value::Null,
        sql::Value::Integer(i64::MIN),
        sql::Value::Real(-0.25),
        sql::Value::Text("héllo ✓".into()),
        sql::Value::Blob(vec![0, 1, 255]),
    ]
}

fn show_value(value: &sql::Value) -> String {
    match value {
        sql::Value::Null => "null".into(),
        sql::Value::Integer(i) => format!("integer({i})"),
        sql::Value::Real(r) => format!("real({r})"),
        sql::Value::Text(t) => format!("text({t})"),
        sql::Value::Blob(b) => format!("blob({b:?})"),
    }
}

fn show_rows(rows: &sql::Rows) -> String {
    let mut out = rows.columns.join(",");
    for row in &rows.rows {
        out.push('\n');
        out.push_str(&row.iter().map(show_value).collect::<Vec<_>>().join(","));
    }
    out
}

fn show_message(message: &Message) -> String {
    match message {
        Message::Text(t) => format!("text({t})"),
        Message::Binary(b) => format!("binary({b:?})"),
    }
}

impl handler::Guest for KitchenSink {
    fn handle(request: Request) -> Response {
        let path = request.path.as_str();
        let route = path.split('?').next().unwrap_or(path);
        match route {
            // The no-op path the benchmark measures: no import is called.
            "/noop" => Response {
                status: 204,
                headers: Vec::new(),
                body: Vec::new(),
            },
            "/echo" => {
                let mut headers = request.headers.clone();
                headers.push(("x-method".into(), request.method.clone()));
                headers.push(("x-path".into(), request.path.clone()));
                Response {
                    status: 200,
                    headers,
                    body: request.body,
                }
            }
            "/answer" => {
                // A write (the alarm), then an answer with `status` (200)
                // and a header named `header` if given.
                alarm::set(4_000_000_000_000);
                let status = param(path, "status").and_then(|v| v.parse().ok());
                let mut response = text(status.unwrap_or(200), "answered");
                if let Some(name) = param(path, "header") {
                    response.headers.push((name.into(), "1".into()));
                }
                response
            }
            "/sql/execute" => {
                match sql::execute("INSERT INTO t VALUES (?, ?, ?, ?, ?)", &every_value()) {
                    Ok(changed) => text(200, changed.to_string()),
                    Err(error) => text(500, format!("sql error: {error}")),
                }
            }
            // The body is one statement, run as the guest's own: `?rows=1`
            // asks for its rows (sql::query), else it is executed. For the
            // tests of hostile statements (ADR 0063).
            "/sql/run" => {
                let statement = String::from_utf8_lossy(&request.body).into_owned();
                if param(path, "rows") == Some("1") {
                    match sql::query(&statement, &[]) {
                        Ok(rows) => text(200, show_rows(&rows)),
                        Err(error) => text(500, format!("sql error: {error}")),
                    }
                } else {
                    match sql::execute(&statement, &[]) {
                        Ok(changed) => text(200, changed.to_string()),
                        Err(error) => text(500, format!("sql error: {error}")),
                    }
                }
            }
            "/sql/query" => match sql::query("SELECT * FROM t WHERE a = ?", &every_value()) {
                Ok(rows) => text(200, show_rows(&rows)),
                Err(error) => text(500, format!("sql error: {error}")),
            },
            "/alarm/get" => text(
                200,
                alarm::get().map_or("none".to_string(), |at| at.to_string()),
            ),
            "/alarm/set" => {
                let at_ms = param(path, "at").and_then(|v| v.parse().ok()).unwrap_or(-1);
                alarm::set(at_ms);
                text(200, "set")
            }
            "/alarm/clear" => {
                alarm::clear();
                text(200, "cleared")
            }
            "/sockets/send" => {
                let id = param_u64(path, "id");
                let message = match param(path, "text") {
                    Some(t) => Message::Text(t.into()),
                    None => Message::Binary(request.body.clone()),
                };
                match sockets::send(id, &message) {
                    Ok(()) => text(200, "sent"),
                    Err(error) => text(500, format!("send error: {error}")),
                }
            }
            "/sockets/close" => {
                let code = param(path, "code")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1000);
                match sockets::close(
                    param_u64(path, "id"),
                    code,
                    param(path, "reason").unwrap_or(""),
                ) {
                    Ok(()) => text(200, "closed"),
                    Err(error) => text(500, format!("close error: {error}")),
                }
            }
            "/sockets/list" => {
                let ids: Vec<String> = sockets::list().iter().map(u64::to_string).collect();
                text(200, ids.join(","))
            }
            "/sockets/set-tag" => {
                match sockets::set_tag(param_u64(path, "id"), param(path, "tag").unwrap_or("")) {
                    Ok(()) => text(200, "tagged"),
                    Err(error) => text(500, format!("tag error: {error}")),
                }
            }
            "/sockets/get-tag" => match sockets::get_tag(param_u64(path, "id")) {
                Some(tag) => text(200, tag),
                None => text(404, "no tag"),
            },
            "/call" => {
                // `path` picks the callee's route (default `/inner?x=1`);
                // `header` adds a header of that name with the value `1`;
                // `sleep_ms` (at most 10 s) passes before the call.
                if let Some(ms) = param(path, "sleep_ms").and_then(|v| v.parse::<u64>().ok()) {
                    let until = std::time::Instant::now()
                        + std::time::Duration::from_millis(ms.min(10_000));
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                }
                let mut headers = vec![("x-from".into(), "kitchen-sink".into())];
                if let Some(name) = param(path, "header") {
                    headers.push((name.into(), "1".into()));
                }
                let inner = Request {
                    method: "POST".into(),
                    path: param(path, "path").unwrap_or("/inner?x=1").into(),
                    headers,
                    body: request.body.clone(),
                };
                let class = param(path, "class").unwrap_or("other");
                let name = param(path, "name").unwrap_or("n1");
                match actors::call(class, name, &inner) {
                    Ok(response) => response,
                    Err(error) => text(502, format!("call error: {error}")),
                }
            }
            "/secret" => match secrets::get(param(path, "name").unwrap_or("")) {
                Some(value) => text(200, value),
                None => text(404, "no secret"),
            },
            "/log" => {
                log::log(log::Level::Trace, "at trace");
                log::log(log::Level::Debug, "at debug");
                log::log(log::Level::Info, "at info");
                log::log(log::Level::Warn, "at warn");
                log::log(log::Level::Error, "at error");
                text(200, "logged")
            }
            "/identity" => {
                let id = identity::id();
                text(200, format!("{}/{}/{}", id.tenant, id.class, id.name))
            }
            "/wasi" => {
                // Clocks, random and stdio work; environment, arguments and
                // the filesystem are empty.
                let wall_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                let started = std::time::Instant::now();
                let random = {
                    use std::hash::{BuildHasher, Hasher};
                    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                    hasher.write_u8(1);
                    hasher.finish()
                };
                println!("to stdout from the guest");
                eprintln!("to stderr from the guest");
                let envs = std::env::vars().count();
                let args = std::env::args().count();
                let fs_denied =
                    std::fs::read("/etc/hostname").is_err() && std::fs::read_dir("/").is_err();
                let elapsed_ok = started.elapsed() < std::time::Duration::from_secs(60);
                text(
                    200,
                    format!(
                        "wall_ms_positive={} random_nonzero={} envs={envs} args={args} fs_denied={fs_denied} monotonic={elapsed_ok}",
                        wall_ms > 1_600_000_000_000,
                        random != 0
                    ),
                )
            }
            _ => text(404, format!("no route {route}")),
        }
    }
}

impl events::Guest for KitchenSink {
    fn alarm(scheduled_ms: i64, retry_count: u32) -> Result<(), String> {
        log::log(
            log::Level::Info,
            &format!(
                "alarm scheduled_ms={scheduled_ms} retry_count={retry_count} get={}",
                alarm::get().map_or("none".to_string(), |at| at.to_string())
            ),
        );
        // A schedule of -N (N from 1 to 9) asks for N failed deliveries
        // before one succeeds.
        if (-9..0).contains(&scheduled_ms) && i64::from(retry_count) < -scheduled_ms {
            return Err("not yet".into());
        }
        Ok(())
    }

    fn socket_message(id: u64, message: Message) {
        log::log(
            log::Level::Info,
            &format!("socket-message id={id} {}", show_message(&message)),
        );
        // Echo, so the test sees the message went through both directions.
        let _ = sockets::send(id, &message);
    }

    fn socket_close(id: u64, code: u16, reason: String) {
        log::log(
            log::Level::Info,
            &format!("socket-close id={id} code={code} reason={reason}"),
        );
    }
}

export!(KitchenSink);
