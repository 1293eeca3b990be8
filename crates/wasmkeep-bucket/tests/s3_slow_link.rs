//! The S3 backend behind a slow or stuck link (a pacing proxy in front of
//! the test binary's SeaweedFS): a transfer that takes longer than
//! `object_store`'s default 30 s per request completes, within the time the
//! backend gives its size; an answer whose body stops is given up.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Error, S3Bucket, answer_time_max};
use wasmkeep_testkit::{Link, SeaweedFs, SlowProxy, s3_tests_skipped};

/// Paced so that one transfer of [`BIG_BYTES`] takes ~38 s: longer than
/// `object_store`'s 30 s default, shorter than `answer_time_max` (58 s).
const RATE: u64 = 1_280 << 10;
const BIG_BYTES: usize = 48 << 20;

/// A bucket under a fresh prefix, reached directly or through `endpoint`.
fn bucket(server: &SeaweedFs, prefix: &str, endpoint: Option<String>) -> anyhow::Result<S3Bucket> {
    let mut env = server.env();
    if let Some(endpoint) = endpoint {
        for (name, value) in &mut env {
            if name == "AWS_ENDPOINT_URL" {
                value.clone_from(&endpoint);
            }
        }
    }
    Ok(S3Bucket::from_env_with(server.bucket(), prefix, &env)?)
}

/// One fresh prefix of the test binary's SeaweedFS, reached directly and
/// through a proxy shaped by `link` (kept running while the proxy lives).
async fn buckets(link: Link) -> anyhow::Result<(S3Bucket, S3Bucket, SlowProxy)> {
    let server = tokio::task::spawn_blocking(SeaweedFs::shared).await??;
    let prefix = format!("slow/{:016x}", rand::random::<u64>());
    let proxy = SlowProxy::start(server.s3_addr(), link).await?;
    let direct = bucket(server, &prefix, None)?;
    let shaped = bucket(server, &prefix, Some(proxy.endpoint()))?;
    Ok((direct, shaped, proxy))
}

fn content(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_longer_than_30_s_complete_on_a_slow_link() -> anyhow::Result<()> {
    if s3_tests_skipped("transfers_longer_than_30_s_complete_on_a_slow_link") {
        return Ok(());
    }
    let link = Link {
        bytes_per_second: RATE,
        answer_bytes_max: None,
    };
    let (direct, slow, _proxy) = buckets(link).await?;
    let slow = Arc::new(slow);
    let stored = content(BIG_BYTES, 1);
    direct.put("stored", stored.clone()).await?;
    let wanted = content(BIG_BYTES, 2);
    assert!(answer_time_max(BIG_BYTES as u64) > Duration::from_secs(50));

    // One read and one conditional write at once, each on its own paced
    // connection: ~38 s each.
    let reader = {
        let slow = slow.clone();
        tokio::spawn(async move { slow.get("stored").await })
    };
    let written = slow.put_if_absent("written", wanted.clone()).await;
    let read = reader.await?;

    let written = written.map_err(|e| anyhow::anyhow!("the slow write failed: {e}"))?;
    assert_eq!(written.size, BIG_BYTES as u64);
    let read = read.map_err(|e| anyhow::anyhow!("the slow read failed: {e}"))?;
    assert!(read.bytes == stored, "the slow read returned other bytes");
    let back = direct.get("written").await?;
    assert!(back.bytes == wanted, "the slow write stored other bytes");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_body_stops_is_given_up_as_unavailable() -> anyhow::Result<()> {
    if s3_tests_skipped("a_read_whose_body_stops_is_given_up_as_unavailable") {
        return Ok(());
    }
    // The head and the first 64 KiB of the body, then nothing.
    let link = Link {
        bytes_per_second: 64 << 20,
        answer_bytes_max: Some(64 << 10),
    };
    let (direct, stuck, _proxy) = buckets(link).await?;
    let len = 1 << 20;
    direct.put("object", content(len, 3)).await?;

    // Bounded by the backend (11 s for 1 MiB); the outer bound only keeps
    // a regression from hanging the test binary.
    let outer = answer_time_max(len as u64) + Duration::from_secs(30);
    let read = tokio::time::timeout(outer, stuck.get("object"))
        .await
        .map_err(|_| anyhow::anyhow!("the read of a stalled body was not given up"))?;
    match read {
        Err(Error::Unavailable { key, reason }) => {
            assert_eq!(key, "object");
            assert!(reason.contains("no answer"), "{reason}");
        }
        other => anyhow::bail!("expected Unavailable, got {other:?}"),
    }
    Ok(())
}
