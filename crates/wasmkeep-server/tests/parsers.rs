//! The parsers of outside and on-disk input, given arbitrary input
//! (issue 53, item 6): actor ids, the bucket's keys, heartbeats, ownership
//! records, class records, call chains, stored log records, signed node
//! calls, request paths, take bodies, secrets' identity and recipient
//! files, and component bytes given to deploy. Each answers or refuses,
//! never panics, and what wasmkeep writes parses back to what it wrote.
//! Property tests (proptest): `PROPTEST_CASES=N` sets the cases per
//! property (10,000 by default here, a few seconds in all; components are
//! compiled, so theirs default to 40, about 4 s); a failure is kept in
//! `tests/parsers.proptest-regressions`, committed, and run first from then
//! on. `scripts/fuzz [CASES]` is the long run of every such test (a million
//! cases by default).

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use wasmkeep_bucket::Bucket as _;
use wasmkeep_cluster::ownership::OwnershipRecord;
use wasmkeep_cluster::signing::{
    HEADER_FROM, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP, Signer, Verdict,
};
use wasmkeep_cluster::{SeededRandom, SystemClock};
use wasmkeep_server::Error;
use wasmkeep_server::actor::classes::Current;
use wasmkeep_server::actor::secrets::{identity_file_text, parse_identity, parse_recipient};
use wasmkeep_server::front::route::{Route, route};
use wasmkeep_server::peering::forward::{actor_path, decode_chain, encode_chain};
use wasmkeep_server::peering::moves::{parse_take_body, take_body};
use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId, TenantName};

fn keys() -> Keys {
    Keys::new(&AppName::default_app())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        // Next to this file: `tests/parsers.proptest-regressions`, kept in
        // the repository and run first.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

/// A heartbeat as a node writes it.
fn heartbeat() -> Heartbeat {
    Heartbeat {
        node: NodeId::new("n1").expect("valid"),
        advertise: "https://10.0.0.1:8443".into(),
        app: AppName::default_app(),
        incarnation: "0123abcd".into(),
        state: NodeState::Serving,
        classes: ClassesServed::All,
        resident_actors: 3,
        drain: DrainState::None,
        secrets: false,
        capabilities: BTreeSet::from(["moves".to_owned()]),
        generation: 7,
        sockets_closing: 0,
        releases_failed: 0,
        holder: "ff00".into(),
    }
}

/// A log record as a store writes it (one event on a memory bucket).
fn stored_record() -> &'static [u8] {
    static RECORD: OnceLock<Vec<u8>> = OnceLock::new();
    RECORD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let memory = Arc::new(wasmkeep_bucket::MemoryBucket::new());
            let bucket: Arc<dyn wasmkeep_bucket::Bucket> = memory.clone();
            let actor = ActorId::parse("t/c/a").expect("valid");
            let mut store = wasmkeep_store::ActorStore::open(
                bucket,
                keys(),
                actor.clone(),
                wasmkeep_store::WriterId {
                    node: "n1".into(),
                    incarnation: "i".into(),
                },
                wasmkeep_store::StoreConfig::default(),
            )
            .await
            .expect("open");
            store.execute("CREATE TABLE t (x)", &[]).expect("create");
            store
                .execute("INSERT INTO t VALUES ('a row')", &[])
                .expect("insert");
            store
                .commit_event()
                .expect("commit")
                .await
                .expect("durable");
            let key = keys().actor_log(&actor, 1);
            memory.get(&key).await.expect("record 1").bytes.to_vec()
        })
    })
}

/// The cluster key of the signed-call properties.
const CLUSTER_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A node's signer (`node` signs; a fresh one verifies, with no calls seen).
fn signer(node: &str, seed: u64) -> Signer {
    Signer::new(
        CLUSTER_KEY.to_vec(),
        node.into(),
        Arc::new(SystemClock),
        Arc::new(SeededRandom::new(seed)),
    )
    .expect("a long enough key")
}

/// The markers a node puts on its calls, with any values.
fn markers() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::sample::subsequence(
        vec![
            "x-wasmkeep-forwarded",
            "x-wasmkeep-call-chain",
            "x-wasmkeep-alarm",
            "x-wasmkeep-alarm-retry",
            "x-wasmkeep-take",
            "x-wasmkeep-waits-for",
        ],
        0..=6,
    )
    .prop_flat_map(|names| {
        let n = names.len();
        (Just(names), proptest::collection::vec("[ -~]{0,24}", n))
    })
    .prop_map(|(names, values)| names.into_iter().map(str::to_owned).zip(values).collect())
}

/// One change to a signed call: which part, where, and to what.
#[derive(Debug, Clone)]
enum Change {
    Method(String),
    Path(prop::sample::Index, char),
    Query(String),
    Body(prop::sample::Index, u8),
    BodyLonger(u8),
    /// A header's value (the signature's, timestamp's, nonce's, sender's or
    /// a marker's) replaced.
    Value(prop::sample::Index, String),
    /// A header removed.
    Removed(prop::sample::Index),
    /// A marker added.
    Added(String, String),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        "[A-Z]{1,8}".prop_map(Change::Method),
        (any::<prop::sample::Index>(), any::<char>()).prop_map(|(i, c)| Change::Path(i, c)),
        "\\PC{0,20}".prop_map(Change::Query),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, x)| Change::Body(i, x)),
        any::<u8>().prop_map(Change::BodyLonger),
        (any::<prop::sample::Index>(), "[ -~]{0,80}").prop_map(|(i, v)| Change::Value(i, v)),
        any::<prop::sample::Index>().prop_map(Change::Removed),
        ("x-wasmkeep-[a-z-]{1,12}", "[ -~]{0,24}").prop_map(|(n, v)| Change::Added(n, v)),
    ]
}

/// This machine's wall clock, in ms since the Unix epoch.
fn wall_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("before 2262")
}

/// The request path of an actor's request: `rest` after the actor's path.
fn routed(raw: &str, query: Option<&str>) -> Option<(ActorId, String)> {
    match route(raw, query) {
        Ok(Route::Actor { actor, path }) => Some((actor, path)),
        _ => None,
    }
}

/// An age identity made once (generating one per case would measure the
/// key generation).
fn identity() -> &'static age::x25519::Identity {
    static IDENTITY: OnceLock<age::x25519::Identity> = OnceLock::new();
    IDENTITY.get_or_init(age::x25519::Identity::generate)
}

/// Component properties compile what they are given (a damaged counter
/// takes ~50 ms): fewer cases.
fn component_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(40);
    ProptestConfig { cases, ..config() }
}

/// One runtime for every component property, as a node has one.
fn runtime() -> &'static wasmkeep_runtime::Runtime {
    static RUNTIME: OnceLock<wasmkeep_runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        wasmkeep_runtime::Runtime::new(wasmkeep_runtime::RuntimeConfig {
            cache_dir: None,
            memory_bytes_max: 32 << 20,
            instances_max: 4,
            ..wasmkeep_runtime::RuntimeConfig::default()
        })
        .expect("runtime")
    })
}

/// The counter guest (`scripts/build-guests`), where the target directory
/// has it; `None` (with a note) where it does not.
fn counter_component() -> Option<&'static [u8]> {
    static BYTES: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    BYTES
        .get_or_init(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
                || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
                std::path::PathBuf::from,
            );
            let path = target.join("wasm/counter.wasm");
            match std::fs::read(&path) {
                Ok(bytes) => Some(bytes),
                Err(e) => {
                    eprintln!(
                        "note: {} is missing ({e}): damaged components are not tried (scripts/build-guests builds it)",
                        path.display()
                    );
                    None
                }
            }
        })
        .as_deref()
}

/// Loads `bytes` as deploy does: a component, or an error that says why;
/// never a panic.
fn loads_or_refuses(bytes: &[u8]) -> Result<bool, TestCaseError> {
    match runtime().load_component(bytes) {
        Ok(_) => Ok(true),
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            Ok(false)
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn actor_ids_parse_or_refuse_and_round_trip(text in "\\PC{0,120}") {
        if let Ok(id) = ActorId::parse(&text) {
            prop_assert_eq!(ActorId::parse(&id.to_string()).expect("its own text"), id);
        }
    }

    #[test]
    fn the_keys_of_an_actor_parse_back_to_it(
        tenant in "[a-z][a-z0-9-]{0,20}",
        class in "[a-z][a-z0-9-]{0,20}",
        name in "\\PC{1,60}",
        seq in any::<u64>(),
        request in "[0-9a-f]{1,32}",
    ) {
        let Ok(actor) = ActorId::parse(&format!("{tenant}/{class}/{name}")) else {
            return Ok(());
        };
        let k = keys();
        let node = NodeId::new("n2").expect("valid");
        prop_assert_eq!(k.parse_delete_key(&k.delete_key(&actor, &request).expect("a valid request")).expect("delete key"), actor.clone());
        prop_assert_eq!(k.parse_owner_key(&k.owner(&actor)).expect("owner key"), actor.clone());
        prop_assert_eq!(k.parse_alarm_key(&k.alarm(&actor)).expect("alarm key"), actor.clone());
        prop_assert_eq!(
            k.parse_move_key(&k.move_key(&actor, &node)).expect("move key"),
            (actor.clone(), node)
        );
        prop_assert_eq!(Keys::parse_seq(&k.actor_log(&actor, seq)).expect("log key"), seq);
    }

    #[test]
    fn keys_of_any_text_parse_or_refuse(rest in "\\PC{0,200}") {
        let k = keys();
        for prefix in [k.moves_prefix(), k.deletes_prefix(), k.control_prefix(), k.classes_prefix(), String::new()] {
            let key = format!("{prefix}{rest}");
            let _ = k.parse_move_key(&key);
            let _ = k.parse_delete_key(&key);
            let _ = k.parse_owner_key(&key);
            let _ = k.parse_alarm_key(&key);
            let _ = k.parse_actor_data_key(&key);
            let _ = k.parse_node_key(&key);
            let _ = k.parse_class_current_key(&key);
            let _ = Keys::parse_seq(&key);
        }
    }

    #[test]
    fn heartbeats_parse_or_refuse_and_round_trip(
        text in "\\PC{0,400}",
        line in 0usize..16,
        replacement in "\\PC{0,40}",
    ) {
        let _ = Heartbeat::parse(&text);
        let written = heartbeat().to_text();
        prop_assert_eq!(Heartbeat::parse(&written).expect("its own text"), heartbeat());
        // One line of a real heartbeat replaced by anything.
        let mut lines: Vec<String> = written.lines().map(str::to_owned).collect();
        if line < lines.len() {
            lines[line] = replacement;
        }
        let _ = Heartbeat::parse(&lines.join("\n"));
    }

    #[test]
    fn ownership_records_parse_or_refuse(text in any::<String>()) {
        if let Some(record) = OwnershipRecord::parse(&text) {
            prop_assert_eq!(OwnershipRecord::parse(&record.to_text()), Some(record));
        }
    }

    #[test]
    fn class_records_parse_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(current) = Current::parse(&bytes) {
            prop_assert_eq!(Current::parse(current.to_text().as_bytes()), Ok(current));
        }
    }

    #[test]
    fn call_chains_parse_or_refuse(text in any::<String>()) {
        let _ = decode_chain(&text);
    }

    #[test]
    fn stored_records_of_any_bytes_parse_or_refuse(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let _ = wasmkeep_store::record_origin(&bytes);
        let record = stored_record();
        prop_assert!(wasmkeep_store::record_origin(record).is_ok());
        // A real record with bytes changed, or cut short: refused (the
        // checksum), never loaded, never a panic.
        let mut damaged = record.to_vec();
        for (at, xor) in &flips {
            let i = at.index(damaged.len());
            // From the original byte, so a second flip of one byte never
            // undoes the first.
            damaged[i] = record[i] ^ (xor | 1);
        }
        prop_assert!(wasmkeep_store::record_origin(&damaged).is_err());
        prop_assert!(wasmkeep_store::record_origin(&record[..cut.index(record.len())]).is_err());
    }

    #[test]
    fn a_signed_call_verifies_and_any_one_change_to_it_is_refused(
        method in prop::sample::select(vec!["GET", "POST", "PUT", "DELETE"]),
        path in "/[a-z0-9/%._-]{0,40}",
        query in "[a-z0-9=&%]{0,30}",
        markers in markers(),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        seed in any::<u64>(),
        change in change(),
    ) {
        let headers = signer("n1", seed).sign(method, &path, &query, &markers, &body);
        let (mut m, mut p, mut q, mut h, mut b) =
            (method.to_owned(), path.clone(), query.clone(), headers.clone(), body.clone());
        match change {
            // Another method (not the same one in other case: methods are
            // signed upper-cased).
            Change::Method(other) => m = if other == method { format!("{other}X") } else { other },
            Change::Path(at, c) => {
                let mut chars: Vec<char> = p.chars().collect();
                let i = at.index(chars.len());
                chars[i] = if chars[i] == c { if c == 'x' { 'y' } else { 'x' } } else { c };
                p = chars.into_iter().collect();
            }
            Change::Query(other) => q = if other == query { format!("{other}x") } else { other },
            Change::Body(at, xor) => {
                if b.is_empty() {
                    b.push(xor);
                } else {
                    let i = at.index(b.len());
                    b[i] ^= xor | 1;
                }
            }
            Change::BodyLonger(byte) => b.push(byte),
            Change::Value(at, value) => {
                let i = at.index(h.len());
                h[i].1 = if h[i].1 == value { format!("{value}x") } else { value };
            }
            Change::Removed(at) => {
                h.remove(at.index(h.len()));
            }
            Change::Added(name, value) => {
                if h.iter().any(|(n, _)| *n == name) {
                    return Ok(());
                }
                h.push((name, value));
            }
        }
        // The changed call first, to a verifier that saw nothing: refused
        // for the change, not as a replay.
        let verifier = signer("n2", seed ^ 1);
        let verdict = verifier.verify(&m, &p, &q, &h, &b);
        prop_assert!(
            matches!(verdict, Verdict::Refused(_) | Verdict::Unsigned),
            "a changed call: {:?}", verdict
        );
        match verifier.verify(method, &path, &query, &headers, &body) {
            Verdict::Verified { from, markers: seen } => {
                prop_assert_eq!(from, "n1");
                for marker in &markers {
                    prop_assert!(seen.contains(marker), "{:?} lost", marker);
                }
            }
            other => prop_assert!(false, "the call itself: {:?}", other),
        }
        prop_assert!(matches!(
            verifier.verify(method, &path, &query, &headers, &body),
            Verdict::Refused(_)
        ));
    }

    #[test]
    fn a_signed_call_of_any_timestamp_or_nonce_verifies_or_is_refused(
        timestamp in prop_oneof![
            any::<i64>().prop_map(|t| t.to_string()),
            prop::sample::select(vec![i64::MIN, i64::MIN + 1, i64::MAX, 0, -1]).prop_map(|t| t.to_string()),
            (-120_000i64..120_000).prop_map(|d| (wall_ms() + d).to_string()),
            "\\PC{0,24}",
        ],
        nonce in proptest::option::of(prop_oneof![
            "s[0-9a-f]{16}-[0-9]{1,20}",
            (any::<u64>(), any::<u64>()).prop_map(|(s, n)| format!("s{s:016x}-{n}")),
            "\\PC{0,40}",
        ]),
        again in proptest::collection::vec("s0123456789abcdef-[0-9]{1,20}", 0..4),
    ) {
        // The sender's own timestamp and nonce come after these, and the
        // first of a name is the one read: a peer holding the key could
        // send these values.
        let mut first = vec![(HEADER_TIMESTAMP.to_owned(), timestamp.clone())];
        if let Some(nonce) = &nonce {
            first.push((HEADER_NONCE.to_owned(), nonce.clone()));
        }
        let sender = signer("n1", 1);
        let verifier = signer("n2", 2);
        let headers = sender.sign("POST", "/t/c/a", "", &first, b"");
        let verdict = verifier.verify("POST", "/t/c/a", "", &headers, b"");
        let now = wall_ms();
        match timestamp.parse::<i64>() {
            Err(_) => prop_assert_eq!(verdict, Verdict::Refused("timestamp is not a number")),
            // Well inside the window (the clock moves between the two
            // readings): not refused for the time.
            Ok(ts) if ts.abs_diff(now) < 20_000 => {
                prop_assert!(matches!(verdict, Verdict::Verified { .. } | Verdict::Refused(_)), "{:?}", verdict);
                if nonce.is_none() {
                    prop_assert!(matches!(verdict, Verdict::Verified { .. }), "{:?}", verdict);
                }
            }
            Ok(ts) if ts.abs_diff(now) > 40_000 => match verdict {
                Verdict::Skewed { from, skew_ms } => {
                    prop_assert_eq!(from, "n1");
                    prop_assert_eq!(skew_ms.signum(), ts.saturating_sub(now).signum());
                }
                other => prop_assert!(false, "{} ms off: {:?}", ts.saturating_sub(now), other),
            },
            Ok(_) => {}
        }
        // More numbered calls of one stream, in any order: each verifies
        // or is refused.
        for nonce in again {
            let headers = sender.sign("GET", "/t/c/a", "", &[(HEADER_NONCE.to_owned(), nonce)], b"");
            let _ = verifier.verify("GET", "/t/c/a", "", &headers, b"");
        }
    }

    #[test]
    fn any_marker_headers_without_the_key_are_refused_or_unsigned(
        headers in proptest::collection::vec(
            (
                prop_oneof![
                    prop::sample::select(vec![HEADER_SIGNATURE, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_FROM, "X-Wasmkeep-Signature", "x-wasmkeep-take"]).prop_map(str::to_owned),
                    "x-wasmkeep-\\PC{0,12}",
                    "\\PC{0,20}",
                ],
                prop_oneof![
                    "v1=[0-9a-f]{64}",
                    "v1=\\PC{0,70}",
                    "[0-9]{1,20}",
                    "\\PC{0,40}",
                ],
            ),
            0..8,
        ),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let verdict = signer("n2", 2).verify("POST", "/t/c/a", "q", &headers, &body);
        prop_assert!(matches!(verdict, Verdict::Refused(_) | Verdict::Unsigned), "{:?}", verdict);
    }

    #[test]
    fn any_request_path_routes_or_is_refused(
        raw in prop_oneof![
            "\\PC{0,200}",
            "(/|%[0-9a-fA-F]{2}|%[0-9a-zA-Z]{0,2}|[a-z_]|\\PC){0,60}",
            "/_wasmkeep(/[a-z]{0,10}){0,3}",
        ],
        query in proptest::option::of("\\PC{0,40}"),
    ) {
        match route(&raw, query.as_deref()) {
            Ok(Route::Actor { actor, path }) => {
                prop_assert!(path.starts_with('/'));
                if let Some(query) = &query {
                    let with_query = format!("?{query}");
                    prop_assert!(path.ends_with(&with_query));
                }
                // The route of the actor's own path is the actor.
                prop_assert_eq!(routed(&actor_path(&actor), None), Some((actor, "/".to_owned())));
            }
            Ok(Route::Console { path }) => prop_assert!(path.is_empty() || path.starts_with('/')),
            Ok(Route::Test { path }) => prop_assert!(path.starts_with('/')),
            Ok(Route::Health | Route::Metrics) => {}
            Err(Error::NoRoute(_) | Error::InvalidName(_)) => {}
            Err(other) => prop_assert!(false, "refused otherwise: {:?}", other),
        }
    }

    #[test]
    fn the_path_of_an_actor_routes_to_it(
        tenant in "[a-z][a-z0-9-]{0,20}",
        class in "[a-z][a-z0-9-]{0,20}",
        name in "\\PC{1,60}",
        rest in "(/[a-zA-Z0-9%._~-]{0,10}){0,3}",
        query in proptest::option::of("[ -~]{0,30}"),
    ) {
        let Ok(actor) = ActorId::parse(&format!("{tenant}/{class}/{name}")) else {
            return Ok(());
        };
        let raw = format!("{}{rest}", actor_path(&actor));
        let mut path = if rest.is_empty() { "/".to_owned() } else { rest };
        if let Some(query) = &query {
            path.push('?');
            path.push_str(query);
        }
        prop_assert_eq!(routed(&raw, query.as_deref()), Some((actor.clone(), path)));
        // And in a call chain, alone or with others.
        let chain = vec![actor.clone(), ActorId::parse("t/c/other").expect("valid"), actor];
        prop_assert_eq!(decode_chain(&encode_chain(&chain)), Ok(chain));
    }

    #[test]
    fn take_bodies_parse_or_refuse_and_round_trip(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        text in "\\PC{0,100}",
        tenant in "[a-z][a-z0-9-]{0,30}",
    ) {
        let _ = parse_take_body(&bytes);
        let _ = parse_take_body(text.as_bytes());
        if let Ok(tenant) = TenantName::new(tenant) {
            let body = take_body(&tenant);
            prop_assert_eq!(parse_take_body(body.as_bytes()), Ok(tenant.clone()));
            // Its version line, then anything.
            let version = body.lines().next().expect("a version line");
            let _ = parse_take_body(format!("{version}\n{text}").as_bytes());
        }
    }

    #[test]
    fn secrets_identity_and_recipient_files_parse_or_refuse_and_round_trip(
        text in "\\PC{0,200}",
        bytes in proptest::collection::vec(any::<u8>(), 0..120),
        comments in proptest::collection::vec("(# \\PC{0,30})?", 0..3),
        cut in any::<prop::sample::Index>(),
    ) {
        let _ = parse_identity(&text);
        let _ = parse_recipient(&bytes);
        let _ = parse_recipient(text.as_bytes());
        use age::secrecy::ExposeSecret as _;
        let identity = identity();
        static RECIPIENT: OnceLock<String> = OnceLock::new();
        let recipient = RECIPIENT.get_or_init(|| identity.to_public().to_string()).clone();
        let key = identity.to_string().expose_secret().to_owned();
        let key_of = |read: age::x25519::Identity| read.to_string().expose_secret().to_owned();
        // What `secret keygen` writes, and with comment or blank lines
        // around it, reads back as the same key.
        let written = identity_file_text(identity);
        prop_assert_eq!(key_of(parse_identity(&written).expect("its own file")), key.clone());
        let commented = format!("{}\n  {key}  \n{}\n", comments.join("\n"), comments.join("\n"));
        prop_assert_eq!(key_of(parse_identity(&commented).expect("with comments")), key.clone());
        // The key cut short: refused.
        let short = &key[..cut.index(key.len())];
        prop_assert!(parse_identity(short).is_err());
        prop_assert_eq!(
            parse_recipient(format!("{recipient}\n").as_bytes()).expect("its own text").to_string(),
            recipient.clone()
        );
        prop_assert!(parse_recipient(&recipient.as_bytes()[..cut.index(recipient.len())]).is_err());
    }
}

proptest! {
    #![proptest_config(component_config())]

    #[test]
    fn any_bytes_given_to_deploy_load_as_a_component_or_are_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        preamble in prop::sample::select(vec![&b""[..], b"\0asm", b"\0asm\x0d\0\x01\0", b"\0asm\x01\0\0\0"]),
    ) {
        let mut file = preamble.to_vec();
        file.extend_from_slice(&bytes);
        prop_assert!(!loads_or_refuses(&file)?, "random bytes loaded");
    }

    #[test]
    fn a_damaged_component_given_to_deploy_loads_or_is_refused(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let Some(real) = counter_component() else {
            return Ok(());
        };
        let mut file = real.to_vec();
        for (at, xor) in &flips {
            let i = at.index(file.len());
            file[i] ^= xor | 1;
        }
        if let Some(cut) = cut {
            file.truncate(cut.index(file.len()));
        }
        loads_or_refuses(&file)?;
    }
}

#[test]
fn the_counter_component_itself_loads() {
    if let Some(real) = counter_component() {
        runtime().load_component(real).expect("the counter loads");
    }
}
