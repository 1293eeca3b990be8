//! Write [wasmkeep](https://example.invalid/wasmkeep) actors in Rust.
//!
//! An actor is a type implementing [`Actor`], exported with
//! [`export_actor!`]. The host delivers its events one at a time: HTTP
//! requests and calls from other actors ([`Actor::fetch`]), its alarm
//! ([`Actor::alarm`]) and WebSocket messages and closes. Durable state lives in
//! the actor's SQLite database ([`sql`]); every write of one event commits
//! together when the event returns, and the response is released only once
//! the writes are durable. Fields of the actor value itself are a per-instance
//! cache: the instance may be replaced at any time (after a trap, a hand-over
//! to another node, hibernation).
//!
//! Build a guest with `cargo build --release --target wasm32-wasip2`; the
//! output is a component ready for `wasmkeep deploy`.
//!
//! # A complete counter
//!
//! ```no_run
//! use std::time::Duration;
//! use wasmkeep_sdk::{Actor, Params, Request, Response, Result, Router, alarm, params, sql};
//!
//! /// One statement per increment: the row is created on first use.
//! const INCREMENT: &str = "INSERT INTO counter(id, n) VALUES (1, 1) \
//!      ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n";
//!
//! struct Counter {
//!     router: Router<Counter>,
//! }
//!
//! impl Counter {
//!     fn increment(&self, _: &Request, _: &Params) -> Result<String> {
//!         let count = match sql::query_row::<(i64,)>(INCREMENT, params![]) {
//!             // Create the table only when the hot path finds it missing.
//!             Err(err) if err.is_missing_table() => {
//!                 sql::execute(
//!                     "CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
//!                     params![],
//!                 )?;
//!                 sql::query_row::<(i64,)>(INCREMENT, params![])?
//!             }
//!             other => other?,
//!         };
//!         Ok(count.0.to_string())
//!     }
//!
//!     fn value(&self, _: &Request, _: &Params) -> Result<String> {
//!         let count = match sql::query_value::<i64>("SELECT n FROM counter WHERE id = ?", params![1]) {
//!             Err(err) if err.is_missing_table() => None,
//!             other => other?,
//!         };
//!         Ok(count.unwrap_or(0).to_string())
//!     }
//!
//!     fn set_alarm(&self, request: &Request, _: &Params) -> Result<String> {
//!         let in_ms: u64 = request.query_parse("in_ms")?.unwrap_or(1_000);
//!         Ok(alarm::set_in(Duration::from_millis(in_ms)).to_string())
//!     }
//! }
//!
//! impl Actor for Counter {
//!     fn new() -> Self {
//!         let router = Router::new()
//!             .get("/", |_, _, _| "POST /increment, GET /value, POST /alarm?in_ms=N\n")
//!             .post("/increment", Counter::increment)
//!             .get("/value", Counter::value)
//!             .post("/alarm", Counter::set_alarm);
//!         Counter { router }
//!     }
//!
//!     fn fetch(&self, request: Request) -> Response {
//!         self.router.handle(self, &request)
//!     }
//!
//!     fn alarm(&self, scheduled_ms: i64, _retry_count: u32) -> std::result::Result<(), String> {
//!         wasmkeep_sdk::log::info!("alarm set for {scheduled_ms} fired");
//!         Ok(())
//!     }
//! }
//!
//! wasmkeep_sdk::export_actor!(Counter);
//! # fn main() {}
//! ```
//!
//! # Modules
//!
//! - [`http`]: [`Request`], [`Response`], [`IntoResponse`]; [`router`]: [`Router`].
//! - [`sql`]: `execute`, `query_row::<(i64, String)>`, [`params!`].
//! - [`alarm`]: `get`, `set_at`, `set_in`, `clear`.
//! - [`sockets`]: `send_text`, `broadcast_text`, `set_tag`, `tag`, `list`, `close`.
//! - [`outbound`]: HTTP requests to the outside world, `outbound::Request::get(url).send()`.
//! - [`actors::call`], [`secrets::get`], [`log`], [`id`].

pub mod actors;
pub mod alarm;
mod error;
pub mod http;
pub mod log;
pub mod outbound;
pub mod router;
pub mod secrets;
pub mod sockets;
pub mod sql;

pub use error::{Error, Result};
pub use http::{IntoResponse, Request, Response};
pub use outbound::OutboundError;
pub use router::{Params, Router};
pub use sockets::Message;

/// The actor's identity: tenant, class and name.
pub use bindings::wasmkeep::actor::types::ActorId;

/// The bindings wit-bindgen generates for `wit/actor.wit`; [`export_actor!`]
/// wires them. Use the modules above instead.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "actor",
        path: "../../wit",
        // The export macro is called from the guest crate by `export_actor!`,
        // which also places the component-type section there.
        pub_export_macro: true,
        export_macro_name: "__export_actor_impl",
    });
}

/// Who this actor is.
pub fn id() -> ActorId {
    bindings::wasmkeep::actor::identity::id()
}

/// An actor's event handlers. Every method has a default, so an actor
/// implements only the events it cares about.
///
/// The value is created with [`Actor::new`] before the first event of each
/// instance and lives as long as the instance; events never overlap, so a
/// `Cell`/`RefCell` field is enough for a per-instance cache.
pub trait Actor: Sized + 'static {
    /// Creates the actor value (no durable state is read here: do that in events).
    fn new() -> Self;

    /// An HTTP request to `/<tenant>/<class>/<name>/...` or a call from
    /// another actor. Default: `404`.
    fn fetch(&self, request: Request) -> Response {
        let _ = request;
        Response::not_found()
    }

    /// The alarm set for `scheduled_ms` fires; `retry_count` is 0 on the
    /// first delivery. An `Err` asks the host to retry with backoff.
    /// Default: nothing to do.
    fn alarm(&self, scheduled_ms: i64, retry_count: u32) -> std::result::Result<(), String> {
        let _ = (scheduled_ms, retry_count);
        Ok(())
    }

    /// A message from WebSocket `socket`. Default: ignored.
    fn socket_message(&self, socket: u64, message: Message) {
        let _ = (socket, message);
    }

    /// WebSocket `socket` closed (by the client or the host). Default: ignored.
    fn socket_close(&self, socket: u64, code: u16, reason: String) {
        let _ = (socket, code, reason);
    }
}

/// Exports an [`Actor`] type as the component's handlers: `export_actor!(MyActor);`
/// once per guest crate, at the top level.
#[macro_export]
macro_rules! export_actor {
    ($actor:ty) => {
        const _: () = {
            // wit-bindgen's export macro takes an identifier, not a path or generic type.
            type __WasmkeepExports = $crate::__private::Bridge<$actor>;
    $crate::__export_actor_impl!(__WasmkeepExports with_types_in $crate::bindings);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    //! The glue between wit-bindgen's generated traits and [`Actor`].

    use std::any::Any;
    use std::cell::OnceCell;
    use std::marker::PhantomData;

    use crate::bindings::exports::wasmkeep::actor::{events, handler};
    use crate::bindings::wasmkeep::actor::types;
    use crate::{Actor, Message, Request};

    /// Implements the generated `Guest` traits for any [`Actor`].
    pub struct Bridge<A>(PhantomData<A>);

    thread_local! {
        /// The one actor value of this instance, created at the first event.
        /// Leaked on purpose: it lives as long as the instance.
        static ACTOR: OnceCell<&'static dyn Any> = const { OnceCell::new() };
    }

    fn instance<A: Actor>() -> &'static A {
        let any = ACTOR.with(|cell| *cell.get_or_init(|| Box::leak(Box::new(A::new()))));
        any.downcast_ref::<A>()
            .expect("export_actor! is used once per component, with one actor type")
    }

    impl<A: Actor> handler::Guest for Bridge<A> {
        fn handle(request: types::Request) -> types::Response {
            instance::<A>().fetch(Request::from_wit(request)).into_wit()
        }
    }

    impl<A: Actor> events::Guest for Bridge<A> {
        fn alarm(scheduled_ms: i64, retry_count: u32) -> Result<(), String> {
            instance::<A>().alarm(scheduled_ms, retry_count)
        }

        fn socket_message(id: u64, message: Message) {
            instance::<A>().socket_message(id, message);
        }

        fn socket_close(id: u64, code: u16, reason: String) {
            instance::<A>().socket_close(id, code, reason);
        }
    }
}
