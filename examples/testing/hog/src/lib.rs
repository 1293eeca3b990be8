//! Test guest: allocates without bound on `/hog`; answers every other path.
//!
//! `GET /count` answers how many requests this instance has served, so a test
//! sees a fresh instance (count restarts at 1) after the runtime stops one.

wit_bindgen::generate!({ path: "../../../wit", world: "actor" });

use exports::wasmkeep::actor::{events, handler};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmkeep::actor::types::{Message, Request, Response};

static SERVED: AtomicU64 = AtomicU64::new(0);

struct Guest;

impl handler::Guest for Guest {
    fn handle(request: Request) -> Response {
        let served = SERVED.fetch_add(1, Ordering::Relaxed) + 1;
        if request.path == "/hog" {
            let mut chunks: Vec<Vec<u8>> = Vec::new();
            loop {
                // Touch every chunk so the allocation cannot be elided.
                chunks.push(std::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
        Response {
            status: 200,
            headers: Vec::new(),
            body: served.to_string().into_bytes(),
        }
    }
}

impl events::Guest for Guest {
    fn alarm(_scheduled_ms: i64, _retry_count: u32) -> Result<(), String> {
        Ok(())
    }
    fn socket_message(_id: u64, _message: Message) {}
    fn socket_close(_id: u64, _code: u16, _reason: String) {}
}

export!(Guest);
