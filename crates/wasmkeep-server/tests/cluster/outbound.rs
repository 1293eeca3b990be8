//! An event's outbound HTTP request during a drain (ADR 0066): the drain
//! waits for the event like any work in progress, the client gets the
//! upstream's answer from the draining node, and the event's write moves
//! with the actor.

use std::time::Instant;

use anyhow::{Context, ensure};

use crate::drain::{PHASE_TIME_MAX, wait_for_drain_word};
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};
use crate::upstream::{Upstream, encode};

pub async fn a_drain_waits_for_an_events_outbound_request(tls: bool, bucket: BucketKind) {
    let mut options =
        ClusterOptions::new("drain-outbound", bucket, tls).with_class("proxy", "proxy");
    options.nodes = 2;
    crate::run(options, body).await
}

async fn body(c: &mut Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let (n0, n1) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    let dir = tempfile::tempdir()?;
    let up = Upstream::start(dir.path());
    let proxy = crate::runner::guest("proxy")?;
    let allow = format!("127.0.0.1:{}", up.port);
    c.cli(&[
        "deploy",
        "proxy",
        proxy.to_str().context("a UTF-8 path")?,
        "--allow-outbound",
        &allow,
    ])
    .await?;

    // The actor, claimed through node 0 once the allow-list reached it.
    let hello = format!(
        "/t/proxy/p/fetch?url={}",
        encode(&format!("http://127.0.0.1:{}/hello", up.port))
    );
    loop {
        let r = c.send_retrying(0, "GET", &hello, deadline).await?;
        if r.status == 200 {
            ensure!(r.node() == Some(n0.as_str()), "claimed by {:?}", r.node());
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the allow-list never reached node 0: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }

    // An event waits on a slow upstream; the drain starts meanwhile.
    let slow_url = format!("http://127.0.0.1:{}/slow", up.port);
    let slow = c.url(0, &format!("/t/proxy/p/fetch?url={}", encode(&slow_url)));
    let http = c.http.clone();
    let pending = tokio::spawn(async move { http.get(&slow).await });
    while up.slow_waiting() == 0 {
        ensure!(
            Instant::now() < deadline,
            "the slow request never reached the upstream"
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }
    c.cli(&["node", "drain", &n0]).await?;
    wait_for_drain_word(c, &n0, "draining").await?;
    let row = c.cli(&["actor", "inspect", "t/proxy/p", "--json"]).await?;
    let row: serde_json::Value = serde_json::from_str(&row)?;
    ensure!(
        row["owner"].as_str() == Some(n0.as_str()) && row["hold_valid"].as_bool() == Some(true),
        "the actor left while its event waited on its outbound request: {row}"
    );
    ensure!(
        !pending.is_finished(),
        "the slow request ended before the upstream answered"
    );

    // The upstream answers: the client gets it from node 0, then the actor
    // moves with the event's write.
    up.release();
    let answered = pending.await??;
    ensure!(
        answered.status == 200
            && answered.text() == "slow answer"
            && answered.node() == Some(n0.as_str()),
        "the slow request: {} {:?} from {:?}",
        answered.status,
        answered.text(),
        answered.node()
    );
    wait_for_drain_word(c, &n0, "drained").await?;
    let last = c
        .send_retrying(1, "GET", "/t/proxy/p/last", deadline)
        .await?;
    ensure!(
        last.text() == format!("200 {slow_url}") && last.node() == Some(n1.as_str()),
        "after the drain: {} from {:?}",
        last.text(),
        last.node()
    );
    Ok(())
}
