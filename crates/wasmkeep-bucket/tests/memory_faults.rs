//! Fault injection of the memory backend: what tests and the simulation rely on.

use std::time::Duration;

use anyhow::ensure;
use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Error, Fault, MemoryBucket};

#[tokio::test]
async fn reply_lost_write_applies_but_reports_outcome_unknown() -> anyhow::Result<()> {
    let bucket = MemoryBucket::new();
    ensure!(bucket.faults().push(Fault::ReplyLost));
    // A read does not consume a queued lost reply.
    ensure!(matches!(bucket.get("k").await, Err(Error::NotFound { .. })));
    let r = bucket.put_if_absent("k", Bytes::from_static(b"v")).await;
    ensure!(matches!(r, Err(Error::OutcomeUnknown { .. })), "{r:?}");
    ensure!(
        bucket.get("k").await?.bytes == Bytes::from_static(b"v"),
        "the write must have applied"
    );
    ensure!(bucket.faults().injected_count() == 1);
    Ok(())
}

#[tokio::test]
async fn queued_unavailable_fails_one_operation_and_changes_nothing() -> anyhow::Result<()> {
    let bucket = MemoryBucket::new();
    bucket.faults().push(Fault::Unavailable);
    let r = bucket.put("k", Bytes::from_static(b"v")).await;
    ensure!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
    ensure!(
        matches!(bucket.get("k").await, Err(Error::NotFound { .. })),
        "nothing written"
    );
    bucket.put("k", Bytes::from_static(b"v")).await?;
    Ok(())
}

#[tokio::test]
async fn partition_fails_every_operation_of_one_client_until_lifted() -> anyhow::Result<()> {
    let bucket = MemoryBucket::new();
    let other = bucket.new_client(1);
    bucket.faults().set_partitioned(true);
    ensure!(matches!(
        bucket.put("k", Bytes::from_static(b"v")).await,
        Err(Error::Unavailable { .. })
    ));
    ensure!(matches!(
        bucket.list("").await,
        Err(Error::Unavailable { .. })
    ));
    other.put("k", Bytes::from_static(b"from other")).await?;
    bucket.faults().set_partitioned(false);
    ensure!(bucket.get("k").await?.bytes == Bytes::from_static(b"from other"));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn latency_follows_tokio_time() -> anyhow::Result<()> {
    let bucket = MemoryBucket::new();
    bucket
        .faults()
        .set_latency(Duration::from_secs(5), Duration::ZERO);
    let start = tokio::time::Instant::now();
    bucket.put("k", Bytes::from_static(b"v")).await?;
    // Paused time auto-advances exactly to the sleep's deadline.
    ensure!(
        start.elapsed() >= Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    Ok(())
}

async fn outcomes(seed: u64) -> Vec<String> {
    let bucket = MemoryBucket::with_seed(seed);
    bucket.faults().set_unavailable_probability(0.3);
    bucket.faults().set_reply_lost_probability(0.3);
    let mut out = Vec::new();
    for i in 0..200 {
        let r = bucket.put(&format!("k{i}"), Bytes::from_static(b"v")).await;
        out.push(match r {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("{e}"),
        });
    }
    out
}

#[tokio::test]
async fn same_seed_injects_the_same_faults() -> anyhow::Result<()> {
    let a = outcomes(42).await;
    ensure!(a == outcomes(42).await, "same seed, different faults");
    ensure!(a != outcomes(43).await, "different seeds should differ");
    ensure!(
        a.iter().any(|o| o == "ok")
            && a.iter().any(|o| o.contains("outcome unknown"))
            && a.iter().any(|o| o.contains("unavailable"))
    );
    Ok(())
}
