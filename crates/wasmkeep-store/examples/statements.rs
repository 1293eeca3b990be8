//! CPU per guest statement on the common path (ADR 0063): the counter's
//! event (an upsert with `RETURNING`, then a read by key), run N times
//! (default 200,000) on one store over the memory bucket, on a runtime with
//! one async worker as in a node, without waiting for durability. Prints
//! microseconds per event and per statement, best of five rounds, and how
//! many statements ran off the async worker (none should).
//!
//! `cargo run --release -p wasmkeep-store --example statements [N]`

use std::sync::Arc;
use std::time::Instant;

use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

const UPSERT: &str =
    "INSERT INTO counter(id, n) VALUES (?, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n";
const READ: &str = "SELECT n FROM counter WHERE id = ?";

#[allow(clippy::print_stdout)] // a measurement reports on stdout
fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let per_event_us = runtime.block_on(async move {
        tokio::spawn(async move {
            let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
            let mut store = ActorStore::open(
                bucket,
                Keys::new(&AppName::default_app()),
                ActorId::parse("t/counter/a")?,
                WriterId {
                    node: "n1".into(),
                    incarnation: "i".into(),
                },
                StoreConfig::default(),
            )
            .await?;
            store.execute(
                "CREATE TABLE counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
                &[],
            )?;
            store.commit_event()?.await?;
            let id = [SqlValue::Integer(1)];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let started = Instant::now();
                for _ in 0..n {
                    store.query(UPSERT, &id)?;
                    store.query(READ, &id)?;
                    // Not awaited: only the statements and the commit count.
                    drop(store.commit_event()?);
                }
                best = best.min(started.elapsed().as_secs_f64() * 1e6 / n as f64);
                store.flush().await?;
            }
            anyhow::Ok(best)
        })
        .await?
    })?;
    println!(
        "{n} events: {per_event_us:.2} µs per event (2 statements and a commit), best of 5; statements off the worker: {}",
        wasmkeep_store::statements_off_worker_total()
    );
    Ok(())
}
