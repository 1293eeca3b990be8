//! Marker headers mean something only on a verified, first-seen signed call
//! (DESIGN.md guarantee 6): forged markers from a client are ignored, and a
//! captured signed call sent again is treated as an ordinary request.
//!
//! The probe is the forwarding loop guard: a verified forwarded request that
//! finds its actor elsewhere gets 503 naming the holder instead of a second
//! hop, while an ordinary request is forwarded to the owner and served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use bytes::Bytes;
use wasmkeep_cluster::{Clock, OsRandom, Signer, SystemClock};

use crate::runner::{BucketKind, Cluster, ClusterOptions};

const PHASE_TIME_MAX: Duration = Duration::from_secs(60);
const FORWARDED: &str = "x-wasmkeep-forwarded";
/// Past the nodes' signature window (30 s).
const STALE_BY_MS: i64 = 120_000;

/// The real clock, its wall time `STALE_BY_MS` in the past.
#[derive(Debug)]
struct StaleClock;

impl Clock for StaleClock {
    fn now(&self) -> tokio::time::Instant {
        SystemClock.now()
    }

    fn wall_ms(&self) -> i64 {
        SystemClock.wall_ms() - STALE_BY_MS
    }
}

pub async fn forged_and_replayed_signed_calls_are_refused(tls: bool, bucket: BucketKind) {
    let options = ClusterOptions::new("signing", bucket, tls).with_class("sink", "kitchen-sink");
    crate::run(options, body).await
}

fn forged_markers(from: &str) -> Vec<(String, String)> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    vec![
        (
            "x-wasmkeep-signature".into(),
            format!("v1={}", "ab".repeat(32)),
        ),
        (FORWARDED.into(), "1".into()),
        ("x-wasmkeep-from".into(), from.to_owned()),
        ("x-wasmkeep-timestamp".into(), now_ms.to_string()),
        (
            "x-wasmkeep-nonce".into(),
            "0123456789abcdef0123456789abcdef".into(),
        ),
    ]
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let path = "/t/counter/s1/increment";
    let first = c.send_retrying(0, "POST", path, deadline).await?;
    ensure!(
        first.status == 200,
        "first increment: {} {}",
        first.status,
        first.text()
    );
    let owner_id = first.node().context("no x-wasmkeep-node")?.to_owned();
    let owner = c.index_of(&owner_id).context("unknown owner")?;
    let other = (owner + 1) % c.len();
    let mut expected = 1;

    // 1. Forged markers on a request to a non-owner: forwarded as usual.
    let forged = c
        .http
        .send(
            "POST",
            &c.url(other, path),
            &forged_markers(c.node_id(other)),
            Bytes::new(),
        )
        .await?;
    expected += 1;
    ensure!(
        forged.status == 200 && forged.node() == Some(owner_id.as_str()),
        "a request with forged markers via node {other} was not served by the owner {owner_id}: \
         {} {:?} {}",
        forged.status,
        forged.node(),
        forged.text()
    );
    ensure!(
        forged.count()? == expected,
        "forged request answered {}",
        forged.text()
    );

    // 2. Forged markers never reach a guest: the kitchen sink echoes the
    //    request's headers.
    let mut headers = forged_markers("n0");
    headers.push(("x-probe".into(), "seen".into()));
    let echo = c
        .http
        .send(
            "POST",
            &c.url(other, "/t/sink/e1/echo"),
            &headers,
            Bytes::new(),
        )
        .await?;
    ensure!(echo.status == 200, "echo: {} {}", echo.status, echo.text());
    ensure!(
        echo.node().is_some_and(|n| c.index_of(n).is_some()),
        "echo not answered by a node: {:?}",
        echo.node()
    );
    // The control: an ordinary header comes back.
    ensure!(
        echo.header("x-probe") == Some("seen"),
        "the echo lost an ordinary header: {:?}",
        echo.headers
    );
    for (name, _) in forged_markers("n0") {
        ensure!(
            echo.header(&name).is_none(),
            "the guest saw the client's marker {name}"
        );
    }

    // 3. A valid signed forwarded call is honoured once (the loop guard's
    //    503), and its replay is an ordinary request (forwarded, served).
    let signer = Signer::from_key_file(
        c.key_file(),
        owner_id.clone(),
        Arc::new(SystemClock),
        Arc::new(OsRandom),
    )
    .context("reading the cluster key")?;
    let signed = signer.sign("POST", path, "", &[(FORWARDED.into(), "1".into())], b"");
    let honoured = c
        .http
        .send("POST", &c.url(other, path), &signed, Bytes::new())
        .await?;
    ensure!(
        honoured.status == 503
            && honoured.header("retry-after").is_some()
            && honoured.header("x-wasmkeep-holder") == Some(owner_id.as_str()),
        "a valid signed forwarded call to non-owner node {other} was not refused a second hop \
         (503 with Retry-After, naming the holder {owner_id}): {} {:?} {}",
        honoured.status,
        honoured.header("x-wasmkeep-holder"),
        honoured.text()
    );
    let replayed = c
        .http
        .send("POST", &c.url(other, path), &signed, Bytes::new())
        .await?;
    expected += 1;
    ensure!(
        replayed.status == 200 && replayed.node() == Some(owner_id.as_str()),
        "the replayed signed call was honoured again instead of served as an ordinary request: \
         {} {:?} {}",
        replayed.status,
        replayed.node(),
        replayed.text()
    );
    ensure!(
        replayed.count()? == expected,
        "replay answered {}",
        replayed.text()
    );

    // 4. A call signed with another key, or too long ago, is an ordinary
    //    request too.
    let key = std::fs::read(c.key_file()).context("reading the cluster key")?;
    let stale = Signer::new(
        key,
        owner_id.clone(),
        Arc::new(StaleClock),
        Arc::new(OsRandom),
    )
    .context("a signer with a stale clock")?;
    let stranger = Signer::new(
        b"not the cluster key, but long enough to sign".to_vec(),
        owner_id.clone(),
        Arc::new(SystemClock),
        Arc::new(OsRandom),
    )
    .context("a signer with another key")?;
    for (what, signer) in [("stale", &stale), ("foreign", &stranger)] {
        let headers = signer.sign("POST", path, "", &[(FORWARDED.into(), "1".into())], b"");
        let r = c
            .http
            .send("POST", &c.url(other, path), &headers, Bytes::new())
            .await?;
        expected += 1;
        ensure!(
            r.status == 200 && r.node() == Some(owner_id.as_str()),
            "a {what} signed call was honoured instead of served as an ordinary request: \
             {} {:?} {}",
            r.status,
            r.node(),
            r.text()
        );
        ensure!(r.count()? == expected, "{what} call answered {}", r.text());
    }

    let value = c
        .send_retrying(other, "GET", "/t/counter/s1/value", deadline)
        .await?;
    ensure!(
        value.status == 200 && value.count()? == expected,
        "final value {} {}, expected {expected}",
        value.status,
        value.text()
    );
    Ok(())
}
