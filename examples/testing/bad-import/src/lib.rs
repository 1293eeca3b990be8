//! Test guest: implements the whole `actor` world but also imports an
//! interface the host does not provide (`test:bad-import/missing`), which the
//! runtime must refuse, naming that import.

wit_bindgen::generate!({
    path: "../../../wit",
    inline: "
        package test:bad-import;
        interface missing {
            ping: func() -> u32;
        }
        world bad-import {
            include wasmkeep:actor/actor@0.1.0;
            import missing;
        }
    ",
    world: "test:bad-import/bad-import",
    generate_all,
});

use exports::wasmkeep::actor::{events, handler};
use wasmkeep::actor::types::{Message, Request, Response};

struct Guest;

impl handler::Guest for Guest {
    fn handle(_request: Request) -> Response {
        let pong = test::bad_import::missing::ping();
        Response {
            status: 200,
            headers: Vec::new(),
            body: pong.to_string().into_bytes(),
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
