//! Planted mistakes the checkers must catch (ADR 0006). The switches are
//! process-global, so they live in this test binary of their own, and its
//! tests take turns (one lock): each turns its switch on, runs seeds until a
//! checker catches the mistake, turns it off, and shows that the same seed
//! without the mistake is clean.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmkeep_cluster::planted;
use wasmkeep_sim::truth::{
    ALARM_EARLY, ALARM_LATE, FAILED_WRITE_VISIBLE, HISTORY, LEASE_TRUTH, MOVE_UNDONE, ONE_WRITER,
};
use wasmkeep_sim::{
    FaultConfig, OperatorConfig, SimConfig, SimReport, logs_from_env, repro_command, run,
    seeds_from_env,
};

/// The bug must be caught within this many seeds.
const SEEDS_MAX: u64 = 40;

/// One planted switch on at a time.
static TURN: Mutex<()> = Mutex::new(());

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

fn violations_of<'a>(report: &'a SimReport, checker: &str) -> Vec<&'a String> {
    report
        .violations
        .iter()
        .filter(|v| v.contains(checker))
        .collect()
}

/// Turns `switch` on, runs seeds until `checker` fires, turns it off, and
/// checks that the seed that caught it is clean of `checker` without it.
fn caught_within_bounded_seeds(
    name: &str,
    test_name: &str,
    switch: &AtomicBool,
    checker: &str,
    config: impl Fn(u64) -> SimConfig,
) {
    let _turn = TURN.lock();
    logs_from_env();
    let seeds = seeds_from_env(0..SEEDS_MAX).expect("SIM_SEED / SIM_SEEDS parse");
    let started = Instant::now();
    planted::set(switch, true);
    let mut caught = None;
    let mut tried = 0;
    for seed in seeds {
        tried += 1;
        let report = run(&config(seed)).expect("the runtime starts");
        if let Ok(path) = std::env::var("SIM_TRACE") {
            std::fs::write(&path, report.trace.join("\n")).expect("SIM_TRACE is writable");
        }
        if let Some(first) = violations_of(&report, checker).first() {
            caught = Some((seed, (*first).clone()));
            break;
        }
    }
    planted::set(switch, false);
    let Some((seed, violation)) = caught else {
        panic!("{name} was not caught in {tried} seeds");
    };
    eprintln!(
        "{name} caught after {tried} seeds (seed {seed}) in {:.2} s: {violation}\nreproduce: {}",
        started.elapsed().as_secs_f64(),
        repro_command(seed, "planted", test_name)
    );
    // The checker caught the planted mistake, not something else.
    let control = run(&config(seed)).expect("the runtime starts");
    assert!(
        violations_of(&control, checker).is_empty(),
        "seed {seed} fires {checker:?} without {name}: {:?}\nreproduce: {}",
        control.violations,
        repro_command(seed, "planted", test_name)
    );
}

#[test]
fn planted_lease_from_reply_is_caught() {
    caught_within_bounded_seeds(
        "LEASE_FROM_REPLY",
        "planted_lease_from_reply_is_caught",
        &planted::LEASE_FROM_REPLY,
        LEASE_TRUTH,
        config,
    );
}

/// The server before ADR 0062: a record durable only after its writer's
/// lease ran out is answered 503, and a new holder serves without fencing
/// the log; the record stays, and a write answered as failed is visible.
#[test]
fn planted_late_record_answered_failed_is_caught() {
    caught_within_bounded_seeds(
        "LATE_RECORD_ANSWERED_FAILED",
        "planted_late_record_answered_failed_is_caught",
        &planted::LATE_RECORD_ANSWERED_FAILED,
        FAILED_WRITE_VISIBLE,
        config,
    );
}

/// Every fault (crashes included), no operator: the plain run.
fn every_fault(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        ..SimConfig::default()
    }
}

/// An answer leaves before its record is durable: a crash then loses a
/// write its client saw acknowledged. The history checker names the event
/// whose write is missing, whatever the totals say.
#[test]
fn planted_ack_before_durable_is_caught() {
    caught_within_bounded_seeds(
        "ACK_BEFORE_DURABLE",
        "planted_ack_before_durable_is_caught",
        &planted::ACK_BEFORE_DURABLE,
        HISTORY,
        every_fault,
    );
}

/// Moves of busy actors (two actors, a request every 100 ms on average):
/// events keep reaching the old owner between its release and the take.
fn busy_moves(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        actors: 2,
        client_events: 1200,
        client_gap_max: Duration::from_millis(200),
        faults: FaultConfig {
            steps: 0,
            ..FaultConfig::default()
        },
        operator: OperatorConfig {
            steps: 40,
            gap_max: Duration::from_secs(5),
            moves: true,
            ..OperatorConfig::none()
        },
        ..SimConfig::default()
    }
}

/// The old owner forgets the move right after releasing the actor, so its
/// next event claims the actor back and the move ends on the old owner.
#[test]
fn planted_hibernate_after_release_is_caught() {
    caught_within_bounded_seeds(
        "HIBERNATE_AFTER_RELEASE",
        "planted_hibernate_after_release_is_caught",
        &planted::HIBERNATE_AFTER_RELEASE,
        MOVE_UNDONE,
        busy_moves,
    );
}

/// Alarm actors moved while their alarm is pending, over a network that
/// loses a fifth of the node calls (so some takes fail), no other fault, no
/// clock skew, and the alarm sweep too far away to matter: an alarm whose
/// take failed must still run on time, from the old owner's timer.
fn moves_with_lost_takes(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        skew_max: Duration::ZERO,
        alarm_sweep_period: Duration::from_secs(3600),
        alarm_lateness_max: Some(Duration::from_millis(2500)),
        faults: FaultConfig {
            steps: 0,
            forward_loss_probability: 0.2,
            ..FaultConfig::default()
        },
        operator: OperatorConfig {
            steps: 60,
            gap_max: Duration::from_secs(3),
            moves: true,
            alarms: true,
            alarm_delay_max: Duration::from_secs(10),
            alarm_actors: 2,
            ..OperatorConfig::none()
        },
        ..SimConfig::default()
    }
}

/// The old owner clears its alarm registration before the take: when the
/// take fails, nobody fires the alarm on time (the target takes the actor,
/// and arms its alarm, only passes later).
#[test]
fn planted_forget_alarm_before_take_is_caught() {
    caught_within_bounded_seeds(
        "FORGET_ALARM_BEFORE_TAKE",
        "planted_forget_alarm_before_take_is_caught",
        &planted::FORGET_ALARM_BEFORE_TAKE,
        ALARM_LATE,
        moves_with_lost_takes,
    );
}

/// The timer runs alarms a minute early: caught on the true clock (no
/// skew in this scenario).
#[test]
fn planted_alarm_early_is_caught() {
    caught_within_bounded_seeds(
        "ALARM_EARLY",
        "planted_alarm_early_is_caught",
        &planted::ALARM_EARLY,
        ALARM_EARLY,
        moves_with_lost_takes,
    );
}

/// Deletes and moves of busy actors under every fault (pauses included): a
/// holder paused past its lease wakes with a record in flight after its
/// actor was taken over and deleted.
fn deletes_under_faults(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        operator: OperatorConfig::deletes_and_moves(),
        ..SimConfig::default()
    }
}

/// `actor delete` frees the log's numbers: the actor's next life writes
/// record 1 again (one writer per record fires at seed 0), and a former
/// holder's in-flight record can land in that life (a deleted actor's write
/// came back: seed 367 of 0..400, too rare to wait for here).
#[test]
fn planted_erase_frees_numbers_is_caught() {
    caught_within_bounded_seeds(
        "ERASE_FREES_NUMBERS",
        "planted_erase_frees_numbers_is_caught",
        &planted::ERASE_FREES_NUMBERS,
        ONE_WRITER,
        deletes_under_faults,
    );
}

/// The conditions the planted mistakes need, without them: no checker fires
/// (so what catches a mistake is the mistake).
#[test]
fn without_planted_bugs_their_scenarios_are_clean() {
    let _turn = TURN.lock();
    logs_from_env();
    let seeds = seeds_from_env(0..SEEDS_MAX).expect("SIM_SEED / SIM_SEEDS parse");
    for seed in seeds {
        for (name, config) in [
            ("busy_moves", busy_moves(seed)),
            ("moves_with_lost_takes", moves_with_lost_takes(seed)),
            ("deletes_under_faults", deletes_under_faults(seed)),
        ] {
            let report = run(&config).expect("the runtime starts");
            assert!(
                report.passed(),
                "{name}, seed {seed}: {}",
                report.failure_message("planted", "without_planted_bugs_their_scenarios_are_clean")
            );
        }
    }
}
