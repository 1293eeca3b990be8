//! Memory per open actor store: opens N stores (default 1,000) on the memory
//! bucket, runs the counter's increment in each, keeps them open, and prints
//! the process's anonymous RSS per store.
//!
//! `cargo run --release -p wasmkeep-store --example memory [N]`
//! (`EMPTY=1`: open the stores without running the event; `PARK=1`: park
//! each store after its event, then time one event on every parked store;
//! `EVENTS=K`: K more increments per store before measuring; `FOLDER=DIR`:
//! a folder bucket in DIR instead of the memory bucket, whose stored records
//! would count as the process's memory).

use std::sync::Arc;

use wasmkeep_bucket::{Bucket, MemoryBucket};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig, WriterId};
use wasmkeep_types::{ActorId, AppName, Keys};

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[allow(clippy::print_stdout)] // a measurement reports on stdout
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    // The store turns SQLite's memory statistics off for speed; this example
    // reads them, so it turns them on and initializes SQLite first (the
    // store's later request is then refused).
    // SAFETY: called before any other SQLite function of the process.
    unsafe {
        rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 1 as std::ffi::c_int);
        rusqlite::ffi::sqlite3_initialize();
    }
    let bucket: Arc<dyn Bucket> = match std::env::var("FOLDER") {
        Ok(dir) => Arc::new(wasmkeep_bucket::FolderBucket::open(std::path::Path::new(
            &dir,
        ))?),
        Err(_) => Arc::new(MemoryBucket::new()),
    };
    let keys = Keys::new(&AppName::default_app());
    let writer = WriterId {
        node: "n1".into(),
        incarnation: "i1".into(),
    };
    let extra_events: usize = match std::env::var("EVENTS") {
        Ok(v) => v.parse()?,
        Err(_) => 0,
    };
    let mut stores = Vec::with_capacity(n);
    let before = rss_anon_kib();
    for i in 0..n {
        let actor = ActorId::parse(&format!("t/counter/m{i}"))?;
        let mut store = ActorStore::open(
            Arc::clone(&bucket),
            keys.clone(),
            actor,
            writer.clone(),
            StoreConfig::default(),
        )
        .await?;
        if std::env::var_os("EMPTY").is_some() {
            stores.push(store);
            continue;
        }
        for event in 0..=extra_events {
            store.begin_event()?;
            if event == 0 {
                store
                    .execute(
                        "CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
                        &[],
                    )
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            store
                .query(
                    "INSERT INTO counter(id, n) VALUES (?1, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n",
                    &[SqlValue::Integer(1)],
                )
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            store.commit_event()?.await?;
        }
        if std::env::var_os("PARK").is_some() {
            store.park();
        }
        stores.push(store);
    }
    let after = rss_anon_kib();
    if std::env::var_os("PARK").is_some() {
        let started = std::time::Instant::now();
        for store in &mut stores {
            store
                .query("SELECT n FROM counter WHERE id = 1", &[])
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            store.commit_event()?.await?;
            store.park();
        }
        println!(
            "an event on a parked store (reopen + read + park): {:.1} µs",
            started.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
    // SAFETY: reads SQLite's global allocation counter.
    let sqlite_bytes = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    println!(
        "SQLite's allocator: {:.1} KiB per store",
        sqlite_bytes as f64 / 1024.0 / n as f64
    );
    // The bucket's copies of the records count too; subtract them roughly.
    let mut bucket_bytes = 0;
    for meta in bucket.list("").await? {
        bucket_bytes += meta.size;
    }
    println!(
        "{n} open stores: anon RSS +{} KiB ({:.1} KiB per store; the bucket holds {:.1} KiB per store)",
        after - before,
        (after - before) as f64 / n as f64,
        bucket_bytes as f64 / 1024.0 / n as f64
    );
    Ok(())
}
