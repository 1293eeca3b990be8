//! `wasmkeep dev --test-routes` (ADR 0073): the routes a test harness in
//! another process (`@wasmkeep/test`, `wasmkeep-test` spawned) drives an
//! actor with. Each is one call of [`crate::direct`], the methods the
//! in-process harness calls, so both harnesses have one behaviour:
//!
//! ```text
//! POST /_wasmkeep/test/actors/<tenant>/<class>/<name>/alarm      -> {"ran": true} | 409 none set
//! POST /_wasmkeep/test/actors/<tenant>/<class>/<name>/hibernate  -> 204 | 409 a socket is open
//! GET  /_wasmkeep/test/actors/<tenant>/<class>/<name>/resident   -> {"resident": bool}
//! POST /_wasmkeep/test/actors/<tenant>/<class>/<name>/sql[?write=1]  body: the statement
//!      -> {"columns", "rows"} (read from the bucket; a write is 400) | with write=1, also "changes"
//! POST /_wasmkeep/test/clock/advance?ms=N                       -> {"now_ms", "ran": ["t/c/n", ...]}
//! GET  /_wasmkeep/test/clock                                    -> {"now_ms"}
//! POST /_wasmkeep/test/classes/<class>  body: the component     -> {"class", "digest"}
//! ```
//!
//! They exist only on a node whose config has a test clock (`dev
//! --test-routes`, refused unless it listens on loopback); elsewhere
//! these paths answer 404. Errors are the node's usual JSON answers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Method;
use hyper::body::Incoming;
use wasmkeep_types::{ActorId, ClassName, TenantName};

use crate::direct::AlarmRun;
use crate::front::route::decode;
use crate::node::Node;
use crate::ops::survey;
use crate::{Error, Result};

type HttpResponse = hyper::Response<Full<Bytes>>;

/// The largest component `classes/<class>` accepts (a TypeScript
/// component is some 12 MB).
const COMPONENT_BYTES_MAX: usize = 64 << 20;

/// The largest statement `sql` accepts.
const STATEMENT_BYTES_MAX: usize = 64 << 10;

/// The most one `clock/advance` moves the clock: ten years.
const ADVANCE_MS_MAX: u64 = 10 * 365 * 24 * 3600 * 1000;

/// Answers `/_wasmkeep/test<path>`.
pub async fn answer(
    node: &Arc<Node>,
    req: hyper::Request<Incoming>,
    path: &str,
) -> Result<HttpResponse> {
    let Some(clock) = node.config.test_clock.clone() else {
        return Err(Error::NoRoute(format!("/_wasmkeep/test{path}")));
    };
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or("").to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["clock"] => {
            only(&method, &Method::GET)?;
            json(200, &serde_json::json!({ "now_ms": clock.now_ms() }))
        }
        ["clock", "advance"] => {
            only(&method, &Method::POST)?;
            let ms = query_value(&query, "ms")
                .ok_or_else(|| Error::BadRequest("clock/advance needs ?ms=N".into()))?;
            let ms: u64 = ms
                .parse()
                .ok()
                .filter(|ms| *ms <= ADVANCE_MS_MAX)
                .ok_or_else(|| {
                    Error::BadRequest(format!(
                        "ms={ms:?}: a whole number of milliseconds, at most {ADVANCE_MS_MAX}"
                    ))
                })?;
            clock.advance(Duration::from_millis(ms));
            let ran = node.run_due_alarms().await?;
            let ran: Vec<String> = ran.iter().map(ToString::to_string).collect();
            json(
                200,
                &serde_json::json!({ "now_ms": clock.now_ms(), "ran": ran }),
            )
        }
        ["classes", class] => {
            only(&method, &Method::POST)?;
            let class = ClassName::new(decode("class name", class)?)?;
            let body = read_body(node, req, COMPONENT_BYTES_MAX).await?;
            let digest = node.deploy_now(&class, body).await?;
            json(
                200,
                &serde_json::json!({ "class": class.as_str(), "digest": digest }),
            )
        }
        ["actors", tenant, class, name, op] => {
            let actor = ActorId::new(
                TenantName::new(decode("tenant name", tenant)?)?,
                ClassName::new(decode("class name", class)?)?,
                decode("actor name", name)?,
            )?;
            actor_op(node, req, &actor, op, &query).await
        }
        _ => Err(Error::NoRoute(format!("/_wasmkeep/test{path}"))),
    }
}

async fn actor_op(
    node: &Arc<Node>,
    req: hyper::Request<Incoming>,
    actor: &ActorId,
    op: &str,
    query: &str,
) -> Result<HttpResponse> {
    let method = req.method().clone();
    match op {
        "alarm" => {
            only(&method, &Method::POST)?;
            match node.run_alarm_now(actor).await? {
                AlarmRun::Ran => json(200, &serde_json::json!({ "ran": true })),
                AlarmRun::NotSet | AlarmRun::NotDue => {
                    Err(Error::Conflict(format!("actor {actor} has no alarm set")))
                }
            }
        }
        "hibernate" => {
            only(&method, &Method::POST)?;
            node.hibernate(actor).await?;
            Ok(hyper::Response::builder()
                .status(204)
                .body(Full::new(Bytes::new()))
                .expect("a static status is valid"))
        }
        "resident" => {
            only(&method, &Method::GET)?;
            json(
                200,
                &serde_json::json!({ "resident": node.residents.has_stub(actor) }),
            )
        }
        "sql" => {
            only(&method, &Method::POST)?;
            let write = match query_value(query, "write").as_deref() {
                None | Some("0") => false,
                Some("1") => true,
                Some(other) => {
                    return Err(Error::BadRequest(format!("write={other:?}: 0 or 1")));
                }
            };
            let body = read_body(node, req, STATEMENT_BYTES_MAX).await?;
            let statement = String::from_utf8(body)
                .map_err(|_| Error::BadRequest("the statement is not UTF-8".into()))?;
            if write {
                json(200, &node.operator_sql(actor, &statement).await?)
            } else {
                let rows = node.read_sql(actor, &statement).await?;
                json(200, &survey::json_rows(&rows))
            }
        }
        other => Err(Error::NoRoute(format!(
            "/_wasmkeep/test/actors/{actor}/{other}: one of alarm, hibernate, resident, sql"
        ))),
    }
}

/// Refuses any method but `allowed` (each route answers one).
fn only(method: &Method, allowed: &Method) -> Result<()> {
    if method == allowed {
        return Ok(());
    }
    Err(Error::MethodNotAllowed {
        method: method.to_string(),
        allow: if *allowed == Method::GET {
            "GET"
        } else {
            "POST"
        },
    })
}

/// The first value of `name` in a query string.
fn query_value(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
}

async fn read_body(node: &Node, req: hyper::Request<Incoming>, limit: usize) -> Result<Vec<u8>> {
    super::body::read_body(
        req.into_body(),
        limit,
        node.config.limits.body_idle_time_max,
    )
    .await
}

fn json(status: u16, value: &serde_json::Value) -> Result<HttpResponse> {
    Ok(hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())))
        .expect("a status of this module and a static header are valid"))
}
