//! Measures what the runtime adds per actor and per event: compiling and
//! loading a component, instantiating it from its `InstancePre` with the
//! pooling allocator, and a no-op request into the guest.
//!
//! Run: `cargo bench -p wasmkeep-runtime --bench runtime` (after
//! `scripts/build-guests`). Goals: instantiation <= 20 us, no-op event <= 5 us.
#![allow(clippy::print_stdout, reason = "a benchmark prints its numbers")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use wasmkeep_runtime::{
    ActorHost, LogLevel, Message, Request, Response, Runtime, RuntimeConfig, SqlRows, SqlValue,
};
use wasmkeep_types::ActorId;

const INSTANTIATIONS: usize = 3_000;
const EVENTS: usize = 50_000;
const WARMUP: usize = 200;

/// Answers everything with nothing, so only the runtime's cost is measured.
struct NoopHost;

#[async_trait::async_trait]
impl ActorHost for NoopHost {
    fn sql_execute(&mut self, _: &str, _: Vec<SqlValue>) -> Result<u64, String> {
        Ok(1)
    }
    fn sql_query(&mut self, _: &str, _: Vec<SqlValue>) -> Result<SqlRows, String> {
        Ok(SqlRows::default())
    }
    fn alarm_get(&mut self) -> Option<i64> {
        None
    }
    fn alarm_set(&mut self, _: i64) {}
    fn alarm_clear(&mut self) {}
    fn socket_send(&mut self, _: u64, _: Message) -> Result<(), String> {
        Ok(())
    }
    fn socket_close(&mut self, _: u64, _: u16, _: String) -> Result<(), String> {
        Ok(())
    }
    fn socket_list(&mut self) -> Vec<u64> {
        Vec::new()
    }
    fn socket_set_tag(&mut self, _: u64, _: String) -> Result<(), String> {
        Ok(())
    }
    fn socket_get_tag(&mut self, _: u64) -> Option<String> {
        None
    }
    async fn call(&mut self, _: String, _: String, _: Request) -> Result<Response, String> {
        Err("no calls in the benchmark".into())
    }
    fn secret(&mut self, _: &str) -> Option<String> {
        None
    }
    fn log(&mut self, _: LogLevel, _: &str) {}
    fn as_any(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn guest(name: &str) -> Option<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm")
        .join(format!("{name}.wasm"));
    std::fs::read(path).ok()
}

struct Stats(Vec<Duration>);

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut samples = self.0.clone();
        samples.sort();
        let n = samples.len().max(1);
        let mean = samples.iter().sum::<Duration>() / n as u32;
        let at = |q: f64| {
            samples
                .get(((n as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or_default()
        };
        write!(
            f,
            "p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.0} us, mean {:.2} us (n={})",
            at(0.5).as_secs_f64() * 1e6,
            at(0.99).as_secs_f64() * 1e6,
            at(0.999).as_secs_f64() * 1e6,
            at(1.0).as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6,
            samples.len()
        )
    }
}

fn main() -> anyhow::Result<()> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let cache = tempfile::tempdir()?;
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        instances_max: 100,
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(config.clone())?;
    let Some(sink) = guest("kitchen-sink") else {
        anyhow::bail!("target/wasm/kitchen-sink.wasm is missing: run scripts/build-guests");
    };

    let started = Instant::now();
    let component = runtime.load_component(&sink)?;
    println!(
        "kitchen-sink ({} bytes): compile + cache write {:.1} ms",
        sink.len(),
        ms(started)
    );
    let second = Runtime::new(config)?;
    let started = Instant::now();
    let cached = second.load_component(&sink)?;
    assert!(cached.from_cache());
    println!(
        "kitchen-sink: load from the precompiled cache {:.2} ms",
        ms(started)
    );

    let id = ActorId::parse("bench/sink/one")?;
    let mut samples = Vec::with_capacity(INSTANTIATIONS);
    for i in 0..WARMUP + INSTANTIATIONS {
        let started = Instant::now();
        let instance = component
            .instantiate(id.clone(), Box::new(NoopHost))
            .await?;
        let elapsed = started.elapsed();
        drop(instance);
        if i >= WARMUP {
            samples.push(elapsed);
        }
    }
    println!(
        "instantiate (new store + WASI ctx + InstancePre, pooling): {}",
        Stats(samples)
    );

    bench_events("kitchen-sink GET /noop", &component, "GET", "/noop").await?;
    match guest("counter") {
        Some(bytes) => {
            let counter = runtime.load_component(&bytes)?;
            bench_events(
                "counter GET /value (host SQL answers no rows)",
                &counter,
                "GET",
                "/value",
            )
            .await?;
            memory_per_instance(&bytes).await?;
        }
        None => println!("counter: target/wasm/counter.wasm not built; skipped"),
    }
    Ok(())
}

/// Instances held at once by [`memory_per_instance`].
const MEMORY_INSTANCES: usize = 1_000;

unsafe extern "C" {
    /// glibc: gives free heap memory back to the system.
    fn malloc_trim(pad: usize) -> i32;
}

/// Anonymous resident memory of the process, KiB, after giving freed heap
/// memory back (so that what is counted is what is held).
fn rss_anon_kib() -> u64 {
    // SAFETY: malloc_trim only releases free memory; no pointer is passed.
    unsafe {
        malloc_trim(0);
    }
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

/// What a loaded instance that ran one event holds, and what is left after
/// `unload` (the node unloads idle actors' instances).
async fn memory_per_instance(bytes: &[u8]) -> anyhow::Result<()> {
    let runtime = Runtime::new(RuntimeConfig {
        instances_max: u32::try_from(MEMORY_INSTANCES)? + 8,
        ..RuntimeConfig::default()
    })?;
    let component = runtime.load_component(bytes)?;
    let before = rss_anon_kib();
    let mut instances = Vec::with_capacity(MEMORY_INSTANCES);
    for i in 0..MEMORY_INSTANCES {
        let mut instance = component
            .instantiate(
                ActorId::parse(&format!("bench/mem/a{i}"))?,
                Box::new(NoopHost),
            )
            .await?;
        let request = Request {
            method: "POST".into(),
            path: "/increment".into(),
            headers: Vec::new(),
            body: Vec::new(),
        };
        instance.handle(request).await?;
        instances.push(instance);
    }
    let loaded = rss_anon_kib();
    for instance in &mut instances {
        instance.unload();
    }
    let unloaded = rss_anon_kib();
    let per = |kib: u64| kib as f64 / MEMORY_INSTANCES as f64;
    println!(
        "counter memory per instance after one event: {:.1} KiB loaded, {:.1} KiB after unload (anonymous RSS, {MEMORY_INSTANCES} instances)",
        per(loaded.saturating_sub(before)),
        per(unloaded.saturating_sub(before))
    );
    Ok(())
}

async fn bench_events(
    label: &str,
    component: &wasmkeep_runtime::ClassComponent,
    method: &str,
    path: &str,
) -> anyhow::Result<()> {
    let mut instance = component
        .instantiate(ActorId::parse("bench/events/one")?, Box::new(NoopHost))
        .await?;
    let mut samples = Vec::with_capacity(EVENTS);
    let mut status = 0;
    for i in 0..WARMUP + EVENTS {
        let request = Request {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        };
        let started = Instant::now();
        match instance.handle(request).await {
            Ok(response) => status = response.status,
            Err(error) => {
                println!("{label}: the event failed: {error}");
                return Ok(());
            }
        }
        if i >= WARMUP {
            samples.push(started.elapsed());
        }
    }
    println!("{label} -> {status}: per event {}", Stats(samples));
    Ok(())
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}
