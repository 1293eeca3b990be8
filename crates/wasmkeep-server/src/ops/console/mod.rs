//! The web console (ADR 0067): a page each node serves at
//! `/_wasmkeep/console` and the JSON API under `/_wasmkeep/console/api/`
//! that it reads. Everything it shows comes from the bucket, as the
//! command line's views read it ([`crate::ops::survey`]): the nodes, the
//! classes, the actors (by id prefix, paged), one actor's tables and rows,
//! a read-only SQL statement, the moves, drains and deletes under way. It
//! writes nothing, so any node shows the whole app and an actor's data is
//! read without waking it.
//!
//! The page, script and style are embedded in the binary and contain no
//! data; they are served to anyone. The API answers only with the
//! operator token when the node has one (`--console-token-file`), and a
//! node without one serves the console on loopback only.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderMap;
use sha2::{Digest as _, Sha256};
use wasmkeep_types::ActorId;

use crate::ops::survey;
use crate::{Console, Error, Node, Result};

type HttpResponse = hyper::Response<Full<Bytes>>;

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// Rows in a page of actors or of a table when the page asks for no number.
const PAGE_ROWS_DEFAULT: usize = 50;
/// Most rows in one page.
const PAGE_ROWS_MAX: usize = 1000;
/// Longest SQL statement the console takes (it travels in a URL).
const STATEMENT_BYTES_MAX: usize = 8 * 1024;

/// Nothing is fetched from elsewhere, nothing runs inline, and no other
/// site may frame the page.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Answers a request under `/_wasmkeep/console` (`path` is what follows).
pub async fn answer(
    node: &Arc<Node>,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<HttpResponse> {
    if matches!(node.config.console, Console::Off) {
        return Err(Error::NoRoute(format!("/_wasmkeep/console{path}")));
    }
    match path {
        "" | "/" => return Ok(asset("text/html; charset=utf-8", INDEX_HTML)),
        "/console.js" => return Ok(asset("text/javascript; charset=utf-8", CONSOLE_JS)),
        "/console.css" => return Ok(asset("text/css; charset=utf-8", CONSOLE_CSS)),
        _ => {}
    }
    let Some(call) = path.strip_prefix("/api/") else {
        return Err(Error::NoRoute(format!("/_wasmkeep/console{path}")));
    };
    authorize(&node.config.console, headers)?;
    let params: HashMap<String, String> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let body = match call {
        "session" => serde_json::json!({
            "node": node.node_id.as_str(),
            "app": node.config.app.as_str(),
            "token": matches!(node.config.console, Console::Token(_)),
        }),
        "nodes" => nodes(node).await?,
        "classes" => serde_json::json!({
            "classes": survey::class_rows(&*node.bucket, &node.keys).await?,
        }),
        "actors" => actors(node, &params).await?,
        "actor" => actor(node, &params).await?,
        "rows" => rows(node, &params).await?,
        "sql" => sql(node, &params).await?,
        "operations" => operations(node).await?,
        _ => return Err(Error::NoRoute(format!("/_wasmkeep/console{path}"))),
    };
    let mut response = hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a static status and header are valid");
    secure(&mut response);
    Ok(response)
}

/// The headers every console answer carries (error answers too).
pub fn secure(response: &mut HttpResponse) {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
}

fn asset(content_type: &'static str, text: &'static str) -> HttpResponse {
    let mut response = hyper::Response::builder()
        .status(200)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("a static status and header are valid");
    secure(&mut response);
    response
}

/// With a token: the request must carry it as `Authorization: Bearer`.
/// The hashes are compared, so the time taken says nothing of the token.
/// Without one (loopback only), the request must name a loopback host: a
/// web page elsewhere that rebinds its own name to 127.0.0.1 cannot read
/// the API through the browser of whoever runs the node.
fn authorize(console: &Console, headers: &HeaderMap) -> Result<()> {
    let token = match console {
        Console::Token(token) => token,
        Console::Open => {
            let host = headers
                .get(hyper::header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if !is_loopback_host(host) {
                return Err(Error::BadRequest(format!(
                    "the console without a token answers requests to 127.0.0.1, [::1] or \
                     localhost only, not to host {:?}",
                    host.chars().take(100).collect::<String>()
                )));
            }
            return Ok(());
        }
        Console::Off => return Err(Error::NoRoute("/_wasmkeep/console".into())),
    };
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .ok_or_else(|| Error::Unauthorized("the console asks for its operator token".into()))?;
    if Sha256::digest(given.trim().as_bytes()) != Sha256::digest(token.as_bytes()) {
        return Err(Error::Unauthorized(
            "that is not the console's operator token".into(),
        ));
    }
    Ok(())
}

/// Whether a Host header names this machine's loopback: `localhost`,
/// `127.0.0.1` (any of 127/8) or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || is_port(port) => {
                return v6
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok_and(|a| a.is_loopback());
            }
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

fn is_port(text: &str) -> bool {
    text.strip_prefix(':')
        .unwrap_or(text)
        .parse::<u16>()
        .is_ok()
}

fn actor_id(params: &HashMap<String, String>) -> Result<ActorId> {
    let id = params
        .get("id")
        .ok_or_else(|| Error::BadRequest("name the actor: ?id=TENANT/CLASS/NAME".into()))?;
    Ok(ActorId::parse(id)?)
}

fn page_size(params: &HashMap<String, String>) -> Result<usize> {
    match params.get("limit") {
        None => Ok(PAGE_ROWS_DEFAULT),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=PAGE_ROWS_MAX).contains(&n) => Ok(n),
            _ => Err(Error::BadRequest(format!(
                "limit {text:?}: a number from 1 to {PAGE_ROWS_MAX}"
            ))),
        },
    }
}

async fn nodes(node: &Node) -> Result<serde_json::Value> {
    let rows =
        wasmkeep_cluster::inspect::list_nodes(&*node.bucket, &node.keys, node.config.lease_ttl)
            .await?;
    Ok(serde_json::json!({ "nodes": rows }))
}

async fn actors(node: &Node, params: &HashMap<String, String>) -> Result<serde_json::Value> {
    let prefix = params.get("prefix").filter(|p| !p.is_empty());
    let after = params.get("after").filter(|a| !a.is_empty());
    let (rows, next) = survey::actor_page(
        &*node.bucket,
        &node.keys,
        node.config.lease_ttl,
        prefix.map(String::as_str),
        after.map(String::as_str),
        page_size(params)?,
    )
    .await?;
    Ok(serde_json::json!({ "actors": rows, "next": next }))
}

/// The actor's state read from the bucket; 404 when it has none.
async fn reader(node: &Node, actor: &ActorId) -> Result<wasmkeep_store::ActorStore> {
    survey::open_reader(Arc::clone(&node.bucket), node.keys.clone(), actor)
        .await?
        .ok_or_else(|| Error::NotFound(format!("actor {actor} has no data in the bucket")))
}

/// Runs one read-only statement; SQLite's message is the client's error.
fn query(
    store: &mut wasmkeep_store::ActorStore,
    statement: &str,
    params: &[wasmkeep_store::SqlValue],
) -> Result<wasmkeep_types::sql::SqlRows> {
    let rows = store
        .query(statement, params)
        .map_err(|e| Error::BadRequest(e.message));
    store.rollback_event();
    rows
}

/// The actor's tables and views (the store's own left out), by name.
fn tables(store: &mut wasmkeep_store::ActorStore) -> Result<Vec<(String, String)>> {
    let rows = query(
        store,
        "SELECT name, type FROM sqlite_schema WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_wasmkeep%' ESCAPE '\\' \
         ORDER BY name",
        &[],
    )?;
    Ok(rows
        .rows
        .into_iter()
        .filter_map(|row| match row.as_slice() {
            [
                wasmkeep_store::SqlValue::Text(name),
                wasmkeep_store::SqlValue::Text(kind),
            ] => Some((name.clone(), kind.clone())),
            _ => None,
        })
        .collect())
}

/// A name as an SQL identifier.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn actor(node: &Node, params: &HashMap<String, String>) -> Result<serde_json::Value> {
    let actor = actor_id(params)?;
    let Some(row) = wasmkeep_cluster::inspect::inspect_actor(
        &*node.bucket,
        &node.keys,
        node.config.lease_ttl,
        &actor,
    )
    .await?
    .filter(|row| row.database_bytes > 0 || row.owner.is_some() || row.alarm_ms.is_some()) else {
        return Err(Error::NotFound(format!(
            "actor {actor} has nothing in the bucket"
        )));
    };
    if survey::is_erased(&*node.bucket, &node.keys, &row).await? {
        return Err(Error::NotFound(format!("actor {actor} was deleted")));
    }
    // Sockets are known only where the actor is resident.
    let sockets = node
        .residents
        .live_stub(&actor)
        .map(|stub| stub.open_sockets());
    let mut tables_json = Vec::new();
    if row.database_bytes > 0 {
        let mut store = reader(node, &actor).await?;
        for (name, kind) in tables(&mut store)? {
            let count = query(
                &mut store,
                &format!("SELECT count(*) FROM {}", quoted(&name)),
                &[],
            )?;
            let rows = match count.rows.first().and_then(|r| r.first()) {
                Some(wasmkeep_store::SqlValue::Integer(n)) => Some(*n),
                _ => None,
            };
            tables_json.push(serde_json::json!({ "name": name, "type": kind, "rows": rows }));
        }
    }
    Ok(serde_json::json!({
        "actor": row,
        "resident_here": sockets.is_some(),
        "sockets": sockets,
        "tables": tables_json,
    }))
}

async fn rows(node: &Node, params: &HashMap<String, String>) -> Result<serde_json::Value> {
    let actor = actor_id(params)?;
    let table = params
        .get("table")
        .ok_or_else(|| Error::BadRequest("name the table: &table=NAME".into()))?;
    let limit = page_size(params)?;
    let offset: usize = match params.get("offset") {
        None => 0,
        Some(text) => text
            .parse()
            .map_err(|_| Error::BadRequest(format!("offset {text:?} is not a number")))?,
    };
    let mut store = reader(node, &actor).await?;
    if !tables(&mut store)?.iter().any(|(name, _)| name == table) {
        return Err(Error::NotFound(format!(
            "actor {actor} has no table {table:?}"
        )));
    }
    // One row more than the page says whether there is a next one.
    let page = query(
        &mut store,
        &format!("SELECT * FROM {} LIMIT ?1 OFFSET ?2", quoted(table)),
        &[
            wasmkeep_store::SqlValue::Integer(i64::try_from(limit + 1).unwrap_or(i64::MAX)),
            wasmkeep_store::SqlValue::Integer(i64::try_from(offset).unwrap_or(i64::MAX)),
        ],
    )?;
    let more = page.rows.len() > limit;
    let mut json = survey::json_rows(&wasmkeep_types::sql::SqlRows {
        columns: page.columns,
        rows: page.rows.into_iter().take(limit).collect(),
    });
    json["offset"] = offset.into();
    json["next_offset"] = more.then_some(offset + limit).into();
    Ok(json)
}

async fn sql(node: &Node, params: &HashMap<String, String>) -> Result<serde_json::Value> {
    let actor = actor_id(params)?;
    let statement = params
        .get("q")
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| Error::BadRequest("give the statement: &q=SELECT ...".into()))?;
    if statement.len() > STATEMENT_BYTES_MAX {
        return Err(Error::BadRequest(format!(
            "the statement is longer than {STATEMENT_BYTES_MAX} bytes"
        )));
    }
    let mut store = reader(node, &actor).await?;
    Ok(survey::json_rows(&query(&mut store, statement, &[])?))
}

/// The drains, moves and deletes asked for and not done yet.
async fn operations(node: &Node) -> Result<serde_json::Value> {
    let (bucket, keys) = (&*node.bucket, &node.keys);
    let nodes = wasmkeep_cluster::inspect::list_nodes(bucket, keys, node.config.lease_ttl).await?;
    let drains: Vec<serde_json::Value> = nodes
        .iter()
        .filter(|n| n.drain_requested || n.drain != "none")
        .map(|n| {
            serde_json::json!({
                "node": n.node,
                "requested": n.drain_requested,
                "state": n.drain,
                "resident_actors": n.resident_actors,
                "sockets_closing": n.sockets_closing,
                "releases_failed": n.releases_failed,
            })
        })
        .collect();
    let mut moves = Vec::new();
    let listed = bucket.list(&keys.moves_prefix()).await?;
    let app_has_secrets = !listed.is_empty() && survey::app_has_secrets(bucket, keys).await?;
    for meta in listed {
        let Ok((actor, target)) = keys.parse_move_key(&meta.key) else {
            continue;
        };
        let row =
            wasmkeep_cluster::inspect::inspect_actor(bucket, keys, node.config.lease_ttl, &actor)
                .await?;
        let holder = row.filter(|r| r.hold_valid).and_then(|r| r.owner);
        moves.push(serde_json::json!({
            "actor": actor.to_string(),
            "target": target.as_str(),
            "holder": holder,
            "progress": survey::move_progress(&nodes, &target, holder.as_deref(), app_has_secrets),
        }));
    }
    let mut deletes = Vec::new();
    for meta in bucket.list(&keys.deletes_prefix()).await? {
        if let Ok(actor) = keys.parse_delete_key(&meta.key) {
            deletes.push(serde_json::json!({ "actor": actor.to_string(), "key": meta.key }));
        }
    }
    let mut imports = Vec::new();
    for meta in bucket.list(&keys.imports_prefix()).await? {
        if let Ok((actor, _)) = keys.parse_import_key(&meta.key) {
            imports.push(serde_json::json!({
                "actor": actor.to_string(),
                "key": meta.key,
                "bytes": meta.size,
            }));
        }
    }
    Ok(serde_json::json!({
        "drains": drains,
        "moves": moves,
        "deletes": deletes,
        "imports": imports,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_reach_a_console_without_a_token() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:8787",
            "127.1.2.3:1",
            "localhost",
            "LOCALHOST:8787",
            "[::1]",
            "[::1]:8787",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:8787",
            "localhost.evil.example",
            "10.0.0.1:8787",
            "[::2]:8787",
            "[::1]x",
            "127.0.0.1:port",
            "127.0.0.1:99999",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn the_token_is_asked_for_as_a_bearer_token() {
        let console = Console::Token(Arc::new(zeroize::Zeroizing::new(
            "0123456789abcdef".to_owned(),
        )));
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                hyper::header::AUTHORIZATION,
                value.parse().expect("a header value"),
            );
            authorize(&console, &headers)
        };
        assert!(with("Bearer 0123456789abcdef").is_ok());
        assert!(with("bearer 0123456789abcdef").is_ok());
        for wrong in [
            "Bearer 0123456789abcdee",
            "Basic 0123456789abcdef",
            "Bearer",
            "",
        ] {
            assert!(
                matches!(with(wrong), Err(Error::Unauthorized(_))),
                "{wrong:?}"
            );
        }
        assert!(matches!(
            authorize(&console, &HeaderMap::new()),
            Err(Error::Unauthorized(_))
        ));
    }
}
