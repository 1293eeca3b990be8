//! The proxy actor: forwards a request to a URL given in the query and
//! answers with what came back, over the SDK's [`outbound`] client.
//!
//! - `GET /fetch?url=URL` sends a `GET` to `URL` (percent-encoded in the
//!   query); `POST /post?url=URL` sends this request's body as a `POST`.
//!   When the upstream answers, the reply has its status, its body and its
//!   `content-type` (if it sent one), and the status and URL are stored as
//!   the last request. When the request fails, the reply is a `502` whose
//!   plain-text body is exactly the [`OutboundError`]'s text, and nothing is
//!   stored. A missing or undecodable `url` is a `400` (a `+` in the query
//!   is a space, as in any query string: encode a plus as `%2B`).
//! - `GET /last` answers `"{status} {url}"` of the last request that got an
//!   answer, or `404` `no request made yet`.
//!
//! Nothing is reachable until the class is deployed with
//! `--allow-outbound HOST[:PORT]`.

use wasmkeep_sdk::{OutboundError, Params, Request, Response, Result, Router, outbound};
use wasmkeep_sdk::{params, sql};

const CREATE: &str = "CREATE TABLE IF NOT EXISTS last(\
     id INTEGER PRIMARY KEY CHECK (id = 1), status INTEGER NOT NULL, url TEXT NOT NULL)";
const STORE: &str = "INSERT INTO last(id, status, url) VALUES (1, ?, ?) \
     ON CONFLICT(id) DO UPDATE SET status = excluded.status, url = excluded.url";
const LAST: &str = "SELECT status, url FROM last WHERE id = 1";

const HELP: &str = "proxy actor
  GET  /fetch?url=URL   GET the (percent-encoded) URL; answers with its status, body and content-type
  POST /post?url=URL    POST this request's body to URL; same answer
  GET  /last            \"STATUS URL\" of the last request that was answered
An outbound request that fails is a 502 with the reason as the body.
";

/// A plain-text response with exactly `body` (no newline added).
fn plain(status: u16, body: impl Into<String>) -> Response {
    Response::text(body).with_status(status)
}

/// Decodes `%XX` escapes (and `+` as a space, as in any query string);
/// `None` when an escape is malformed or the bytes are not UTF-8.
fn decode_strict(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, after)) = rest.split_first() {
        match byte {
            b'%' => {
                let (&high, after) = after.split_first()?;
                let (&low, after) = after.split_first()?;
                let digit = |d: u8| {
                    char::from(d)
                        .to_digit(16)
                        .and_then(|d| u8::try_from(d).ok())
                };
                bytes.push(digit(high)? << 4 | digit(low)?);
                rest = after;
                continue;
            }
            b'+' => bytes.push(b' '),
            other => bytes.push(other),
        }
        rest = after;
    }
    String::from_utf8(bytes).ok()
}

/// The `url` query parameter, or the `400` that says what is wrong with it.
fn target_url(request: &Request) -> std::result::Result<String, Response> {
    let raw = request
        .query()
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some(("url", value)) => Some(value),
            _ => None,
        });
    let url = match raw {
        None | Some("") => {
            return Err(plain(
                400,
                "missing query parameter url (the percent-encoded URL to request)",
            ));
        }
        Some(raw) => decode_strict(raw).ok_or_else(|| {
            plain(
                400,
                "the query parameter url is not percent-encoded UTF-8 (a % must be followed by two hex digits)",
            )
        })?,
    };
    Ok(url)
}

/// Sends `upstream` and turns the outcome into this actor's reply, storing
/// the status of an answered request.
fn forward(url: String, upstream: outbound::Request) -> Result<Response> {
    let answer = match upstream.send() {
        Ok(answer) => answer,
        Err(err) => return Ok(failed(&err)),
    };
    store(answer.status, &url)?;
    let mut reply = Response::status(answer.status);
    if let Some(content_type) = answer.header("content-type") {
        reply = reply.with_header("content-type", content_type);
    }
    reply.body = answer.body;
    Ok(reply)
}

fn failed(err: &OutboundError) -> Response {
    plain(502, err.to_string())
}

fn store(status: u16, url: &str) -> Result<()> {
    match sql::execute(STORE, params![status, url]) {
        Err(err) if err.is_missing_table() => {
            sql::execute(CREATE, params![])?;
            sql::execute(STORE, params![status, url])?;
        }
        other => {
            other?;
        }
    }
    Ok(())
}

struct Proxy {
    router: Router<Proxy>,
}

impl Proxy {
    fn fetch(&self, request: &Request, _: &Params) -> Result<Response> {
        let url = match target_url(request) {
            Ok(url) => url,
            Err(reply) => return Ok(reply),
        };
        forward(url.clone(), outbound::Request::get(url))
    }

    fn post(&self, request: &Request, _: &Params) -> Result<Response> {
        let url = match target_url(request) {
            Ok(url) => url,
            Err(reply) => return Ok(reply),
        };
        let mut upstream = outbound::Request::post(url.clone()).body(request.body());
        if let Some(content_type) = request.header("content-type") {
            upstream = upstream.header("content-type", content_type);
        }
        forward(url, upstream)
    }

    fn last(&self, _: &Request, _: &Params) -> Result<Response> {
        let last = match sql::query_opt::<(i64, String)>(LAST, params![]) {
            Err(err) if err.is_missing_table() => None,
            other => other?,
        };
        Ok(match last {
            Some((status, url)) => plain(200, format!("{status} {url}")),
            None => plain(404, "no request made yet"),
        })
    }
}

impl wasmkeep_sdk::Actor for Proxy {
    fn new() -> Self {
        let router = Router::new()
            .get("/", |_, _, _| HELP)
            .get("/fetch", Proxy::fetch)
            .post("/post", Proxy::post)
            .get("/last", Proxy::last);
        Proxy { router }
    }

    fn fetch(&self, request: Request) -> Response {
        self.router.handle(self, &request)
    }
}

wasmkeep_sdk::export_actor!(Proxy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_decoded_strictly() {
        assert_eq!(
            decode_strict("http%3A%2F%2Fexample.com%2Fa%3Fb%3Dc").as_deref(),
            Some("http://example.com/a?b=c")
        );
        assert_eq!(decode_strict("a+b").as_deref(), Some("a b"));
        assert_eq!(decode_strict("%zz"), None);
        assert_eq!(decode_strict("50%"), None);
        assert_eq!(decode_strict("%ff"), None);
        assert_eq!(decode_strict("%+f"), None);
        assert_eq!(decode_strict("%C3%A9").as_deref(), Some("\u{e9}"));
    }

    #[test]
    fn a_missing_url_is_a_400() {
        let reply = target_url(&Request::new("GET", "/fetch?x=1")).unwrap_err();
        assert_eq!(reply.status, 400);
        let reply = target_url(&Request::new("GET", "/fetch?url=")).unwrap_err();
        assert_eq!(reply.status, 400);
        let reply = target_url(&Request::new("GET", "/fetch?url=%G1")).unwrap_err();
        assert_eq!(reply.status, 400);
        assert_eq!(
            target_url(&Request::new("GET", "/fetch?url=http%3A%2F%2Fx%2F")).ok(),
            Some("http://x/".to_owned())
        );
    }
}
