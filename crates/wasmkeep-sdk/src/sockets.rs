//! The actor's open WebSockets. The host opens a socket when a client upgrades
//! on the actor's path (without calling `fetch`), names it with an id, and
//! delivers its messages to [`Actor::socket_message`](crate::Actor::socket_message).

use crate::bindings::wasmkeep::actor::sockets as wit;
use crate::error::{Error, Result};

pub use crate::bindings::wasmkeep::actor::types::Message;

/// Sends one message to socket `socket`.
pub fn send(socket: u64, message: &Message) -> Result<()> {
    wit::send(socket, message).map_err(|message| Error::Socket { socket, message })
}

/// Sends a text message.
pub fn send_text(socket: u64, text: &str) -> Result<()> {
    send(socket, &Message::Text(text.to_owned()))
}

/// Sends a binary message.
pub fn send_binary(socket: u64, bytes: &[u8]) -> Result<()> {
    send(socket, &Message::Binary(bytes.to_vec()))
}

/// Closes socket `socket` with a WebSocket close code and reason.
pub fn close(socket: u64, code: u16, reason: &str) -> Result<()> {
    wit::close(socket, code, reason).map_err(|message| Error::Socket { socket, message })
}

/// The ids of the sockets open now.
pub fn list() -> Vec<u64> {
    wit::list()
}

/// Attaches a small tag (at most 256 bytes), e.g. the user's name.
pub fn set_tag(socket: u64, tag: &str) -> Result<()> {
    wit::set_tag(socket, tag).map_err(|message| Error::Socket { socket, message })
}

/// The tag of socket `socket`, if it has one.
pub fn tag(socket: u64) -> Option<String> {
    wit::get_tag(socket)
}

/// Sends `message` to every open socket; returns how many accepted it. A
/// socket that closes meanwhile is skipped, not an error.
pub fn broadcast(message: &Message) -> usize {
    list()
        .into_iter()
        .filter(|&socket| wit::send(socket, message).is_ok())
        .count()
}

/// Sends a text message to every open socket; returns how many accepted it.
pub fn broadcast_text(text: &str) -> usize {
    broadcast(&Message::Text(text.to_owned()))
}
