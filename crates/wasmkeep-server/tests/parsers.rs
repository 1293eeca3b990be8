//! The parsers of outside and on-disk input, given arbitrary input
//! (issue 53, item 6): actor ids, the bucket's keys, heartbeats, ownership
//! records, class records, call chains and stored log records. Each answers
//! or refuses, never panics, and what wasmkeep writes parses back to what it
//! wrote. Property tests (proptest): `PROPTEST_CASES=N` sets the cases per
//! property (10,000 by default here, about a second in all; a long run is
//! `PROPTEST_CASES=1000000`); a failure is kept in
//! `tests/parsers.proptest-regressions`, committed, and run first from then
//! on.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use wasmkeep_bucket::Bucket as _;
use wasmkeep_cluster::ownership::OwnershipRecord;
use wasmkeep_server::actor::classes::Current;
use wasmkeep_server::peering::forward::decode_chain;
use wasmkeep_types::heartbeat::{ClassesServed, DrainState, Heartbeat, NodeState};
use wasmkeep_types::{ActorId, AppName, Keys, NodeId};

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
}
