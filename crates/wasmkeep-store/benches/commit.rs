//! Durable commits per second through `ActorStore` (ADR 0002).
//!
//! Scenarios: one hot actor with 1, 16 and 64 writers, and 1,000 actors with
//! 64 writers. A writer is a client that waits for its event's output gate
//! (the response) before sending the next; events of one actor run one at a
//! time, as its mailbox would run them (a lock per actor). Every scenario
//! checks at the end that the counters in the databases equal the
//! acknowledged events, restored from the bucket.
//!
//! Backends: the folder bucket in a temporary directory (always), with the
//! disk's 4 KiB write+fsync latency measured in the same run (workerd does
//! about one fsync per request, so 1/fsync is its ceiling on this disk); and
//! SeaweedFS when `WASMKEEP_BENCH_S3=1`.
//!
//! `cargo bench -p wasmkeep-store --bench commit` (WASMKEEP_BENCH_SECS sets
//! the seconds per scenario, default 3; WASMKEEP_BENCH_ONLY=1000 runs the
//! scenarios whose name contains "1000").
//!
//! On ext4 without a journal, start from a settled file system: a run's
//! clean-up removes its bucket (up to ~100,000 files), and for the next
//! minute every file created in that group scans past the freed inodes
//! (ADR 0027). A run started right after another measured one writer at
//! 1,412 commits/s against 5,793 settled. `sync; echo 3 >
//! /proc/sys/vm/drop_caches` as root, or waiting a minute, settles it.

use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use wasmkeep_bucket::{Answer, Around, Bucket, FolderBucket, Request, S3Bucket};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

/// Counts requests on the way to the real bucket.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Bucket>,
    requests: AtomicU64,
}

impl Counting {
    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// One request per call, a bulk delete included (as S3's `DeleteObjects`
/// counts, up to 1,000 keys) and a listing of keys.
impl Around for Counting {
    fn inner(&self) -> &dyn Bucket {
        &*self.inner
    }

    async fn around<T: Answer>(
        &self,
        _request: Request<'_>,
        call: impl Future<Output = wasmkeep_bucket::Result<T>> + Send,
    ) -> wasmkeep_bucket::Result<T> {
        self.count();
        call.await
    }
}

type Mailbox = Arc<tokio::sync::Mutex<ActorStore>>;

fn keys() -> Keys {
    Keys::new(&AppName::new("bench").expect("valid app"))
}

fn writer() -> WriterId {
    WriterId {
        node: "bench".into(),
        incarnation: format!("{}", std::process::id()),
    }
}

/// The store's configuration; `WASMKEEP_BENCH_SNAPSHOT_RECORDS` overrides
/// the snapshot threshold (to see what compaction costs).
fn store_config() -> StoreConfig {
    let mut config = StoreConfig::default();
    if let Some(n) = std::env::var("WASMKEEP_BENCH_SNAPSHOT_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        config.snapshot_log_records = n;
    }
    config
}

async fn open_actor(bucket: &Arc<dyn Bucket>, actor: &ActorId) -> Result<Mailbox> {
    let mut s = ActorStore::open(
        bucket.clone(),
        keys(),
        actor.clone(),
        writer(),
        store_config(),
    )
    .await?;
    s.begin_event()?;
    s.execute(
        "CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
        &[],
    )?;
    s.execute("INSERT OR IGNORE INTO c VALUES (1, 0)", &[])?;
    s.commit_event()?.await?;
    Ok(Arc::new(tokio::sync::Mutex::new(s)))
}

fn count_of(s: &mut ActorStore) -> Result<i64> {
    let rows = s.query("SELECT n FROM c WHERE id = 1", &[])?;
    s.commit_event()?;
    match rows.rows.first().and_then(|r| r.first()) {
        Some(SqlValue::Integer(n)) => Ok(*n),
        other => anyhow::bail!("counter is {other:?}"),
    }
}

struct Outcome {
    events: u64,
    elapsed: Duration,
    requests: u64,
    records: u64,
}

/// `writers` clients for `duration` over `n_actors` actors (uniform random).
async fn run(
    bucket: Arc<dyn Bucket>,
    prefix: &str,
    n_actors: usize,
    writers: usize,
    duration: Duration,
) -> Result<Outcome> {
    let counting = Arc::new(Counting {
        inner: bucket,
        requests: AtomicU64::new(0),
    });
    let bucket: Arc<dyn Bucket> = counting.clone();
    let actors: Vec<ActorId> = (0..n_actors)
        .map(|i| ActorId::parse(&format!("bench/counter/{prefix}-{i}")).expect("valid id"))
        .collect();
    let mut mailboxes = Vec::with_capacity(n_actors);
    for a in &actors {
        mailboxes.push(open_actor(&bucket, a).await?);
    }
    let mailboxes = Arc::new(mailboxes);
    let seq_before: u64 = {
        let mut sum = 0;
        for m in mailboxes.iter() {
            sum += m.lock().await.durable_seq();
        }
        sum
    };
    let requests_before = counting.requests.load(Ordering::Relaxed);
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let mailboxes = mailboxes.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
            while Instant::now() < deadline {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let m = &mailboxes[(rng % mailboxes.len() as u64) as usize];
                let gate = {
                    let mut s = m.lock().await;
                    s.begin_event()?;
                    s.execute("UPDATE c SET n = n + 1 WHERE id = 1", &[])?;
                    s.commit_event()?
                };
                gate.await?;
                acked.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = start.elapsed();
    let requests = counting.requests.load(Ordering::Relaxed) - requests_before;
    let mut records = 0;
    for m in mailboxes.iter() {
        records += m.lock().await.durable_seq();
    }
    let records = records - seq_before;
    let events = acked.load(Ordering::Relaxed);

    // Check: the counters restored from the bucket add up to the acknowledged events.
    let mut in_memory = 0;
    for m in mailboxes.iter() {
        let mut s = m.lock().await;
        s.flush().await?;
        in_memory += count_of(&mut s)?;
    }
    drop(mailboxes);
    let mut restored = 0;
    for a in actors.iter().take(50) {
        let mut s =
            ActorStore::open(bucket.clone(), keys(), a.clone(), writer(), store_config()).await?;
        restored += count_of(&mut s)?;
    }
    if n_actors <= 50 {
        anyhow::ensure!(
            restored == in_memory,
            "restored {restored} != in memory {in_memory}"
        );
    }
    anyhow::ensure!(
        in_memory as u64 == events,
        "counters {in_memory} != acknowledged {events}"
    );
    Ok(Outcome {
        events,
        elapsed,
        requests,
        records,
    })
}

/// Mean milliseconds of a 4 KiB append + fdatasync in `dir` (a file that
/// grows: the size is metadata to flush too).
fn fsync_ms(dir: &std::path::Path) -> Result<f64> {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path)?;
    let page = [7u8; 4096];
    let rounds = 200;
    let start = Instant::now();
    for _ in 0..rounds {
        f.write_all(&page)?;
        f.sync_data()?;
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0 / f64::from(rounds);
    std::fs::remove_file(&path)?;
    Ok(ms)
}

/// Mean milliseconds of a 4 KiB overwrite + fdatasync of blocks written
/// before (no metadata: the cheapest durable write this disk offers, what a
/// reused WAL or the folder journal pays).
fn fsync_overwrite_ms(dir: &std::path::Path) -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("fsync-probe-overwrite");
    let f = std::fs::File::create(&path)?;
    let page = [7u8; 4096];
    let rounds = 200u32;
    f.write_all_at(&vec![0u8; 4096 * rounds as usize], 0)?;
    f.sync_all()?;
    let start = Instant::now();
    for i in 0..rounds {
        f.write_all_at(&page, u64::from(i) * 4096)?;
        f.sync_data()?;
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0 / f64::from(rounds);
    std::fs::remove_file(&path)?;
    Ok(ms)
}

/// Mean milliseconds of one put-if-absent of a 12 KiB object (a typical
/// counter record: 3 pages) on `bucket`, one at a time.
async fn put_ms(bucket: &Arc<dyn Bucket>, prefix: &str) -> Result<f64> {
    let body = Bytes::from(vec![5u8; 3 * 4096]);
    let rounds = 100u32;
    let start = Instant::now();
    for i in 0..rounds {
        bucket
            .put_if_absent(&format!("probe/{prefix}/{i:05}"), body.clone())
            .await?;
    }
    Ok(start.elapsed().as_secs_f64() * 1000.0 / f64::from(rounds))
}

#[allow(clippy::print_stdout)] // a benchmark reports on stdout
fn report(backend: &str, scenario: &str, o: &Outcome, fsync_ms: Option<f64>) {
    let rate = o.events as f64 / o.elapsed.as_secs_f64();
    let per_event = o.requests as f64 / o.events.max(1) as f64;
    let events_per_record = o.events as f64 / o.records.max(1) as f64;
    let vs = fsync_ms
        .map(|ms| {
            format!(
                "  fsync {ms:.3} ms: {:.1}x the 1-fsync-per-request ceiling",
                rate / (1000.0 / ms)
            )
        })
        .unwrap_or_default();
    println!(
        "{backend:<9} {scenario:<28} {rate:>9.0} commits/s  {per_event:>5.2} bucket requests/event  {events_per_record:>6.1} events/record  ({} events in {:.1} s){vs}",
        o.events,
        o.elapsed.as_secs_f64()
    );
}

/// The scenarios, or those whose name contains `WASMKEEP_BENCH_ONLY`.
fn scenarios() -> Vec<(&'static str, usize, usize)> {
    let only = std::env::var("WASMKEEP_BENCH_ONLY").unwrap_or_default();
    [
        ("hot actor, 1 writer", 1, 1),
        ("hot actor, 16 writers", 1, 16),
        ("hot actor, 64 writers", 1, 64),
        ("1000 actors, 64 writers", 1000, 64),
    ]
    .into_iter()
    .filter(|(name, _, _)| name.contains(only.as_str()))
    .collect()
}

#[allow(clippy::print_stdout)] // a benchmark reports on stdout
fn main() -> Result<()> {
    let secs: u64 = std::env::var("WASMKEEP_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let duration = Duration::from_secs(secs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let before = fsync_ms(dir.path())?;
        println!(
            "disk: 4 KiB append + fdatasync = {before:.3} ms (ceiling at 1 fsync/request: {:.0}/s)",
            1000.0 / before
        );
        let overwrite = fsync_overwrite_ms(dir.path())?;
        println!(
            "disk: 4 KiB overwrite + fdatasync = {overwrite:.3} ms (ceiling at 1 flush/request: {:.0}/s)",
            1000.0 / overwrite
        );
        let folder: Arc<dyn Bucket> = Arc::new(FolderBucket::open(&dir.path().join("bucket"))?);
        println!(
            "folder: one put-if-absent of 12 KiB = {:.3} ms",
            put_ms(&folder, "f").await?
        );
        for (i, (name, actors, writers)) in scenarios().into_iter().enumerate() {
            // The disk's flush latency drifts within minutes: probe it around
            // each scenario and compare with the mean.
            let fsync_before = fsync_ms(dir.path())?;
            let overwrite_before = fsync_overwrite_ms(dir.path())?;
            let o = run(folder.clone(), &format!("f{i}"), actors, writers, duration).await?;
            let fsync_after = fsync_ms(dir.path())?;
            let overwrite_after = fsync_overwrite_ms(dir.path())?;
            report("folder", name, &o, Some((fsync_before + fsync_after) / 2.0));
            println!(
                "          (against the overwrite flush, {:.3} ms: {:.1}x its ceiling)",
                (overwrite_before + overwrite_after) / 2.0,
                o.events as f64 / o.elapsed.as_secs_f64()
                    / (2000.0 / (overwrite_before + overwrite_after))
            );
        }
        let after = fsync_ms(dir.path())?;
        println!("disk after: 4 KiB append + fdatasync = {after:.3} ms");

        if std::env::var("WASMKEEP_BENCH_S3").as_deref() == Ok("1") {
            let sw = wasmkeep_testkit::SeaweedFs::shared().map_err(|e| anyhow::anyhow!("{e}"))?;
            let s3: Arc<dyn Bucket> = Arc::new(
                S3Bucket::from_env_with(
                    sw.bucket(),
                    &format!("bench-{}", std::process::id()),
                    &sw.env(),
                )
                .context("S3 bucket")?,
            );
            println!(
                "seaweedfs: one put-if-absent of 12 KiB = {:.3} ms",
                put_ms(&s3, "s").await?
            );
            for (i, (name, actors, writers)) in scenarios().into_iter().enumerate() {
                let o = run(s3.clone(), &format!("s{i}"), actors, writers, duration).await?;
                report("seaweedfs", name, &o, None);
            }
        }
        anyhow::Ok(())
    })
}
