//! A small router: method + path patterns (`/items/:id`, `/files/*rest`) to
//! handlers, with `404` and `405` answers when nothing matches.

use crate::error::Error;
use crate::http::{IntoResponse, Request, Response, percent_decode_path};

type Handler<C> = Box<dyn Fn(&C, &Request, &Params) -> Response>;

/// Routes requests to handlers that receive a context `C` (usually the actor).
///
/// Patterns are matched segment by segment; empty segments are ignored, so
/// `/value/` matches `/value`. `:name` captures one segment, `*name` (last
/// only) captures the rest of the path. Routes are tried in the order added.
/// A path that some route matches with another method gets `405` with an
/// `allow` header; any other path gets `404`. `HEAD` runs the `GET` route
/// (unless a route takes `HEAD` itself). Captured segments are
/// percent-decoded; a `+` in a path stays a `+`.
pub struct Router<C> {
    routes: Vec<Route<C>>,
}

struct Route<C> {
    /// `None` matches every method.
    method: Option<String>,
    segments: Vec<Segment>,
    handler: Handler<C>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
    Rest(String),
}

/// The values a route's `:name` and `*name` segments captured, percent-decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    values: Vec<(String, String)>,
}

impl Params {
    /// The captured value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The captured value of `name` parsed as `T`, or a [`Error::BadRequest`].
    pub fn parse<T: std::str::FromStr>(&self, name: &str) -> Result<T, Error> {
        let text = self
            .get(name)
            .ok_or_else(|| Error::BadRequest(format!("missing path parameter {name}")))?;
        text.parse().map_err(|_| {
            Error::BadRequest(format!(
                "path parameter {name}={text:?} is not a valid {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

impl<C> Default for Router<C> {
    fn default() -> Self {
        Router { routes: Vec::new() }
    }
}

impl<C> Router<C> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a route for `method` (any case; `*` for every method).
    ///
    /// # Panics
    /// When `pattern` has a `*rest` segment that is not the last one: a
    /// programming error that shows at the first request.
    pub fn route<H, R>(mut self, method: &str, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        let segments = parse_pattern(pattern);
        let method = (method != "*").then(|| method.to_ascii_uppercase());
        self.routes.push(Route {
            method,
            segments,
            handler: Box::new(move |ctx, request, params| {
                handler(ctx, request, params).into_response()
            }),
        });
        self
    }

    pub fn get<H, R>(self, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        self.route("GET", pattern, handler)
    }

    pub fn post<H, R>(self, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        self.route("POST", pattern, handler)
    }

    pub fn put<H, R>(self, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        self.route("PUT", pattern, handler)
    }

    pub fn delete<H, R>(self, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        self.route("DELETE", pattern, handler)
    }

    /// A route for every method.
    pub fn any<H, R>(self, pattern: &str, handler: H) -> Self
    where
        H: Fn(&C, &Request, &Params) -> R + 'static,
        R: IntoResponse,
    {
        self.route("*", pattern, handler)
    }

    /// Runs the first route that matches, else answers `405` or `404`.
    pub fn handle(&self, ctx: &C, request: &Request) -> Response {
        let path: Vec<&str> = request
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let mut allowed: Vec<&str> = Vec::new();
        // HEAD runs the first GET route unless a route takes HEAD itself
        // (RFC 9110 9.3.2); the node sends its headers without the body.
        let mut head_as_get: Option<(&Route<C>, Params)> = None;
        let head = request.method() == "HEAD";
        for route in &self.routes {
            let Some(params) = match_segments(&route.segments, &path) else {
                continue;
            };
            match &route.method {
                Some(method) if method != request.method() => {
                    if head && method == "GET" && head_as_get.is_none() {
                        head_as_get = Some((route, params));
                        continue;
                    }
                    if !allowed.contains(&method.as_str()) {
                        allowed.push(method);
                    }
                    if method == "GET" && !allowed.contains(&"HEAD") {
                        allowed.push("HEAD");
                    }
                }
                _ => return (route.handler)(ctx, request, &params),
            }
        }
        if let Some((route, params)) = head_as_get {
            return (route.handler)(ctx, request, &params);
        }
        if allowed.is_empty() {
            Response::not_found()
        } else {
            Response::method_not_allowed(&allowed)
        }
    }
}

fn parse_pattern(pattern: &str) -> Vec<Segment> {
    let parts: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let last = parts.len().saturating_sub(1);
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            if let Some(name) = part.strip_prefix(':') {
                Segment::Param(name.to_owned())
            } else if let Some(name) = part.strip_prefix('*') {
                assert!(
                    i == last,
                    "route {pattern:?}: *{name} must be the last segment"
                );
                Segment::Rest(name.to_owned())
            } else {
                Segment::Literal(part.to_string())
            }
        })
        .collect()
}

fn match_segments(segments: &[Segment], path: &[&str]) -> Option<Params> {
    let mut params = Params::default();
    for (i, segment) in segments.iter().enumerate() {
        match segment {
            Segment::Literal(literal) => {
                if path.get(i) != Some(&literal.as_str()) {
                    return None;
                }
            }
            Segment::Param(name) => {
                let value = path.get(i)?;
                params
                    .values
                    .push((name.clone(), percent_decode_path(value)));
            }
            Segment::Rest(name) => {
                let rest = path.get(i..).unwrap_or_default().join("/");
                params
                    .values
                    .push((name.clone(), percent_decode_path(&rest)));
                return Some(params);
            }
        }
    }
    (segments.len() == path.len()).then_some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router<u32> {
        Router::new()
            .get("/", |_, _, _| "help")
            .get("/items/:id", |ctx: &u32, _, params: &Params| {
                let id: u64 = params.parse("id")?;
                Ok::<_, Error>(format!("{ctx} item {id}"))
            })
            .post("/items/:id", |_, _, _| Response::status(201))
            .get("/files/*path", |_, _, params: &Params| {
                params.get("path").unwrap_or_default().to_owned()
            })
    }

    fn body(response: &Response) -> &str {
        response.text_body().expect("utf-8 body")
    }

    #[test]
    fn params_are_captured_and_passed_to_the_handler() {
        let response = router().handle(&7, &Request::new("GET", "/items/42"));
        assert_eq!(response.status, 200);
        assert_eq!(body(&response), "7 item 42");
    }

    #[test]
    fn bad_param_is_a_400() {
        let response = router().handle(&7, &Request::new("GET", "/items/x"));
        assert_eq!(response.status, 400);
    }

    #[test]
    fn wrong_method_is_405_with_allow() {
        let response = router().handle(&7, &Request::new("DELETE", "/items/1"));
        assert_eq!(response.status, 405);
        assert_eq!(response.header("allow"), Some("GET, HEAD, POST"));
    }

    #[test]
    fn head_runs_the_get_route_unless_a_route_takes_head() {
        let response = router().handle(&7, &Request::new("HEAD", "/items/42"));
        assert_eq!((response.status, body(&response)), (200, "7 item 42"));
        let own = Router::new()
            .get("/x", |_, _, _| "get")
            .route("HEAD", "/x", |_, _, _| Response::status(204));
        assert_eq!(own.handle(&(), &Request::new("HEAD", "/x")).status, 204);
        // Only POST here: HEAD is not allowed.
        let response = router().handle(&7, &Request::new("HEAD", "/nope"));
        assert_eq!(response.status, 404);
    }

    #[test]
    fn a_plus_in_a_path_is_a_plus_and_in_a_query_a_space() {
        let response = router().handle(&0, &Request::new("GET", "/files/a+b%2Bc?q=x+y"));
        assert_eq!(body(&response), "a+b+c");
        let request = Request::new("GET", "/files/f?q=x+y%2Bz");
        assert_eq!(request.query_param("q").as_deref(), Some("x y+z"));
    }

    #[test]
    fn unknown_path_is_404() {
        assert_eq!(
            router().handle(&7, &Request::new("GET", "/nope")).status,
            404
        );
        assert_eq!(
            router()
                .handle(&7, &Request::new("GET", "/items/1/x"))
                .status,
            404
        );
    }

    #[test]
    fn root_and_rest_patterns_match() {
        assert_eq!(
            body(&router().handle(&0, &Request::new("GET", "/?x=1"))),
            "help"
        );
        let response = router().handle(&0, &Request::new("GET", "/files/a/b%20c"));
        assert_eq!(body(&response), "a/b c");
    }
}
