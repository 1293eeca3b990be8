//! The store's share of activating a new actor (the peer benchmark's S2:
//! ten thousand first touches): `ActorStore::open` of an actor with no data,
//! then its first event (a table and a row) until durable, then the close.
//!
//! On the memory bucket, with no latency, so what is measured is the CPU of
//! the store itself (restore listing, SQLite connection, first commit): the
//! node's S2 numbers are too noisy on these VMs to see a change of a few
//! percent there. One thread, as the figures are per activation.
//!
//! `cargo bench -p wasmkeep-store --bench open` (WASMKEEP_BENCH_ACTORS sets
//! the actors per round, default 20,000; 5 rounds, the median is printed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_store::{ActorStore, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

const ROUNDS: usize = 5;

struct Round {
    open: Duration,
    first_event: Duration,
    close: Duration,
}

async fn round(round: usize, actors: usize) -> Result<Round> {
    let bucket: Arc<dyn Bucket> = Arc::new(MemoryBucket::new());
    let keys = Keys::new(&AppName::new("bench")?);
    let writer = WriterId {
        node: "bench".into(),
        incarnation: "1".into(),
    };
    let ids = (0..actors)
        .map(|i| ActorId::parse(&format!("bench/counter/r{round}-{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut open, mut first_event, mut close) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for id in ids {
        let t0 = Instant::now();
        let mut store = ActorStore::open(
            Arc::clone(&bucket),
            keys.clone(),
            id,
            writer.clone(),
            StoreConfig::default(),
        )
        .await?;
        let t1 = Instant::now();
        store.begin_event()?;
        store.execute(
            "CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
            &[],
        )?;
        store.execute(
            "INSERT INTO c VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1",
            &[],
        )?;
        store.commit_event()?.await?;
        let t2 = Instant::now();
        store.close().await;
        let t3 = Instant::now();
        open += t1 - t0;
        first_event += t2 - t1;
        close += t3 - t2;
    }
    Ok(Round {
        open,
        first_event,
        close,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[allow(clippy::print_stdout)] // a benchmark reports on stdout
fn main() -> Result<()> {
    let actors: usize = std::env::var("WASMKEEP_BENCH_ACTORS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rounds = Vec::new();
    for r in 0..ROUNDS {
        rounds.push(rt.block_on(round(r, actors))?);
    }
    let per = |f: fn(&Round) -> Duration| {
        median(
            rounds
                .iter()
                .map(|r| f(r).as_secs_f64() * 1e6 / actors as f64)
                .collect(),
        )
    };
    let (open, event, close) = (per(|r| r.open), per(|r| r.first_event), per(|r| r.close));
    println!(
        "new actor on the memory bucket ({actors} actors x {ROUNDS} rounds, median): \
         open {open:.1} us, first event {event:.1} us, close {close:.1} us, \
         total {:.1} us",
        open + event + close
    );
    Ok(())
}
