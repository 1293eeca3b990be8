//! The chat room actor: one actor per room, `/<tenant>/chat/<room>/...`.
//!
//! - WebSocket (`/ws`): the host opens the socket without calling `fetch`, so
//!   a client names itself with a first text message `join NAME` (kept as the
//!   socket's tag). Every other text message is stored and broadcast to every
//!   socket of the room as `NAME: text`. A socket that never joined is
//!   `anon-<socket id>`. When a socket closes the room hears `NAME left`.
//! - `POST /post?user=NAME` with the text as body: stored and broadcast the
//!   same way; returns the message id.
//! - `GET /history?limit=N` the last N messages (default 50, at most 1000),
//!   oldest first, as `NAME: text` lines; `&format=json` gives JSON lines
//!   `{"id":1,"at_ms":...,"user":"...","text":"..."}`.
//! - `GET /members` the names of the open sockets, one a line.
//!
//! The room keeps its last `HISTORY_MESSAGES_MAX` messages.

use std::cell::RefCell;
use std::collections::HashMap;

use wasmkeep_sdk::{Actor, Error, Message, Params, Request, Response, Result, Router};
use wasmkeep_sdk::{alarm, log, params, sockets, sql};

/// The longest user name, in bytes (a socket tag may hold 256).
const NAME_BYTES_MAX: usize = 64;
/// The longest message text, in bytes.
const TEXT_BYTES_MAX: usize = 4096;
/// Messages kept per room; older ones are deleted.
const HISTORY_MESSAGES_MAX: i64 = 10_000;
/// Trim the history once every this many messages, not at each one.
const HISTORY_TRIM_EVERY: i64 = 100;
const HISTORY_LIMIT_DEFAULT: u32 = 50;
const HISTORY_LIMIT_MAX: u32 = 1000;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS messages(\
     id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, user TEXT NOT NULL, text TEXT NOT NULL)";
const INSERT: &str = "INSERT INTO messages(at_ms, user, text) VALUES (?, ?, ?) RETURNING id";

const HELP: &str = "chat room actor
  WebSocket /ws             send \"join NAME\" first, then text messages
  POST /post?user=NAME      body = text; broadcast and stored; returns the message id
  GET  /history?limit=N     last N messages (&format=json for JSON lines)
  GET  /members             names of the open sockets
";

/// Checks a user name: 1..=64 bytes, no control characters, no `:` (it
/// separates the name from the text in `NAME: text`).
fn check_name(name: &str) -> Result<&str> {
    let name = name.trim();
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Error::BadRequest(format!(
            "a user name has 1 to {NAME_BYTES_MAX} bytes"
        )));
    }
    if name.chars().any(|c| c.is_control() || c == ':') {
        return Err(Error::BadRequest(
            "a user name has no control characters and no ':'".to_owned(),
        ));
    }
    Ok(name)
}

/// Checks a message: trailing line breaks are dropped; then 1..=4096 bytes
/// with no control characters but tabs.
fn check_text(text: &str) -> Result<&str> {
    let text = text.trim_end_matches(['\r', '\n']);
    if text.is_empty() || text.len() > TEXT_BYTES_MAX {
        return Err(Error::BadRequest(format!(
            "a message has 1 to {TEXT_BYTES_MAX} bytes"
        )));
    }
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::BadRequest(
            "a message has no control characters but tabs".to_owned(),
        ));
    }
    Ok(text)
}

/// Stores a message, trims old history now and then, and broadcasts it.
fn post(user: &str, text: &str) -> Result<i64> {
    let params = params![alarm::now_ms(), user, text];
    let (id,) = match sql::query_row::<(i64,)>(INSERT, &params) {
        Err(err) if err.is_missing_table() => {
            sql::execute(CREATE, params![])?;
            sql::query_row::<(i64,)>(INSERT, &params)?
        }
        other => other?,
    };
    if id % HISTORY_TRIM_EVERY == 0 {
        sql::execute(
            "DELETE FROM messages WHERE id <= ?",
            params![id - HISTORY_MESSAGES_MAX],
        )?;
    }
    sockets::broadcast_text(&format!("{user}: {text}"));
    Ok(id)
}

/// The name a socket speaks under: its tag, else `anon-<id>`.
fn socket_name(socket: u64) -> String {
    sockets::tag(socket).unwrap_or_else(|| format!("anon-{socket}"))
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Chat {
    router: Router<Chat>,
    /// The names of the sockets that joined through this instance. The host's
    /// tag is the durable copy; this one still answers when the host has
    /// already forgotten a closing socket's tag.
    names: RefCell<HashMap<u64, String>>,
}

impl Chat {
    fn post(&self, request: &Request, _: &Params) -> Result<String> {
        let user = request
            .query_param("user")
            .ok_or_else(|| Error::BadRequest("missing query parameter user".to_owned()))?;
        let user = check_name(&user)?;
        let text = check_text(request.text()?)?;
        post(user, text).map(|id| id.to_string())
    }

    fn history(&self, request: &Request, _: &Params) -> Result<Response> {
        let limit = request
            .query_parse::<u32>("limit")?
            .unwrap_or(HISTORY_LIMIT_DEFAULT)
            .min(HISTORY_LIMIT_MAX);
        let rows = match sql::query_as::<(i64, i64, String, String)>(
            "SELECT id, at_ms, user, text FROM \
             (SELECT * FROM messages ORDER BY id DESC LIMIT ?) ORDER BY id",
            params![limit],
        ) {
            Err(err) if err.is_missing_table() => Vec::new(),
            other => other?,
        };
        let mut body = String::new();
        if request.query_param("format").as_deref() == Some("json") {
            for (id, at_ms, user, text) in rows {
                body.push_str(&format!(
                    "{{\"id\":{id},\"at_ms\":{at_ms},\"user\":{},\"text\":{}}}\n",
                    json_string(&user),
                    json_string(&text)
                ));
            }
            Ok(Response::bytes("application/x-ndjson", body))
        } else {
            for (_, _, user, text) in rows {
                body.push_str(&format!("{user}: {text}\n"));
            }
            Ok(Response::text(body))
        }
    }

    fn members(&self, _: &Request, _: &Params) -> String {
        sockets::list()
            .into_iter()
            .map(|socket| socket_name(socket) + "\n")
            .collect()
    }

    fn socket_text(&self, socket: u64, text: &str) -> Result<()> {
        if let Some(name) = text.strip_prefix("join ") {
            let name = check_name(name)?;
            sockets::set_tag(socket, name)?;
            self.names.borrow_mut().insert(socket, name.to_owned());
            sockets::broadcast_text(&format!("{name} joined"));
            return Ok(());
        }
        post(&socket_name(socket), check_text(text)?).map(drop)
    }
}

impl Actor for Chat {
    fn new() -> Self {
        let router = Router::new()
            .get("/", |_, _, _| HELP)
            .post("/post", Chat::post)
            .get("/history", Chat::history)
            .get("/members", Chat::members);
        Chat {
            router,
            names: RefCell::new(HashMap::new()),
        }
    }

    fn fetch(&self, request: Request) -> Response {
        self.router.handle(self, &request)
    }

    fn socket_message(&self, socket: u64, message: Message) {
        let outcome = match message {
            Message::Text(text) => self.socket_text(socket, &text),
            Message::Binary(_) => Err(Error::BadRequest(
                "binary messages are not supported".to_owned(),
            )),
        };
        if let Err(err) = outcome {
            // Tell the sender only; the room does not hear about it.
            if sockets::send_text(socket, &format!("error: {err}")).is_err() {
                log::debug!("socket {socket} closed before its error reply: {err}");
            }
        }
    }

    fn socket_close(&self, socket: u64, _code: u16, _reason: String) {
        let name = self
            .names
            .borrow_mut()
            .remove(&socket)
            .unwrap_or_else(|| socket_name(socket));
        sockets::broadcast_text(&format!("{name} left"));
    }
}

wasmkeep_sdk::export_actor!(Chat);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name(" ann ").unwrap(), "ann");
        assert!(check_name("").is_err());
        assert!(check_name("a:b").is_err());
        assert!(check_name(&"x".repeat(NAME_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn texts_are_checked() {
        assert_eq!(check_text("hi\r\n").unwrap(), "hi");
        assert!(check_text("a\nb").is_err());
        assert!(check_text("\n").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
    }
}
