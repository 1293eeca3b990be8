//! Folder backend throughput: `put_if_absent`/s with 1, 16 and 64 concurrent
//! writers, for each [`SyncMode`], next to the disk's own fsync latency
//! measured in the same run (so the numbers can be compared with "one fsync
//! per write").
//!
//! Run: `cargo bench -p wasmkeep-bucket --bench folder`
//! Env: `WASMKEEP_BENCH_DIR` (default: the system temp dir; it must be on the
//! disk you care about), `WASMKEEP_BENCH_SECONDS` per measurement (default 3).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, FolderBucket, FolderOptions, SyncMode};

/// fsyncs timed for the disk's latency.
const FSYNC_SAMPLES: usize = 50;
const BODY_BYTES: usize = 512;

fn bench_dir() -> anyhow::Result<tempfile::TempDir> {
    let base = std::env::var_os("WASMKEEP_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    Ok(tempfile::Builder::new()
        .prefix("wasmkeep-bench-")
        .tempdir_in(base)?)
}

/// Rewrites and fsyncs a 4 KiB file; returns the fsync latencies sorted.
fn fsync_latencies() -> anyhow::Result<Vec<Duration>> {
    let dir = bench_dir()?;
    let mut file = std::fs::File::create(dir.path().join("fsync-probe"))?;
    let block = vec![7u8; 4096];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    for _ in 0..FSYNC_SAMPLES {
        file.write_all(&block)?;
        let start = Instant::now();
        file.sync_all()?;
        samples.push(start.elapsed());
    }
    samples.sort();
    Ok(samples)
}

async fn put_if_absent_rate(
    mode: SyncMode,
    writers: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let dir = bench_dir()?;
    let bucket: Arc<dyn Bucket> = Arc::new(FolderBucket::open_with(
        dir.path(),
        FolderOptions {
            sync_mode: mode,
            ..Default::default()
        },
    )?);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let bucket = Arc::clone(&bucket);
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let body = Bytes::from(vec![b'x'; BODY_BYTES]);
            let mut i = 0u64;
            while Instant::now() < deadline {
                bucket
                    .put_if_absent(&format!("bench/w{w:03}/{i:08}"), body.clone())
                    .await?;
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::var("WASMKEEP_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let duration = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    let fsync = fsync_latencies()?;
    let mean = fsync.iter().sum::<Duration>() / FSYNC_SAMPLES as u32;
    let p50 = fsync[FSYNC_SAMPLES / 2];
    println!(
        "disk fsync of a 4 KiB file (n={FSYNC_SAMPLES}): mean {:.2} ms, p50 {:.2} ms, max {:.2} ms => one fsync per write caps at ~{:.0} writes/s",
        mean.as_secs_f64() * 1e3,
        p50.as_secs_f64() * 1e3,
        fsync[FSYNC_SAMPLES - 1].as_secs_f64() * 1e3,
        1.0 / mean.as_secs_f64()
    );
    for mode in [SyncMode::PerFile, SyncMode::Syncfs, SyncMode::Journal] {
        for writers in [1, 16, 64] {
            let rate = runtime.block_on(put_if_absent_rate(mode, writers, duration))?;
            println!(
                "folder put_if_absent {mode:?} writers={writers:>2}: {rate:>8.0} writes/s ({:.1}x one-fsync-per-write)",
                rate * mean.as_secs_f64()
            );
        }
    }
    Ok(())
}
