//! Point-in-time restore (ADR 0076, issue 58's figure): an actor with
//! 10 MiB of data in its snapshot and 10,000 records since, kept by a
//! retention window, rebuilt at the newest instant, at the middle of the
//! records and at the snapshot; beside it, the activation of the newest
//! state (`ActorStore::open`) and `history`.
//!
//! On a folder bucket in a temporary directory (real files; the page cache
//! is warm, as after the writes) or on `WASMKEEP_BENCH_BUCKET` (e.g. an
//! `s3://` URL with its `AWS_*` variables). One thread; each figure is the
//! median of 5 runs.
//!
//! `cargo bench -p wasmkeep-store --bench restore_at` (WASMKEEP_BENCH_RECORDS
//! sets the records after the snapshot, default 10,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::clock::{Clock as _, SystemClock};
use wasmkeep_store::{ActorStore, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

const RUNS: usize = 5;
const DATA_BYTES: usize = 10 << 20;

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

async fn timed<F, Fut>(mut f: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t0 = Instant::now();
        f().await?;
        runs.push(t0.elapsed());
    }
    Ok(median(runs))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[allow(clippy::print_stdout)] // a benchmark reports on stdout
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let records: u64 = std::env::var("WASMKEEP_BENCH_RECORDS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("WASMKEEP_BENCH_RECORDS")?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let url = std::env::var("WASMKEEP_BENCH_BUCKET")
        .unwrap_or_else(|_| format!("file://{}", dir.path().join("bucket").display()));
    let bucket: Arc<dyn Bucket> = wasmkeep_bucket::open(&url).await?;
    let keys = Keys::new(&AppName::new("bench")?);
    let actor = ActorId::parse("bench/data/big")?;
    let writer = WriterId {
        node: "bench".into(),
        incarnation: "1".into(),
    };
    let kept = StoreConfig {
        retention: Duration::from_secs(86_400),
        ..StoreConfig::default()
    };

    // 10 MiB in one event, then a snapshot of it (one record per snapshot).
    let mut store = ActorStore::open(
        Arc::clone(&bucket),
        keys.clone(),
        actor.clone(),
        writer.clone(),
        StoreConfig {
            snapshot_log_records: 1,
            ..kept.clone()
        },
    )
    .await?;
    store.begin_event()?;
    store.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, b BLOB)", &[])?;
    store.execute("CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER)", &[])?;
    store.execute("INSERT INTO c VALUES (1, 0)", &[])?;
    store.execute(
        &format!(
            "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {}) \
             INSERT INTO blobs SELECT i, randomblob(4000) FROM k",
            DATA_BYTES / 4096
        ),
        &[],
    )?;
    store.commit_event()?.await?;
    store.close().await;
    let snapshot_ms = SystemClock.wall_ms();

    // The records after it: one small write each, each durable before the next.
    let mut store = ActorStore::open(
        Arc::clone(&bucket),
        keys.clone(),
        actor.clone(),
        writer.clone(),
        StoreConfig {
            snapshot_log_records: records * 2,
            ..kept.clone()
        },
    )
    .await?;
    let t0 = Instant::now();
    let mut middle_ms = 0;
    for i in 0..records {
        store.begin_event()?;
        store.execute("UPDATE c SET n = n + 1", &[])?;
        store.commit_event()?.await?;
        if i == records / 2 {
            middle_ms = SystemClock.wall_ms();
        }
    }
    let writing = t0.elapsed();
    store.close().await;
    let newest_ms = SystemClock.wall_ms();
    let size = store_size(&*bucket, &keys, &actor).await?;
    println!(
        "# {url}: {} MiB database, {records} records after its snapshot (written in {}), {:.1} MiB in the bucket",
        DATA_BYTES >> 20,
        ms(writing),
        size as f64 / f64::from(1 << 20)
    );

    let at = |at_ms: i64| {
        let (bucket, keys, actor) = (Arc::clone(&bucket), keys.clone(), actor.clone());
        move || {
            let (bucket, keys, actor) = (Arc::clone(&bucket), keys.clone(), actor.clone());
            async move {
                let reader =
                    ActorStore::open_reader_at(bucket, keys, actor, StoreConfig::default(), at_ms)
                        .await?;
                anyhow::ensure!(reader.database_image().len() >= DATA_BYTES);
                Ok(())
            }
        }
    };
    println!(
        "restore at the newest instant ({records} records)   {}",
        ms(timed(at(newest_ms)).await?)
    );
    println!(
        "restore at the middle ({} records)             {}",
        records / 2,
        ms(timed(at(middle_ms)).await?)
    );
    println!(
        "restore at the snapshot (0 records)             {}",
        ms(timed(at(snapshot_ms)).await?)
    );
    let open = timed(|| async {
        let store = ActorStore::open(
            Arc::clone(&bucket),
            keys.clone(),
            actor.clone(),
            writer.clone(),
            kept.clone(),
        )
        .await?;
        store.close().await;
        Ok(())
    })
    .await?;
    println!(
        "activation of the newest state (open)           {}",
        ms(open)
    );
    let history = timed(|| async {
        let entries = ActorStore::history(&*bucket, &keys, &actor).await?;
        anyhow::ensure!(entries.len() as u64 > records);
        Ok(())
    })
    .await?;
    println!(
        "history ({} objects read)                  {}",
        records + 2,
        ms(history)
    );
    Ok(())
}

async fn store_size(bucket: &dyn Bucket, keys: &Keys, actor: &ActorId) -> Result<u64> {
    Ok(bucket
        .list(&keys.actor_prefix(actor))
        .await?
        .iter()
        .map(|meta| meta.size)
        .sum())
}
