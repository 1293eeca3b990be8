//! HTTP requests from an actor to the outside world, over the standard
//! `wasi:http/outgoing-handler` import.
//!
//! Build a [`Request`] (`Request::get(url)`, `.header(..)`, `.body(..)` or
//! `.json(&value)`), then [`Request::send`] it: the call blocks until the
//! whole response has arrived and returns it as a [`Response`] (status,
//! lower-case headers, body), or an [`OutboundError`] saying why not.
//!
//! - **Nothing is allowed until the class allows it.** The host checks every
//!   request against the class's allow-list, set when the class is deployed:
//!   `wasmkeep deploy CLASS FILE --allow-outbound HOST[:PORT]` (repeatable).
//!   Any other host is refused with [`OutboundError::Denied`]; a host name
//!   that resolves to a private or loopback address is refused with
//!   [`OutboundError::AddressProhibited`] unless the allow-list also lists
//!   that address or its network (`10.0.0.0/8`).
//! - **A request is not undone.** The request leaves when `send` is called,
//!   not when the event commits: if the event then fails, or its writes roll
//!   back (a trap, a SQL error, a lost hand-over), the upstream has still
//!   seen the request, and the retried event sends it again. From the
//!   caller's side delivery is at least once: make such requests idempotent
//!   (an idempotency key in a header, a PUT rather than a POST).
//! - **Requests are bounded by the event's time.** The host stops a request
//!   when the event's remaining time runs out ([`OutboundError::Timeout`]).
//! - **The response body is read whole**, up to the node's cap
//!   ([`OutboundError::BodyTooLarge`] above it).
//!
//! An [`OutboundError`] converts into the SDK's [`Error`](crate::Error), so
//! `?` works in handlers that return [`Result`](crate::Result).
//!
//! # Example
//!
//! ```no_run
//! use wasmkeep_sdk::{Params, Request, Response, Result, outbound};
//!
//! fn weather(_: &Request, params: &Params) -> Result<Response> {
//!     let city = params.get("city").unwrap_or("oslo");
//!     let upstream = outbound::Request::get(format!("https://api.example.com/weather/{city}"))
//!         .header("accept", "text/plain")
//!         .send()?;
//!     if upstream.status != 200 {
//!         return Ok(Response::error(502, format!("the weather service answered {}", upstream.status)));
//!     }
//!     Ok(Response::text(upstream.text()?))
//! }
//! ```

/// Why an outbound request failed. The texts are stable: operators and tests
/// read them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// The host is not on the class's allow-list (wasi:http
    /// `HTTP-request-denied`).
    #[error("outbound request denied: the class's allow-list does not list this host")]
    Denied,
    /// The host name resolves to a private or loopback address that the
    /// allow-list does not name explicitly (`destination-IP-prohibited`).
    #[error(
        "outbound request denied: the host resolves to a private or loopback address that the allow-list does not list"
    )]
    AddressProhibited,
    /// The event's remaining time ran out while connecting, waiting for the
    /// response or reading it (`connection-timeout`, `HTTP-response-timeout`,
    /// `connection-read-timeout`, `connection-write-timeout`).
    #[error("outbound request timed out (the event's time runs out)")]
    Timeout,
    /// The response body is larger than the node's cap, in bytes when the
    /// host says it (`HTTP-response-body-size`).
    #[error("the response body is larger than the node allows{}", limit_suffix(.0))]
    BodyTooLarge(Option<u64>),
    /// The URL is not an `http://` or `https://` URL with a host; the request
    /// was not sent.
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    /// The request could not be built (a header or method HTTP does not
    /// allow, a header the host sets itself, a value that did not serialize
    /// as JSON); it was not sent.
    #[error("invalid outbound request: {0}")]
    InvalidRequest(String),
    /// The response arrived but its body is not what was asked for
    /// ([`Response::text`], [`Response::json`]).
    #[error("invalid response body: {0}")]
    InvalidResponse(String),
    /// Any other failure: the wasi:http error code, Debug-formatted (e.g.
    /// `ErrorCode::ConnectionRefused`).
    #[error("outbound request failed: {0}")]
    Failed(String),
}

fn limit_suffix(limit: &Option<u64>) -> String {
    match limit {
        Some(bytes) => format!(" ({bytes} bytes)"),
        None => String::new(),
    }
}

/// An outbound HTTP request, built step by step and sent with [`Request::send`].
///
/// Nothing is checked before `send`: a malformed URL, method or header is
/// reported by `send`, without calling the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// A failure of a builder step (the JSON body), reported by `send`.
    error: Option<OutboundError>,
}

impl Request {
    /// A request with `method` (any case; sent in upper case) to `url`
    /// (`http://` or `https://`, with a host, an optional port, path and
    /// query; a `#fragment` is not sent).
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            error: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url)
    }

    /// A `POST` request; give it a body with [`Request::body`] or [`Request::json`].
    pub fn post(url: impl Into<String>) -> Self {
        Self::new("POST", url)
    }

    /// Adds a header (the name is lower-cased), next to any of the same name.
    /// The host sets `host`, `connection`, `transfer-encoding` and a few
    /// others itself: `send` refuses them. `content-length` is set from the
    /// body when not given.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Replaces the body with `value` serialized as JSON, and sets
    /// `content-type: application/json` unless a content type is already set
    /// (so `.header("content-type", "application/merge-patch+json").json(&patch)`
    /// keeps its own). A value that does not serialize makes `send` fail with
    /// [`OutboundError::InvalidRequest`].
    ///
    /// ```no_run
    /// use wasmkeep_sdk::outbound;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Order<'a> {
    ///     item: &'a str,
    ///     count: u32,
    /// }
    ///
    /// # fn run() -> wasmkeep_sdk::Result<()> {
    /// let response = outbound::Request::post("https://shop.example.com/orders")
    ///     .header("idempotency-key", "order-1234")
    ///     .json(&Order { item: "tea", count: 2 })
    ///     .send()?;
    /// let id: u64 = response.json()?;
    /// # let _ = id;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => self.body = body,
            Err(err) => {
                self.error = Some(OutboundError::InvalidRequest(format!(
                    "the body does not serialize as JSON: {err}"
                )));
            }
        }
        if !self.has_header("content-type") {
            self.headers
                .push(("content-type".to_owned(), "application/json".to_owned()));
        }
        self
    }

    /// Sends the request and waits for the whole response, within the
    /// event's remaining time. A response with any status (404, 500, ...)
    /// is an `Ok`: only a request that got no complete response is an `Err`.
    ///
    /// The request is sent even if the event fails afterwards, and again if
    /// the event is retried: see the [module documentation](self).
    pub fn send(self) -> Result<Response, OutboundError> {
        if let Some(err) = self.error {
            return Err(err);
        }
        let target = parse_url(&self.url)?;
        check_method(&self.method)?;
        // A length rather than chunks: some servers refuse a chunked body,
        // and some a POST without a length (411).
        let with_length =
            !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH");
        let length = (with_length && !self.has_header("content-length"))
            .then(|| ("content-length".to_owned(), self.body.len().to_string()));
        let mut headers = self.headers;
        headers.extend(length);
        wasi::send(&self.method, &target, &headers, &self.body)
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers.iter().any(|(n, _)| n == name)
    }
}

/// The response to an outbound request: the upstream's status, headers
/// (names lower-case, in the order received) and whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text, or [`OutboundError::InvalidResponse`] when it is not UTF-8.
    pub fn text(&self) -> Result<String, OutboundError> {
        std::str::from_utf8(&self.body)
            .map(str::to_owned)
            .map_err(|err| OutboundError::InvalidResponse(format!("it is not UTF-8 text ({err})")))
    }

    /// The body parsed as JSON into `T`, or [`OutboundError::InvalidResponse`]
    /// with serde's reason.
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, OutboundError> {
        serde_json::from_slice(&self.body).map_err(|err| {
            OutboundError::InvalidResponse(format!(
                "it is not the JSON expected ({}): {err}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// Where a request goes: what wasi:http's `outgoing-request` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    https: bool,
    /// `host` or `host:port`, lower-case; an IPv6 address in brackets.
    authority: String,
    /// Starts with `/`; non-ASCII characters percent-encoded.
    path_and_query: String,
}

/// Parses an absolute `http://` or `https://` URL. Written here rather than
/// with the `url` crate to keep guests small: only what wasi:http needs is
/// split out and checked, the host validates the rest.
fn parse_url(url: &str) -> Result<Target, OutboundError> {
    let invalid = |why: String| OutboundError::InvalidUrl(format!("{url:?}: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("it must start with http:// or https://".to_owned()))?;
    let https = if scheme.eq_ignore_ascii_case("https") {
        true
    } else if scheme.eq_ignore_ascii_case("http") {
        false
    } else {
        return Err(invalid(format!(
            "the scheme {scheme:?} is not http or https"
        )));
    };
    // The fragment is the client's own: it is never sent.
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (authority, path_and_query) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    check_authority(authority).map_err(invalid)?;
    if let Some(bad) = path_and_query
        .chars()
        .find(|c| c.is_ascii_control() || *c == ' ')
    {
        return Err(invalid(format!(
            "its path or query has the character {bad:?}: percent-encode it"
        )));
    }
    let mut encoded = String::with_capacity(path_and_query.len() + 1);
    if !path_and_query.starts_with('/') {
        encoded.push('/');
    }
    for c in path_and_query.chars() {
        if c.is_ascii() {
            encoded.push(c);
        } else {
            // What a browser does with a non-ASCII character: its UTF-8 bytes, escaped.
            let mut utf8 = [0; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    Ok(Target {
        https,
        authority: authority.to_ascii_lowercase(),
        path_and_query: encoded,
    })
}

/// Checks `host[:port]`; the error says what is wrong.
fn check_authority(authority: &str) -> Result<(), String> {
    if authority.is_empty() {
        return Err("it has no host".to_owned());
    }
    if authority.contains('@') {
        return Err("user names and passwords in a URL are not sent: \
             use an authorization header"
            .to_owned());
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (address, after) = bracketed
            .split_once(']')
            .ok_or_else(|| "its IPv6 address has no closing ']'".to_owned())?;
        if address.is_empty()
            || !address.contains(':')
            || !address
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!("[{address}] is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("{after:?} follows the IPv6 address"))?,
            ),
        };
        (None, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(authority), None),
        }
    };
    if let Some(host) = host {
        if host.is_empty() {
            return Err("it has no host".to_owned());
        }
        if !host.is_ascii() {
            return Err(format!(
                "the host {host:?} is not ASCII: give an international name in its \
                 ASCII form (xn--...)"
            ));
        }
        if let Some(bad) = host
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
        {
            return Err(format!("the host {host:?} has the character {bad:?}"));
        }
    }
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|n| n != 0);
        if !valid {
            return Err(format!("the port {port:?} is not a number from 1 to 65535"));
        }
    }
    Ok(())
}

/// A method must be an HTTP token (RFC 9110 5.6.2): checked here so the
/// error names it.
fn check_method(method: &str) -> Result<(), OutboundError> {
    let token = !method.is_empty()
        && method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        Ok(())
    } else {
        Err(OutboundError::InvalidRequest(format!(
            "{method:?} is not an HTTP method"
        )))
    }
}

/// The calls to `wasi:http`. On a native target (the SDK's unit tests) the
/// bindings compile but must not be called.
mod wasi {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{
        ErrorCode, Fields, HeaderError, IncomingBody, IncomingResponse, Method, OutgoingBody,
        OutgoingRequest, Scheme,
    };
    use wasip2::io::streams::{InputStream, OutputStream, StreamError};

    use super::{OutboundError, Response, Target};

    /// How much one read of the response body asks for.
    const READ_CHUNK: u64 = 64 * 1024;

    pub(super) fn send(
        method: &str,
        target: &Target,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Response, OutboundError> {
        let fields = Fields::new();
        for (name, value) in headers {
            fields
                .append(name, value.as_bytes())
                .map_err(|err| header_error(name, err))?;
        }
        let request = OutgoingRequest::new(fields);
        request.set_method(&wasi_method(method)).map_err(|()| {
            OutboundError::InvalidRequest(format!("{method:?} is not an HTTP method"))
        })?;
        let scheme = if target.https {
            Scheme::Https
        } else {
            Scheme::Http
        };
        request
            .set_scheme(Some(&scheme))
            .and_then(|()| request.set_authority(Some(&target.authority)))
            .and_then(|()| request.set_path_with_query(Some(&target.path_and_query)))
            .map_err(|()| {
                OutboundError::InvalidUrl(format!(
                    "the host refused {}://{}{}",
                    if target.https { "https" } else { "http" },
                    target.authority,
                    target.path_and_query
                ))
            })?;
        // The body is taken before the request is handed over, and written
        // after: the host streams it to the upstream while it is written.
        let outgoing_body = if body.is_empty() {
            None
        } else {
            Some(request.body().map_err(|()| {
                OutboundError::InvalidRequest("the host gave no request body to write".to_owned())
            })?)
        };
        let future = outgoing_handler::handle(request, None).map_err(from_error_code)?;
        let mut write_error = None;
        if let Some(outgoing_body) = outgoing_body {
            let written = match outgoing_body.write() {
                Ok(stream) => write_all(&stream, body).map_err(stream_error),
                Err(()) => Err(OutboundError::Failed(
                    "the request body's stream was already taken".to_owned(),
                )),
            };
            // A body dropped without `finish` tells the host it is incomplete.
            write_error = match written {
                Ok(()) => OutgoingBody::finish(outgoing_body, None)
                    .err()
                    .map(from_error_code),
                Err(err) => Some(err),
            };
        }
        // A failed write usually means the request failed: its error code,
        // from the response, says better why.
        let response = loop {
            if let Some(outcome) = future.get() {
                break outcome;
            }
            future.subscribe().block();
        };
        let response = match response {
            Ok(Ok(response)) => response,
            Ok(Err(code)) => return Err(from_error_code(code)),
            Err(()) => {
                return Err(OutboundError::Failed(
                    "the response was already taken".to_owned(),
                ));
            }
        };
        if let Some(err) = write_error {
            return Err(err);
        }
        read_response(response)
    }

    /// Writes `body` as fast as the stream takes it: never more than
    /// `check-write` permits, waiting when it permits nothing.
    fn write_all(stream: &OutputStream, body: &[u8]) -> Result<(), StreamError> {
        let mut rest = body;
        while !rest.is_empty() {
            let permitted = stream.check_write()?;
            if permitted == 0 {
                stream.subscribe().block();
                continue;
            }
            let n = usize::try_from(permitted).map_or(rest.len(), |p| p.min(rest.len()));
            let (chunk, after) = rest.split_at(n);
            stream.write(chunk)?;
            rest = after;
        }
        stream.blocking_flush()
    }

    fn read_response(response: IncomingResponse) -> Result<Response, OutboundError> {
        let status = response.status();
        let headers = {
            let fields = response.headers();
            fields
                .entries()
                .into_iter()
                .map(|(name, value)| {
                    (
                        name.to_ascii_lowercase(),
                        String::from_utf8_lossy(&value).into_owned(),
                    )
                })
                .collect()
        };
        let incoming = response.consume().map_err(|()| {
            OutboundError::Failed("the response body was already taken".to_owned())
        })?;
        let body = read_body(incoming)?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// Reads the body to its end, then its trailers, which carry any error
    /// the host found after the last byte.
    fn read_body(incoming: IncomingBody) -> Result<Vec<u8>, OutboundError> {
        let stream: InputStream = incoming.stream().map_err(|()| {
            OutboundError::Failed("the response body's stream was already taken".to_owned())
        })?;
        let mut body = Vec::new();
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => body.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(err) => return Err(stream_error(err)),
            }
        }
        // The stream is a child of the body: it goes first.
        drop(stream);
        let trailers = IncomingBody::finish(incoming);
        let outcome = loop {
            if let Some(outcome) = trailers.get() {
                break outcome;
            }
            trailers.subscribe().block();
        };
        match outcome {
            Ok(Err(code)) => Err(from_error_code(code)),
            // Trailers (dropped here, before their future) or none: done.
            Ok(Ok(_)) | Err(()) => Ok(body),
        }
    }

    fn wasi_method(method: &str) -> Method {
        match method {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_owned()),
        }
    }

    fn header_error(name: &str, err: HeaderError) -> OutboundError {
        OutboundError::InvalidRequest(match err {
            HeaderError::Forbidden => {
                format!("the header {name:?} is set by the host, not by an actor")
            }
            HeaderError::InvalidSyntax => {
                format!("the header {name:?} has a name or value that HTTP does not allow")
            }
            HeaderError::Immutable => format!("the header {name:?} could not be set"),
        })
    }

    /// A stream failure, with the HTTP error code the host attached if any.
    fn stream_error(err: StreamError) -> OutboundError {
        match err {
            StreamError::Closed => OutboundError::Failed(
                "the connection closed before the body was transferred".to_owned(),
            ),
            StreamError::LastOperationFailed(io_error) => {
                match wasip2::http::types::http_error_code(&io_error) {
                    Some(code) => from_error_code(code),
                    None => OutboundError::Failed(io_error.to_debug_string()),
                }
            }
        }
    }

    /// The error a wasi:http error code stands for.
    pub(super) fn from_error_code(code: ErrorCode) -> OutboundError {
        match code {
            ErrorCode::HttpRequestDenied => OutboundError::Denied,
            ErrorCode::DestinationIpProhibited => OutboundError::AddressProhibited,
            ErrorCode::ConnectionTimeout
            | ErrorCode::HttpResponseTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout => OutboundError::Timeout,
            ErrorCode::HttpResponseBodySize(limit) => OutboundError::BodyTooLarge(limit),
            other => OutboundError::Failed(format!("{other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use wasip2::http::types::{DnsErrorPayload, ErrorCode};

    use super::wasi::from_error_code;
    use super::*;

    fn target(url: &str) -> (bool, String, String) {
        let target = parse_url(url).expect("a valid URL");
        (target.https, target.authority, target.path_and_query)
    }

    fn reason(url: &str) -> String {
        match parse_url(url) {
            Err(OutboundError::InvalidUrl(reason)) => reason,
            other => panic!("{url:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        assert_eq!(
            target("https://api.example.com/v1/items?limit=5&q=a%20b"),
            (
                true,
                "api.example.com".into(),
                "/v1/items?limit=5&q=a%20b".into()
            )
        );
        assert_eq!(
            target("HTTP://Example.COM:8080"),
            (false, "example.com:8080".into(), "/".into())
        );
        assert_eq!(
            target("http://example.com?x=1#top"),
            (false, "example.com".into(), "/?x=1".into())
        );
        assert_eq!(
            target("http://[::1]:9000/a/"),
            (false, "[::1]:9000".into(), "/a/".into())
        );
        assert_eq!(
            target("http://10.0.0.1/"),
            (false, "10.0.0.1".into(), "/".into())
        );
        assert_eq!(
            target("https://example.com/caf\u{e9}?q=\u{20ac}"),
            (true, "example.com".into(), "/caf%C3%A9?q=%E2%82%AC".into())
        );
    }

    #[test]
    fn malformed_urls_say_why() {
        assert!(reason("example.com/x").contains("http:// or https://"));
        assert!(reason("ftp://example.com/").contains("\"ftp\" is not http or https"));
        assert!(reason("https:///path").contains("no host"));
        assert!(reason("https://").contains("no host"));
        assert!(reason("https://:80/").contains("no host"));
        assert!(reason("https://user:pw@example.com/").contains("authorization header"));
        assert!(reason("https://example.com:0/").contains("1 to 65535"));
        assert!(reason("https://example.com:99999/").contains("1 to 65535"));
        assert!(reason("https://example.com:/").contains("1 to 65535"));
        assert!(reason("https://example.com:+80/").contains("1 to 65535"));
        assert!(reason("https://exa mple.com/").contains("' '"));
        assert!(reason("https://b\u{fc}cher.example/").contains("xn--"));
        assert!(reason("https://example.com/a b").contains("percent-encode"));
        assert!(reason("https://example.com/a\nb").contains("percent-encode"));
        assert!(reason("http://[::1/").contains("']'"));
        assert!(reason("http://[zz]/").contains("not an IPv6 address"));
        assert!(reason("http://[::1]x/").contains("follows the IPv6 address"));
        let err = parse_url("gopher://x").expect_err("not http");
        assert_eq!(
            err.to_string(),
            "invalid URL: \"gopher://x\": the scheme \"gopher\" is not http or https"
        );
    }

    #[test]
    fn methods_must_be_tokens() {
        assert_eq!(check_method("GET"), Ok(()));
        assert_eq!(check_method("PROPFIND"), Ok(()));
        assert!(check_method("").is_err());
        assert!(check_method("GE T").is_err());
        assert!(check_method("G\u{e9}T").is_err());
        assert_eq!(Request::new("patch", "http://x").method, "PATCH");
    }

    #[test]
    fn error_texts_are_the_documented_ones() {
        assert_eq!(
            OutboundError::Denied.to_string(),
            "outbound request denied: the class's allow-list does not list this host"
        );
        assert_eq!(
            OutboundError::AddressProhibited.to_string(),
            "outbound request denied: the host resolves to a private or loopback address \
             that the allow-list does not list"
        );
        assert_eq!(
            OutboundError::Timeout.to_string(),
            "outbound request timed out (the event's time runs out)"
        );
        assert_eq!(
            OutboundError::BodyTooLarge(Some(1_048_576)).to_string(),
            "the response body is larger than the node allows (1048576 bytes)"
        );
        assert_eq!(
            OutboundError::BodyTooLarge(None).to_string(),
            "the response body is larger than the node allows"
        );
        assert_eq!(
            OutboundError::InvalidUrl("x".into()).to_string(),
            "invalid URL: x"
        );
        assert_eq!(
            OutboundError::Failed("ErrorCode::ConnectionRefused".into()).to_string(),
            "outbound request failed: ErrorCode::ConnectionRefused"
        );
    }

    #[test]
    fn error_codes_map_to_errors() {
        assert_eq!(
            from_error_code(ErrorCode::HttpRequestDenied),
            OutboundError::Denied
        );
        assert_eq!(
            from_error_code(ErrorCode::DestinationIpProhibited),
            OutboundError::AddressProhibited
        );
        for code in [
            ErrorCode::ConnectionTimeout,
            ErrorCode::HttpResponseTimeout,
            ErrorCode::ConnectionReadTimeout,
            ErrorCode::ConnectionWriteTimeout,
        ] {
            assert_eq!(from_error_code(code), OutboundError::Timeout);
        }
        assert_eq!(
            from_error_code(ErrorCode::HttpResponseBodySize(Some(4096))),
            OutboundError::BodyTooLarge(Some(4096))
        );
        assert_eq!(
            from_error_code(ErrorCode::HttpResponseBodySize(None)),
            OutboundError::BodyTooLarge(None)
        );
        assert_eq!(
            from_error_code(ErrorCode::ConnectionRefused).to_string(),
            "outbound request failed: ErrorCode::ConnectionRefused"
        );
        let dns = from_error_code(ErrorCode::DnsError(DnsErrorPayload {
            rcode: Some("NXDOMAIN".into()),
            info_code: None,
        }));
        assert!(
            matches!(&dns, OutboundError::Failed(text) if text.starts_with("ErrorCode::DnsError") && text.contains("NXDOMAIN")),
            "{dns:?}"
        );
    }

    #[test]
    fn outbound_errors_convert_to_the_sdks_error_with_a_fitting_status() {
        fn status(err: OutboundError) -> u16 {
            crate::Error::from(err).status()
        }
        assert_eq!(status(OutboundError::Denied), 502);
        assert_eq!(status(OutboundError::BodyTooLarge(None)), 502);
        assert_eq!(status(OutboundError::Failed("x".into())), 502);
        assert_eq!(status(OutboundError::Timeout), 504);
        assert_eq!(status(OutboundError::InvalidUrl("x".into())), 500);
        assert_eq!(status(OutboundError::InvalidRequest("x".into())), 500);
        // The text is the outbound error's own.
        assert_eq!(
            crate::Error::from(OutboundError::Timeout).to_string(),
            OutboundError::Timeout.to_string()
        );
        fn handler() -> crate::Result<Response> {
            Ok(Request::get("nope").send()?)
        }
        assert!(matches!(
            handler(),
            Err(crate::Error::Outbound(OutboundError::InvalidUrl(_)))
        ));
    }

    #[test]
    fn the_builder_collects_headers_and_body() {
        let request = Request::post("http://x/")
            .header("X-Trace", "1")
            .body("hello");
        assert_eq!(request.headers, [("x-trace".to_owned(), "1".to_owned())]);
        assert_eq!(request.body, b"hello");
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_bodies_set_the_content_type_unless_one_is_set() {
        #[derive(serde::Serialize)]
        struct Item {
            n: u32,
        }
        let request = Request::post("http://x/").json(&Item { n: 3 });
        assert_eq!(request.body, br#"{"n":3}"#);
        assert!(request.has_header("content-type"));
        assert_eq!(request.headers.len(), 1);
        let own = Request::post("http://x/")
            .header("Content-Type", "application/merge-patch+json")
            .json(&Item { n: 3 });
        assert_eq!(
            own.headers,
            [(
                "content-type".to_owned(),
                "application/merge-patch+json".to_owned()
            )]
        );
        // A map with non-string keys does not serialize: send says so, without the host.
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = Request::post("http://x/").json(&bad).send().unwrap_err();
        assert!(
            matches!(&err, OutboundError::InvalidRequest(text) if text.contains("JSON")),
            "{err:?}"
        );
    }

    #[test]
    fn an_invalid_url_fails_before_the_host_is_called() {
        // On a native target a call to the host would panic: this returns.
        let err = Request::get("not a url").send().unwrap_err();
        assert!(matches!(err, OutboundError::InvalidUrl(_)), "{err:?}");
        let err = Request::new("BAD METHOD", "http://x/").send().unwrap_err();
        assert!(matches!(err, OutboundError::InvalidRequest(_)), "{err:?}");
    }

    #[test]
    fn responses_decode_their_body() {
        let response = Response {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: br#"{"a":[1,2]}"#.to_vec(),
        };
        assert_eq!(response.header("Content-Type"), Some("application/json"));
        assert_eq!(response.header("etag"), None);
        assert_eq!(response.text().as_deref(), Ok(r#"{"a":[1,2]}"#));
        let not_text = Response {
            body: vec![0xff, 0xfe],
            ..response.clone()
        };
        assert!(matches!(
            not_text.text(),
            Err(OutboundError::InvalidResponse(_))
        ));
        #[cfg(feature = "json")]
        {
            #[derive(serde::Deserialize, Debug, PartialEq)]
            struct Body {
                a: Vec<u32>,
            }
            assert_eq!(response.json::<Body>(), Ok(Body { a: vec![1, 2] }));
            let err = not_text.json::<Body>().unwrap_err();
            assert!(
                err.to_string().starts_with("invalid response body: "),
                "{err}"
            );
        }
    }
}
