//! Planted mistakes the checkers must catch (ADR 0006). The switches are
//! process-global, so they live in this test binary of their own, and the
//! one test here runs its seeds one after another.

use std::time::{Duration, Instant};

use wasmkeep_cluster::planted;
use wasmkeep_sim::{FaultConfig, SimConfig, SimReport, run, seeds_from_env};

/// The bug must be caught within this many seeds.
const SEEDS_MAX: u64 = 40;

/// Bucket replies that are slow relative to the TTL and heartbeat pauses
/// (leases lapse while the node keeps receiving events): the conditions in
/// which counting a lease from the reply outlives the truth.
fn config(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        faults: FaultConfig {
            crashes: false,
            partitions: false,
            flaky_bucket: false,
            pauses: true,
            slow_bucket: true,
            reply_latency_max: Duration::from_millis(2000),
            slow_request_latency_max: Duration::from_millis(500),
            slow_reply_latency_max: Duration::from_millis(5000),
            ..FaultConfig::default()
        },
        ..SimConfig::default()
    }
}

fn lease_truth_violations(report: &SimReport) -> Vec<&String> {
    report
        .violations
        .iter()
        .filter(|v| v.contains("lease truth"))
        .collect()
}

#[test]
fn planted_lease_from_reply_is_caught() {
    let seeds = seeds_from_env(0..SEEDS_MAX).expect("SIM_SEED / SIM_SEEDS parse");
    let started = Instant::now();
    planted::set(&planted::LEASE_FROM_REPLY, true);
    let mut caught = None;
    let mut tried = 0;
    for seed in seeds {
        tried += 1;
        let report = run(&config(seed)).expect("the runtime starts");
        if let Some(first) = lease_truth_violations(&report).first() {
            caught = Some((seed, (*first).clone()));
            break;
        }
    }
    planted::set(&planted::LEASE_FROM_REPLY, false);
    let Some((seed, violation)) = caught else {
        panic!("LEASE_FROM_REPLY was not caught in {tried} seeds");
    };
    eprintln!(
        "LEASE_FROM_REPLY caught after {tried} seeds (seed {seed}) in {:.2} s: {violation}",
        started.elapsed().as_secs_f64()
    );
    // The checker caught the planted mistake, not something else: the same
    // seed without it shows no lease outliving its truth.
    let control = run(&config(seed)).expect("the runtime starts");
    assert!(
        lease_truth_violations(&control).is_empty(),
        "seed {seed} breaks the lease truth without the planted bug: {:?}",
        control.violations
    );
}
