//! Records the simulation's outcome per seed: one line per scenario and
//! seed, `<scenario> <seed> <digest> <violations>`, on standard output.
//!
//! A change meant to leave behaviour alone (issue 51's reshaping of the
//! node) must leave every line the same: record the lines before the change,
//! again after it, and compare them with `diff`.
//!
//! Usage: `cargo run --release -p wasmkeep-sim --example digests -- [a..b]`
//! (default `0..600`: each of the five scenarios runs those seeds).

use std::io::Write;

use wasmkeep_sim::{Scenario, parse_seed_range, run};

fn main() -> anyhow::Result<()> {
    let seeds = match std::env::args().nth(1) {
        Some(text) => parse_seed_range(&text)?,
        None => 0..600,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for scenario in Scenario::ALL {
        for seed in seeds.clone() {
            let report = run(&scenario.config(seed))?;
            writeln!(
                out,
                "{} {seed} {} {}",
                scenario.name(),
                report.digest,
                report.violations.len()
            )?;
        }
    }
    Ok(())
}
