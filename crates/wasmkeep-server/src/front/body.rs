//! Reading a request's body within its limits, for the HTTP front and
//! the test routes.

use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};

use crate::{Error, Result};

/// Reads a request body of at most `limit` bytes, waiting at most
/// `idle_max` for each next part of it.
pub(crate) async fn read_body(body: Incoming, limit: usize, idle_max: Duration) -> Result<Vec<u8>> {
    if body.is_end_stream() {
        return Ok(Vec::new());
    }
    let mut body = Limited::new(body, limit);
    let mut bytes = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle_max, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => return Ok(bytes),
            Ok(Some(Err(e))) => {
                return Err(
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        Error::BodyTooLarge { limit_bytes: limit }
                    } else {
                        Error::BadRequest(format!("reading the body failed: {e}"))
                    },
                );
            }
            Err(_) => {
                return Err(Error::BodyStalled { waited: idle_max });
            }
        };
        if let Ok(data) = frame.into_data() {
            if bytes.is_empty() && body.is_end_stream() {
                // The common case, the whole body in one part: one copy.
                return Ok(data.to_vec());
            }
            bytes.extend_from_slice(&data);
        }
    }
}
