//! The folder bucket's journal as recovery reads it, given damaged or
//! arbitrary bytes (issue 53, item 6): a journal cut at any point, with
//! bytes appended or with bytes changed recovers exactly the entries
//! written before the damage, never a changed one and never a panic; and
//! whatever recovery reads from any bytes encodes back to those bytes.
//! Property tests (proptest): `PROPTEST_CASES=N` sets the cases per
//! property (10,000 by default here, a few seconds in all; a long run of
//! every such test is `scripts/fuzz`); a failure is kept in
//! `tests/journal.proptest-regressions`, committed, and run first from
//! then on.

use std::os::unix::fs::FileExt as _;

use proptest::prelude::*;
use wasmkeep_bucket::journal_fuzzing::{JournalEntry, REGION_BYTES, encode, recover};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        // Next to this file: `tests/journal.proptest-regressions`, kept in
        // the repository and run first.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

fn entry() -> impl Strategy<Value = JournalEntry> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        1u8..=3,
        "[a-z0-9/._-]{1,40}|\\PC{1,20}",
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<bool>(),
    )
        .prop_map(
            |(generation, order, index, kind, key, body, young)| JournalEntry {
                generation,
                order,
                index,
                kind,
                key,
                body,
                young,
            },
        )
}

/// `bytes` written at the start of region `region` of a journal file,
/// read back as recovery reads it. One file per thread, emptied each time,
/// in memory where there is a tmpfs (a new file on disk per case made this
/// test take three times as long).
fn recovered(region: u64, bytes: &[u8]) -> Vec<JournalEntry> {
    thread_local! {
        static FILE: std::fs::File = tempfile::tempfile_in("/dev/shm")
            .or_else(|_| tempfile::tempfile())
            .expect("temp file");
    }
    FILE.with(|file| {
        file.set_len(0).expect("empties");
        file.write_all_at(bytes, region * REGION_BYTES)
            .expect("writes");
        recover(file).expect("reads")
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_journal_cut_appended_to_or_changed_recovers_the_entries_before_the_damage(
        entries in proptest::collection::vec(entry(), 0..6),
        region in 0u64..2,
        cut in proptest::option::of(any::<prop::sample::Index>()),
        appended in proptest::collection::vec(any::<u8>(), 0..200),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let mut written = Vec::new();
        let mut ends = Vec::new();
        for entry in &entries {
            encode(&mut written, entry);
            ends.push(written.len());
        }
        // Whole, they all come back.
        prop_assert_eq!(&recovered(region, &written), &entries);

        let cut = cut.map_or(written.len(), |at| at.index(written.len() + 1));
        let mut damaged = written[..cut].to_vec();
        damaged.extend_from_slice(&appended);
        let mut first_change = cut;
        if !damaged.is_empty() {
            for (at, xor) in &flips {
                let i = at.index(damaged.len());
                damaged[i] ^= xor | 1;
                first_change = first_change.min(i);
            }
        }
        let whole_before = ends.iter().filter(|&&end| end <= first_change).count();
        prop_assert_eq!(&recovered(region, &damaged), &entries[..whole_before]);
    }

    #[test]
    fn what_recovery_reads_from_any_bytes_encodes_back_to_them(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        entries in proptest::collection::vec(entry(), 0..3),
        magic in any::<bool>(),
    ) {
        // Real entries, then anything (starting as an entry does, if asked).
        let mut file = Vec::new();
        for entry in &entries {
            encode(&mut file, entry);
        }
        if magic {
            file.extend_from_slice(&0x314A_4B57u32.to_le_bytes());
        }
        file.extend_from_slice(&bytes);
        let read = recovered(0, &file);
        let mut again = Vec::new();
        for entry in &read {
            prop_assert!((1..=3).contains(&entry.kind));
            encode(&mut again, entry);
        }
        prop_assert!(file.starts_with(&again));
        prop_assert!(read.len() >= entries.len());
        prop_assert_eq!(&read[..entries.len()], &entries[..]);
    }
}
