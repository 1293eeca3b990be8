//! Tenants end to end (ADR 0022): bearer tokens made by `wasmkeep tenant
//! token`, checked by a node started with `--tenant-tokens true` or by every
//! node once the app's policy in the bucket requires them (ADR 0059), and
//! actor-to-actor calls that never leave the caller's tenant.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{BIN, Resp, Server, failed, folder_bucket, guest, ok, request};

fn wasmkeep(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn node(dir: &Path, extra: &[&str]) -> Server {
    let bucket = folder_bucket(dir);
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let counter = format!("counter={}", guest("counter").display());
    let mut args = vec!["dev", "--bucket", bucket.as_str(), &ks, &counter];
    args.extend_from_slice(extra);
    Server::start(dir, &args)
}

fn token_create(dir: &Path, tenant: &str) -> String {
    let bucket = folder_bucket(dir);
    let out = ok(&wasmkeep(
        dir,
        &["tenant", "token", "create", tenant, "--bucket", &bucket],
    ));
    let token = out.trim().to_owned();
    assert!(
        token.starts_with("wk_") && token.len() == 67,
        "one token on stdout: {out:?}"
    );
    token
}

fn with_token(server: &Server, method: &str, path: &str, token: &str) -> Resp {
    let bearer = format!("Bearer {token}");
    request(
        &server.addr,
        method,
        path,
        &[("authorization", &bearer)],
        b"",
    )
}

fn assert_unauthorized(r: &Resp) {
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json_code(), "unauthorized");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
}

#[test]
fn tokens_are_required_checked_hidden_from_guests_and_revocable() {
    let dir = tempfile::tempdir().unwrap();
    let acme = token_create(dir.path(), "acme");
    let other = token_create(dir.path(), "other");
    let server = node(dir.path(), &["--tenant-tokens", "true"]);

    // Missing, malformed, unknown and other tenants' tokens: 401, and the
    // request reaches no actor (the increments below never happened).
    assert_unauthorized(&server.req("POST", "/acme/counter/c/increment"));
    let unknown = format!("wk_{}", "ab".repeat(32));
    for token in [other.as_str(), unknown.as_str(), "wk_short", "not-a-token"] {
        assert_unauthorized(&with_token(
            &server,
            "POST",
            "/acme/counter/c/increment",
            token,
        ));
    }
    assert_unauthorized(&request(
        &server.addr,
        "POST",
        "/acme/counter/c/increment",
        &[("authorization", &format!("Basic {acme}"))],
        b"",
    ));
    // Unknown classes are not revealed without a token either.
    assert_unauthorized(&server.req("GET", "/acme/nope/c/x"));
    // A WebSocket upgrade needs the token too.
    assert_unauthorized(&request(
        &server.addr,
        "GET",
        "/acme/counter/c/ws",
        &[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        b"",
    ));
    // The node's own endpoints stay open.
    assert_eq!(server.req("GET", "/_wasmkeep/health").status, 200);
    assert_eq!(server.req("GET", "/_wasmkeep/metrics").status, 200);

    let value = with_token(&server, "GET", "/acme/counter/c/value", &acme);
    assert_eq!((value.status, value.text().trim()), (200, "0"));
    let inc = with_token(&server, "POST", "/acme/counter/c/increment", &acme);
    assert_eq!((inc.status, inc.text().trim()), (200, "1"));

    // The guest never sees the token.
    let echo = with_token(&server, "POST", "/acme/ks/e/echo", &acme);
    assert_eq!(echo.status, 200, "{}", echo.text());
    assert_eq!(echo.header("x-method"), Some("POST"), "the echo ran");
    assert_eq!(echo.header("authorization"), None);

    // Only hashes are stored: no token is in the bucket in clear.
    let bucket_dir = dir.path().join("bucket");
    let mut stack = vec![bucket_dir];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let name = path.display().to_string();
            for token in [&acme, &other] {
                let hex = &token[3..];
                assert!(!name.contains(hex), "{name} names a token");
                assert!(
                    !bytes.windows(hex.len()).any(|w| w == hex.as_bytes()),
                    "{name} holds a token"
                );
            }
        }
    }

    // Revoked: refused within the cache time, without a restart.
    let bucket = folder_bucket(dir.path());
    let ids = ok(&wasmkeep(
        dir.path(),
        &["tenant", "token", "list", "acme", "--bucket", &bucket],
    ));
    let ids: Vec<&str> = ids.lines().collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ok(&wasmkeep(
        dir.path(),
        &[
            "tenant", "token", "revoke", "acme", ids[0], "--bucket", &bucket,
        ],
    ));
    server.wait_until("the revoked token refused", |s| {
        with_token(s, "GET", "/acme/counter/c/value", &acme).status == 401
    });
    let again = failed(&wasmkeep(
        dir.path(),
        &[
            "tenant", "token", "revoke", "acme", ids[0], "--bucket", &bucket,
        ],
    ));
    assert!(again.contains("no token"), "{again}");
    // A new token works within a second or so (unknown answers are cached
    // at most 1 s).
    let fresh = token_create(dir.path(), "acme");
    server.wait_until("the new token accepted", |s| {
        with_token(s, "GET", "/acme/counter/c/value", &fresh).status == 200
    });
    let value = with_token(&server, "GET", "/acme/counter/c/value", &fresh);
    assert_eq!(
        value.text().trim(),
        "1",
        "the refused requests changed nothing"
    );
}

fn policy(dir: &Path, verb: &str) -> String {
    let bucket = folder_bucket(dir);
    ok(&wasmkeep(
        dir,
        &["tenant", "policy", verb, "--bucket", &bucket],
    ))
}

/// GETs `path` until `status` answers, for at most `within` (a policy
/// change reaches a running node at its next heartbeat).
fn until_status(server: &Server, path: &str, status: u16, within: Duration) -> Resp {
    let deadline = Instant::now() + within;
    loop {
        let r = server.req("GET", path);
        if r.status == status || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_buckets_policy_binds_every_node_whatever_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let acme = token_create(dir.path(), "acme");
    assert_eq!(policy(dir.path(), "show").trim(), "optional");
    // A node started with --tenant-tokens true makes the app require them.
    let strict = node(dir.path(), &["--tenant-tokens", "true"]);
    assert_unauthorized(&strict.req("POST", "/acme/counter/c/increment"));
    assert!(strict.stop(), "a clean stop");
    assert_eq!(policy(dir.path(), "show").trim(), "required");

    // A node started without the flag is no more open than the bucket says.
    let heartbeat = ["--heartbeat", "200ms", "--lease-ttl", "2s"];
    let plain = node(dir.path(), &heartbeat);
    assert_unauthorized(&plain.req("POST", "/acme/counter/c/increment"));
    let inc = with_token(&plain, "POST", "/acme/counter/c/increment", &acme);
    assert_eq!((inc.status, inc.text().trim()), (200, "1"));

    // The operator opens the app: the running node follows at a heartbeat,
    // and a request without a token reaches the actor.
    policy(dir.path(), "optional");
    assert_eq!(policy(dir.path(), "show").trim(), "optional");
    let open = until_status(
        &plain,
        "/acme/counter/c/value",
        200,
        Duration::from_secs(10),
    );
    assert_eq!((open.status, open.text().trim()), (200, "1"));
    let inc = plain.req("POST", "/acme/counter/c/increment");
    assert_eq!((inc.status, inc.text().trim()), (200, "2"));

    // And closes it again: refused at the next heartbeat, and the refused
    // request changed nothing.
    policy(dir.path(), "require");
    let closed = until_status(
        &plain,
        "/acme/counter/c/value",
        401,
        Duration::from_secs(10),
    );
    assert_unauthorized(&closed);
    assert_unauthorized(&plain.req("POST", "/acme/counter/c/increment"));
    let value = with_token(&plain, "GET", "/acme/counter/c/value", &acme);
    assert_eq!((value.status, value.text().trim()), (200, "2"));
}

#[test]
fn tokens_are_off_in_dev_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &[]);
    let r = server.req("POST", "/acme/counter/c/increment");
    assert_eq!((r.status, r.text().trim()), (200, "1"));
}

#[test]
fn bad_tenant_names_and_ids_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    for bad in ["Bad Tenant", "a/b", ""] {
        let e = failed(&wasmkeep(
            dir.path(),
            &["tenant", "token", "create", bad, "--bucket", &bucket],
        ));
        assert!(e.contains("invalid"), "{bad:?}: {e}");
    }
    let e = failed(&wasmkeep(
        dir.path(),
        &[
            "tenant", "token", "create", "acme", "--bucket", &bucket, "--app", "Bad App",
        ],
    ));
    assert!(e.contains("invalid"), "{e}");
    let e = failed(&wasmkeep(
        dir.path(),
        &[
            "tenant", "token", "revoke", "acme", "xyz", "--bucket", &bucket,
        ],
    ));
    assert!(e.contains("not a token id"), "{e}");
    assert!(
        !dir.path().join("bucket/apps").exists(),
        "nothing was written"
    );
}

#[test]
fn a_guest_of_one_tenant_cannot_call_or_reach_another_tenants_actor() {
    let dir = tempfile::tempdir().unwrap();
    let server = node(dir.path(), &[]);
    for _ in 0..5 {
        assert_eq!(server.req("POST", "/beta/counter/x/increment").status, 200);
    }
    // A call names a class and a name: it lands in the caller's tenant.
    let r = server.req(
        "POST",
        "/alpha/ks/a/call?class=counter&name=x&path=/increment",
    );
    assert_eq!(
        (r.status, r.text().trim()),
        (200, "1"),
        "alpha's own counter"
    );
    // A class that looks like a path is refused with a clear error.
    let r = server.req(
        "POST",
        "/alpha/ks/a/call?class=beta/counter&name=x&path=/increment",
    );
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("own tenant"), "{}", r.text());
    // A name that looks like a path is just a name, in the caller's tenant.
    let r = server.req(
        "POST",
        "/alpha/ks/a/call?class=counter&name=../../beta/counter/x&path=/increment",
    );
    assert_eq!((r.status, r.text().trim()), (200, "1"), "{}", r.text());
    let beta = server.req("GET", "/beta/counter/x/value");
    assert_eq!(beta.text().trim(), "5", "beta's actor was never reached");
}

#[test]
fn a_token_of_one_app_opens_nothing_in_another() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let out = ok(&wasmkeep(
        dir.path(),
        &[
            "tenant", "token", "create", "acme", "--bucket", &bucket, "--app", "alpha",
        ],
    ));
    let token = out.trim().to_owned();
    let alpha = node(dir.path(), &["--tenant-tokens", "true", "--app", "alpha"]);
    let beta = node(dir.path(), &["--tenant-tokens", "true", "--app", "beta"]);
    assert_eq!(
        with_token(&alpha, "GET", "/acme/counter/c/value", &token).status,
        200
    );
    assert_unauthorized(&with_token(&beta, "GET", "/acme/counter/c/value", &token));
}

#[test]
fn signed_node_calls_skip_the_token_but_never_cross_tenants() {
    use std::sync::Arc;
    use wasmkeep_cluster::{OsRandom, Signer, SystemClock};

    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("cluster.key");
    std::fs::write(&key_file, "11".repeat(32)).unwrap();
    let server = node(
        dir.path(),
        &[
            "--tenant-tokens",
            "true",
            "--cluster-key-file",
            key_file.to_str().unwrap(),
        ],
    );
    let signer = |key: Vec<u8>| {
        Signer::new(
            key,
            "peer".into(),
            Arc::new(SystemClock),
            Arc::new(OsRandom),
        )
        .unwrap()
    };
    let peer = signer(vec![0x11; 32]);
    let stranger = signer(vec![0x22; 32]);
    let send = |signer: &Signer, path: &str, markers: &[(String, String)]| {
        let method = if path.ends_with("/value") {
            "GET"
        } else {
            "POST"
        };
        let headers = signer.sign(method, path, "", markers, b"");
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        request(&server.addr, method, path, &headers, b"")
    };
    let forwarded = [("x-wasmkeep-forwarded".to_owned(), "1".to_owned())];
    // A verified node call was checked at the first node: no token needed.
    let r = send(&peer, "/beta/counter/x/increment", &forwarded);
    assert_eq!((r.status, r.text().trim()), (200, "1"), "{}", r.text());
    // A call with a refused signature is a client's: it needs a token.
    assert_unauthorized(&send(&stranger, "/beta/counter/x/increment", &forwarded));
    // Even a verified call may not carry a call chain across tenants.
    let alpha = wasmkeep_types::ActorId::parse("alpha/ks/a").unwrap();
    let beta = wasmkeep_types::ActorId::parse("beta/counter/x").unwrap();
    let chain = wasmkeep_server::peering::forward::encode_chain(&[alpha, beta]);
    let r = send(
        &peer,
        "/beta/counter/x/increment",
        &[
            forwarded[0].clone(),
            ("x-wasmkeep-call-chain".to_owned(), chain),
        ],
    );
    assert_eq!(r.status, 508, "{}", r.text());
    assert!(r.text().contains("never cross tenants"), "{}", r.text());
    let r = send(&peer, "/beta/counter/x/value", &forwarded);
    assert_eq!(
        (r.status, r.text().trim()),
        (200, "1"),
        "only the first increment ran"
    );
}
