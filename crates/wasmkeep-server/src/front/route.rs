//! Routing of request paths: `/<tenant>/<class>/<name>[/<rest>]` to an actor,
//! and the node's own `/_wasmkeep/` endpoints. Names are percent-decoded here
//! and validated by `wasmkeep_types`; the rest of the path is passed on as sent.

use percent_encoding::percent_decode_str;
use wasmkeep_types::{ActorId, ClassName, TenantName};

use crate::{Error, Result};

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Health,
    Metrics,
    /// The web console (ADR 0067): `path` is what follows
    /// `/_wasmkeep/console` (`""`, `/`, `/console.js`, `/api/nodes`, ...).
    Console {
        path: String,
    },
    /// A test route of `dev --test-routes` (ADR 0073): `path` is what
    /// follows `/_wasmkeep/test` (`/clock/advance`, `/actors/t/c/n/alarm`).
    Test {
        path: String,
    },
    /// An actor; `path` is `/<rest>` plus `?query` when there is one.
    Actor {
        actor: ActorId,
        path: String,
    },
}

/// Routes a raw (still percent-encoded) path and its query string.
pub fn route(raw_path: &str, query: Option<&str>) -> Result<Route> {
    match raw_path {
        "/_wasmkeep/health" => return Ok(Route::Health),
        "/_wasmkeep/metrics" => return Ok(Route::Metrics),
        _ => {}
    }
    if let Some(rest) = raw_path.strip_prefix("/_wasmkeep/console")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return Ok(Route::Console {
            path: rest.to_owned(),
        });
    }
    if let Some(rest) = raw_path.strip_prefix("/_wasmkeep/test")
        && rest.starts_with('/')
    {
        return Ok(Route::Test {
            path: rest.to_owned(),
        });
    }
    let Some(trimmed) = raw_path.strip_prefix('/') else {
        return Err(Error::NoRoute(raw_path.to_owned()));
    };
    let mut parts = trimmed.splitn(4, '/');
    let (Some(tenant), Some(class), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Error::NoRoute(raw_path.to_owned()));
    };
    if tenant == "_wasmkeep" {
        return Err(Error::NoRoute(raw_path.to_owned()));
    }
    let tenant = TenantName::new(decode("tenant name", tenant)?)?;
    let class = ClassName::new(decode("class name", class)?)?;
    let actor = ActorId::new(tenant, class, decode("actor name", name)?)?;
    let mut path = format!("/{}", parts.next().unwrap_or_default());
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    Ok(Route::Actor { actor, path })
}

pub(crate) fn decode(what: &'static str, raw: &str) -> Result<String> {
    let invalid = |reason| {
        Error::InvalidName(wasmkeep_types::Error::InvalidName {
            what,
            value: raw.chars().take(80).collect(),
            reason,
        })
    };
    // A `%` must start an escape: decoded leniently, `%zz` would name the
    // same actor as `%25zz`.
    let bytes = raw.as_bytes();
    for (at, _) in raw.match_indices('%') {
        let escape = bytes.get(at + 1..at + 3);
        if !escape.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
            return Err(invalid("has a % that is not followed by two hex digits"));
        }
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| invalid("does not percent-decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(raw: &str, query: Option<&str>) -> (String, String) {
        match route(raw, query).expect("routes") {
            Route::Actor { actor, path } => (actor.to_string(), path),
            other => panic!("not an actor route: {other:?}"),
        }
    }

    #[test]
    fn actor_paths_carry_rest_and_query() {
        assert_eq!(
            actor("/demo/counter/alice", None),
            ("demo/counter/alice".into(), "/".into())
        );
        assert_eq!(
            actor("/demo/counter/alice/increment", Some("by=2")),
            ("demo/counter/alice".into(), "/increment?by=2".into())
        );
        assert_eq!(
            actor("/demo/counter/alice/a/b%20c", None),
            ("demo/counter/alice".into(), "/a/b%20c".into())
        );
    }

    #[test]
    fn names_are_percent_decoded() {
        assert_eq!(
            actor("/demo/counter/al%2Fice%20%C3%A9", None).0,
            "demo/counter/al/ice é"
        );
    }

    #[test]
    fn node_endpoints_route() {
        assert_eq!(
            route("/_wasmkeep/health", None).expect("health"),
            Route::Health
        );
        assert_eq!(
            route("/_wasmkeep/metrics", None).expect("metrics"),
            Route::Metrics
        );
        assert!(matches!(
            route("/_wasmkeep/other/x", None),
            Err(Error::NoRoute(_))
        ));
        for (raw, rest) in [
            ("/_wasmkeep/console", ""),
            ("/_wasmkeep/console/", "/"),
            ("/_wasmkeep/console/api/actors", "/api/actors"),
        ] {
            assert_eq!(
                route(raw, Some("prefix=x")).expect("console"),
                Route::Console { path: rest.into() }
            );
        }
        assert!(matches!(
            route("/_wasmkeep/consoles", None),
            Err(Error::NoRoute(_))
        ));
    }

    #[test]
    fn bad_names_are_refused_with_invalid_name() {
        for bad in [
            "/Demo/counter/a",
            "/demo/coun.ter/a",
            "/demo/counter/",
            "/demo/counter/%FF",
            "/demo/counter/a%0Ab",
            "/demo/counter/%zz",
            "/demo/counter/a%",
            "/demo/counter/a%4",
            "/demo/c%7/a",
        ] {
            assert!(
                matches!(route(bad, None), Err(Error::InvalidName(_))),
                "{bad}"
            );
        }
        let long = format!("/demo/counter/{}", "x".repeat(513));
        assert!(matches!(route(&long, None), Err(Error::InvalidName(_))));
    }

    #[test]
    fn short_paths_have_no_route() {
        for bad in ["/", "/demo", "/demo/counter", ""] {
            assert!(matches!(route(bad, None), Err(Error::NoRoute(_))), "{bad}");
        }
    }
}
