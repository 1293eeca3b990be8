//! An actor's open WebSockets: the table its host (guest calls), its
//! mailbox (hand-over) and the sockets' own tasks share.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use wasmkeep_runtime::Message;

/// Close code sent to WebSocket clients when the node shuts down.
pub const CLOSE_SERVICE_RESTART: u16 = 1012;
/// WebSocket close code: a normal closure (the actor was deleted).
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code when the actor's store failed and the actor was dropped.
pub const CLOSE_INTERNAL_ERROR: u16 = 1011;
/// Longest wait for a client's close frame after this node sent one.
pub const CLOSE_HANDSHAKE_TIME_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Something to write to one WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    Message(Message),
    Close(u16, String),
}

/// One open WebSocket of an actor.
#[derive(Debug)]
pub struct SocketEntry {
    pub tx: mpsc::Sender<Outgoing>,
    pub tag: Option<String>,
    /// The actor closed it (a committed event did): no longer listed, no
    /// longer sent to, while the client answers the close.
    pub closing: bool,
}

/// An actor's open WebSockets, shared by its host (guest calls) and the
/// sockets' tasks (which add and remove themselves).
#[derive(Debug, Default)]
pub struct SocketTable {
    pub sockets: BTreeMap<u64, SocketEntry>,
    /// Sockets a hand-over took from the table that are still finishing
    /// their close handshake (each socket's task counts itself out).
    pub closing: usize,
}

impl SocketTable {
    /// Takes every socket out of the table; they count as closing until
    /// their tasks finish the close handshake.
    pub fn take_for_close(&mut self) -> BTreeMap<u64, SocketEntry> {
        let taken = std::mem::take(&mut self.sockets);
        self.closing += taken.len();
        taken
    }

    /// Removes socket `id`. False when a hand-over took it: then it no
    /// longer counts as closing.
    pub fn remove_closed(&mut self, id: u64) -> bool {
        let removed = self.sockets.remove(&id).is_some();
        if !removed {
            self.closing = self.closing.saturating_sub(1);
        }
        removed
    }
}

pub type SharedSockets = Arc<Mutex<SocketTable>>;
