//! Calls to other actors of the same tenant. The callee receives the request
//! in its `fetch`, as it would an HTTP request.

use crate::bindings::wasmkeep::actor::actors as wit;
use crate::error::{Error, Result};
use crate::http::{Request, Response};

/// Sends `request` to actor `class/name` of this tenant and waits for its response.
pub fn call(class: &str, name: &str, request: Request) -> Result<Response> {
    wit::call(class, name, &request.into_wit())
        .map(Response::from_wit)
        .map_err(|message| Error::Call {
            class: class.to_owned(),
            name: name.to_owned(),
            message,
        })
}
