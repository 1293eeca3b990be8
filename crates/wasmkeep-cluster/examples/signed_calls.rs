//! How many signed calls one node verifies, and whether replay protection
//! refuses any valid one at a sustained rate (ADR 0060).
//!
//! `cargo run --release -p wasmkeep-cluster --example signed_calls -- [RATE] [SECONDS]`
//!
//! Eight senders sign calls at RATE calls per (virtual) second in total,
//! for SECONDS virtual seconds (defaults: 100,000 and 90, three signature
//! windows). Each sender's calls arrive shuffled within groups of 64, as
//! calls on pooled connections overtake each other. Prints the calls
//! verified, refused, and the verifier's rate in calls per CPU second
//! (signing is not timed).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};
use wasmkeep_cluster::{Clock, SeededRandom, Signer, Verdict};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const SENDERS: usize = 8;
const REORDER_GROUP: usize = 64;

/// Wall time moved by the loop: one call's share of a virtual second.
#[derive(Debug, Default)]
struct VirtualClock(AtomicI64);

impl Clock for VirtualClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[allow(clippy::print_stdout)] // the figures are the output
fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.replace([',', '_'], "")
                .parse()
                .expect("numbers: RATE SECONDS")
        })
        .collect();
    let rate = args.first().copied().unwrap_or(100_000);
    let seconds = args.get(1).copied().unwrap_or(90);
    let clock = Arc::new(VirtualClock(AtomicI64::new(1_700_000_000_000)));
    let senders: Vec<Signer> = (0..SENDERS)
        .map(|i| {
            Signer::new(
                KEY.to_vec(),
                format!("n{i}"),
                clock.clone(),
                Arc::new(SeededRandom::new(i as u64)),
            )
            .expect("a valid key")
        })
        .collect();
    let receiver = Signer::new(
        KEY.to_vec(),
        "receiver".into(),
        clock.clone(),
        Arc::new(SeededRandom::new(99)),
    )
    .expect("a valid key");
    let mut rng = StdRng::seed_from_u64(1);
    let total = rate * seconds;
    let per_group = (SENDERS * REORDER_GROUP) as u64;
    let (mut verified, mut refused) = (0u64, 0u64);
    let mut verify_time = std::time::Duration::ZERO;
    let mut sent = 0u64;
    let start_ms = clock.wall_ms();
    while sent < total {
        // One group per sender, signed at the current virtual time.
        let mut batch = Vec::with_capacity(per_group as usize);
        for sender in &senders {
            let mut group: Vec<_> = (0..REORDER_GROUP)
                .map(|_| sender.sign("POST", "/t/c/a/x", "", &[], b"body"))
                .collect();
            group.shuffle(&mut rng);
            batch.push(group);
        }
        let started = Instant::now();
        for group in &batch {
            for headers in group {
                match receiver.verify("POST", "/t/c/a/x", "", headers, b"body") {
                    Verdict::Verified { .. } => verified += 1,
                    Verdict::Refused(reason) => {
                        if refused == 0 {
                            eprintln!("first refusal after {verified} calls: {reason}");
                        }
                        refused += 1;
                    }
                    Verdict::Skewed { .. } => unreachable!("one clock signs and verifies"),
                    Verdict::Unsigned => unreachable!("every call is signed"),
                }
            }
        }
        verify_time += started.elapsed();
        sent += per_group;
        let elapsed_ms = i64::try_from(sent * 1000 / rate).unwrap_or(i64::MAX);
        clock.0.store(start_ms + elapsed_ms, Ordering::Relaxed);
    }
    println!(
        "rate {rate} calls/s for {seconds} s virtual: {verified} verified, {refused} refused; verifier {:.0} calls per CPU second",
        verified as f64 / verify_time.as_secs_f64()
    );
}
