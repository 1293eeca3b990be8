//! Requests and responses as an actor sees them: the path without the
//! `/<tenant>/<class>/<name>` prefix, query helpers and response builders.

use crate::bindings::wasmkeep::actor::types as wit;
use crate::error::Error;

/// An HTTP request (or a call from another actor).
///
/// The path is the part after `/<tenant>/<class>/<name>` and always starts
/// with `/`; the query string is kept apart. Header names are lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    /// A request without headers or body, e.g. for [`crate::actors::call`].
    /// `path_and_query` may carry a query string: `/items?limit=5`.
    pub fn new(method: impl Into<String>, path_and_query: impl Into<String>) -> Self {
        let (path, query) = split_query(path_and_query.into());
        Request {
            method: method.into().to_ascii_uppercase(),
            path,
            query,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header; the name is lower-cased like every header the host delivers.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The method in upper case: `GET`, `POST`, ...
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The path without the query string, as sent (not percent-decoded).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The raw query string without the `?`; empty when there is none.
    pub fn query(&self) -> &str {
        &self.query
    }

    /// Every query parameter in order, percent-decoded (`+` is a space).
    pub fn query_params(&self) -> Vec<(String, String)> {
        self.query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) => (percent_decode(name), percent_decode(value)),
                None => (percent_decode(pair), String::new()),
            })
            .collect()
    }

    /// The first value of query parameter `name`, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query_params()
            .into_iter()
            .find_map(|(n, v)| (n == name).then_some(v))
    }

    /// Query parameter `name` parsed as `T`; `Ok(None)` when it is absent, a
    /// [`Error::BadRequest`] naming the parameter when it does not parse.
    pub fn query_parse<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, Error> {
        match self.query_param(name) {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|_| {
                Error::BadRequest(format!(
                    "query parameter {name}={text:?} is not a valid {}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }

    /// All headers, names lower-case, in the order received.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Takes the body out of the request.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// The body as UTF-8 text, or a [`Error::BadRequest`].
    pub fn text(&self) -> Result<&str, Error> {
        std::str::from_utf8(&self.body)
            .map_err(|_| Error::BadRequest("the body is not valid UTF-8".to_owned()))
    }

    pub(crate) fn from_wit(request: wit::Request) -> Self {
        let (path, query) = split_query(request.path);
        Request {
            method: request.method,
            path,
            query,
            headers: request.headers,
            body: request.body,
        }
    }

    pub(crate) fn into_wit(self) -> wit::Request {
        let path = if self.query.is_empty() {
            self.path
        } else {
            format!("{}?{}", self.path, self.query)
        };
        wit::Request {
            method: self.method,
            path,
            headers: self.headers,
            body: self.body,
        }
    }
}

/// An HTTP response. Build one with [`Response::text`], [`Response::json`],
/// [`Response::bytes`] or [`Response::status`], then adjust it with the `with_` methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

impl Response {
    /// An empty response with this status.
    pub fn status(status: u16) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// `200` with a plain-text body.
    pub fn text(body: impl Into<String>) -> Self {
        Self::bytes(TEXT_PLAIN, body.into())
    }

    /// `200` with a body the caller has already serialized as JSON.
    pub fn json(body: impl Into<String>) -> Self {
        Self::bytes("application/json", body.into())
    }

    /// `200` with any body and its content type.
    pub fn bytes(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status: 200,
            headers: vec![("content-type".to_owned(), content_type.to_owned())],
            body: body.into(),
        }
    }

    /// A plain-text error: `status` with `message` and a newline as the body.
    pub fn error(status: u16, message: impl std::fmt::Display) -> Self {
        Self::text(format!("{message}\n")).with_status(status)
    }

    /// `404 not found`.
    pub fn not_found() -> Self {
        Self::error(404, "not found")
    }

    /// `400` with the reason.
    pub fn bad_request(message: impl std::fmt::Display) -> Self {
        Self::error(400, message)
    }

    /// `405` with an `allow` header listing the methods the path accepts.
    pub fn method_not_allowed(allowed: &[&str]) -> Self {
        Self::error(405, "method not allowed").with_header("allow", allowed.join(", "))
    }

    /// Replaces the status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Adds a header (the name is lower-cased), next to any of the same
    /// name (`set-cookie`, `link`, ...). To change one the constructor set,
    /// e.g. the `content-type` of [`Response::text`], use
    /// [`Response::set_header`].
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }

    /// Sets a header (the name is lower-cased), replacing every header of
    /// that name.
    pub fn set_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value.into()));
        self
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 text, if it is.
    pub fn text_body(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    pub(crate) fn from_wit(response: wit::Response) -> Self {
        Response {
            status: response.status,
            headers: response.headers,
            body: response.body,
        }
    }

    pub(crate) fn into_wit(self) -> wit::Response {
        wit::Response {
            status: self.status,
            headers: self.headers,
            body: self.body,
        }
    }
}

/// What a handler may return: a [`Response`], text, or a `Result` whose error
/// becomes a response too (an SDK [`Error`] maps to its [`Error::status`]).
pub trait IntoResponse {
    fn into_response(self) -> Response;
}

impl IntoResponse for Response {
    fn into_response(self) -> Response {
        self
    }
}

impl IntoResponse for String {
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

impl IntoResponse for &'static str {
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

/// What a client is told of an error of the actor's own (a 500): its text
/// (a SQL message names tables, columns and sometimes values) goes to the
/// actor's log instead.
pub const INTERNAL_ERROR_TEXT: &str = "internal error in the actor (its log has the details)";

impl IntoResponse for Error {
    /// 400, 404 and 502 tell the client why; a 500 tells it only that the
    /// actor failed, and logs the error at `error` level.
    fn into_response(self) -> Response {
        let status = self.status();
        if status != 500 {
            return Response::error(status, &self);
        }
        #[cfg(target_arch = "wasm32")]
        crate::log::error(&format!("answered 500: {self}"));
        Response::error(status, INTERNAL_ERROR_TEXT)
    }
}

impl<T: IntoResponse, E: IntoResponse> IntoResponse for Result<T, E> {
    fn into_response(self) -> Response {
        match self {
            Ok(ok) => ok.into_response(),
            Err(err) => err.into_response(),
        }
    }
}

fn split_query(mut path: String) -> (String, String) {
    match path.find('?') {
        Some(at) => {
            let query = path[at + 1..].to_owned();
            path.truncate(at);
            (path, query)
        }
        None => (path, String::new()),
    }
}

/// Decodes `%XX` escapes and `+` (a space in query strings). Invalid escapes
/// are kept as written; invalid UTF-8 becomes U+FFFD.
pub fn percent_decode(text: &str) -> String {
    decode(text, true)
}

/// [`percent_decode`] for a path segment, where `+` is itself.
pub fn percent_decode_path(text: &str) -> String {
    decode(text, false)
}

fn decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2])) {
                    (Some(high), Some(low)) => {
                        out.push(high << 4 | low);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8(out)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

fn hex_digit(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_split_from_the_path_and_decoded() {
        let request = Request::new("get", "/history?limit=5&user=al%20ice+b&flag");
        assert_eq!(request.method(), "GET");
        assert_eq!(request.path(), "/history");
        assert_eq!(request.query_param("user").as_deref(), Some("al ice b"));
        assert_eq!(request.query_param("flag").as_deref(), Some(""));
        assert_eq!(request.query_parse::<u32>("limit"), Ok(Some(5)));
        assert_eq!(request.query_parse::<u32>("missing"), Ok(None));
    }

    #[test]
    fn set_header_replaces_and_with_header_adds() {
        let response = Response::text("<p>hi</p>")
            .set_header("Content-Type", "text/html")
            .with_header("set-cookie", "a=1")
            .with_header("Set-Cookie", "b=2");
        let values = |name: &str| {
            response
                .headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(values("content-type"), ["text/html"]);
        assert_eq!(values("set-cookie"), ["a=1", "b=2"]);
    }

    #[test]
    fn query_parse_names_the_bad_parameter() {
        let request = Request::new("POST", "/alarm?in_ms=soon");
        let err = request.query_parse::<u64>("in_ms").unwrap_err();
        assert!(err.to_string().contains("in_ms"), "{err}");
        assert_eq!(err.status(), 400);
    }

    #[test]
    fn percent_decode_keeps_invalid_escapes() {
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        assert_eq!(percent_decode("%e2%82%ac"), "\u{20ac}");
    }

    #[test]
    fn request_round_trips_its_query_through_the_wit_shape() {
        let request = Request::new("GET", "/a?b=c").with_header("X-Y", "z");
        let wit = request.clone().into_wit();
        assert_eq!(wit.path, "/a?b=c");
        assert_eq!(wit.headers, vec![("x-y".to_owned(), "z".to_owned())]);
        assert_eq!(Request::from_wit(wit), request);
    }

    #[test]
    fn errors_become_responses_with_their_status() {
        let response: Response = Err::<Response, _>(Error::BadRequest("no".into())).into_response();
        assert_eq!(response.status, 400);
        assert_eq!(response.header("Content-Type"), Some(TEXT_PLAIN));
        assert!(response.text_body().expect("utf-8").contains("no"));
    }

    #[test]
    fn an_actors_own_error_is_a_500_that_does_not_tell_the_client_why() {
        let secret = "UNIQUE constraint failed: users.email (alice@example.com)";
        let response: Response = Err::<Response, _>(Error::Sql(secret.into())).into_response();
        assert_eq!(response.status, 500);
        let body = response.text_body().expect("utf-8");
        assert!(!body.contains("alice"), "{body}");
        assert!(body.contains(INTERNAL_ERROR_TEXT), "{body}");
    }
}
