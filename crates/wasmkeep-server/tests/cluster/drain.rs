//! Draining a node (ADR 0014): `wasmkeep node drain` and SIGTERM hand every
//! resident actor to the peers under concurrent load, with no request
//! failing beyond `503 Retry-After`, no increment lost or doubled, an alarm
//! due during the drain firing once on the peer, sockets closed with 1012
//! whose clients reconnect to the new owner; and a node with no eligible
//! peer keeps serving.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use parking_lot::Mutex;

use crate::client::Socket;
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

/// Actors under load; actor `d{a}` is first claimed by node `a % nodes`.
pub(crate) const ACTORS: usize = 24;
/// Concurrent load loops.
pub(crate) const LOADERS: usize = 4;
pub(crate) const PHASE_TIME_MAX: Duration = Duration::from_secs(40);
/// The alarm is set this far ahead, so it falls due while the drain runs.
const ALARM_IN_MS: u64 = 700;
/// Close code of a hand-over: "service restart".
pub(crate) const CLOSE_SERVICE_RESTART: u16 = 1012;

pub async fn drain_under_load_hands_every_actor_over(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("drain", bucket, tls), drain_body).await
}

pub async fn sigterm_drains_under_load(tls: bool, bucket: BucketKind) {
    crate::run(
        ClusterOptions::new("drain-sigterm", bucket, tls),
        sigterm_body,
    )
    .await
}

pub async fn drain_without_eligible_peer_keeps_serving(tls: bool, bucket: BucketKind) {
    let mut options = ClusterOptions::new("drain-alone", bucket, tls);
    options.nodes = 1;
    crate::run(options, alone_body).await
}

pub async fn a_closing_socket_keeps_the_actor_until_its_client_answers(
    tls: bool,
    bucket: BucketKind,
) {
    let mut options = ClusterOptions::new("drain-close-wait", bucket, tls);
    options.nodes = 2;
    crate::run(options, close_wait_body).await
}

/// A retry in backoff that a drain hands over keeps its count and its time
/// on the peer: a handler that fails its first three deliveries runs four
/// times in all, not three more from the start after the hand-over.
pub async fn a_drained_alarm_keeps_its_retries(tls: bool, bucket: BucketKind) {
    let mut options =
        ClusterOptions::new("drain-alarm-retries", bucket, tls).with_class("ks", "kitchen-sink");
    options.nodes = 2;
    crate::run(options, retries_body).await
}

async fn retries_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let drained = c.node_id(0).to_owned();
    // kitchen-sink fails a delivery of an alarm set at -3 ms while its
    // retry count is below 3: deliveries 0, 1 and 2 fail, 3 succeeds (2, 4
    // and 8 s apart).
    let set = c
        .send_retrying(0, "POST", "/t/ks/retries/alarm/set?at=-3", deadline)
        .await?;
    ensure!(
        set.status == 200 && set.node() == Some(drained.as_str()),
        "setting the alarm: {} from {:?}: {}",
        set.status,
        set.node(),
        set.text()
    );
    let metric = async |i, name| anyhow::Ok(c.metric(i, name).await?.unwrap_or(0.0));
    while metric(0, "wasmkeep_alarm_retries_total").await? < 1.0 {
        ensure!(Instant::now() < deadline, "the first delivery never failed");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    c.cli(&["node", "drain", &drained, "--wait"]).await?;
    loop {
        let r = c
            .send_retrying(1, "GET", "/t/ks/retries/alarm/get", deadline)
            .await?;
        ensure!(
            r.status == 200,
            "reading the alarm: {} {}",
            r.status,
            r.text()
        );
        if r.text() == "none" {
            ensure!(
                r.node() == Some(c.node_id(1)),
                "the actor answered from {:?}",
                r.node()
            );
            break;
        }
        ensure!(Instant::now() < deadline, "the alarm never succeeded");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let fired = metric(0, "wasmkeep_alarms_fired_total").await?
        + metric(1, "wasmkeep_alarms_fired_total").await?;
    ensure!(
        fired == 4.0,
        "the alarm ran {fired} times, where deliveries 0 to 3 make 4"
    );
    ensure!(
        !c.node_log(1).contains("retry_count=0"),
        "the peer started the retries over"
    );
    Ok(())
}

/// The node's `sockets_closing` and `releases_failed` in `node list --json`
/// (heartbeat line 13).
async fn hand_over_progress(c: &Cluster, node: &str) -> anyhow::Result<(u64, u64)> {
    let out = c.cli(&["node", "list", "--json"]).await?;
    let rows: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("node list is not JSON: {out}"))?;
    let row = rows
        .as_array()
        .context("node list: not an array")?
        .iter()
        .find(|r| r["node"].as_str() == Some(node))
        .with_context(|| format!("node {node} is not listed: {out}"))?;
    Ok((
        row["sockets_closing"].as_u64().context("sockets_closing")?,
        row["releases_failed"].as_u64().context("releases_failed")?,
    ))
}

/// The drained node sends 1012 and keeps the actor (and its ownership
/// record) while the client has not answered the close frame; once it
/// does, the actor goes to the peer. The client reads nothing until the
/// node reports the socket closing, which takes a heartbeat or two, well
/// inside the node's 5 s wait.
async fn close_wait_body(c: &mut Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let (n0, n1) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    let actor = "t/counter/w";
    claim_through(c, 0, actor, deadline).await?;
    let (mut socket, count) = socket_increment(c, 0, actor).await?;
    ensure!(count == "2", "the socket's increment");

    c.cli(&["node", "drain", &n0]).await?;
    loop {
        let (closing, failed) = hand_over_progress(c, &n0).await?;
        ensure!(
            failed == 0,
            "failed releases on the draining node: {failed}"
        );
        if closing == 1 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the draining node never reported the closing socket"
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let table = c.cli(&["node", "list"]).await?;
    ensure!(
        table.contains("draining (1 sockets closing, 0 failed releases)"),
        "node list while the socket closes:\n{table}"
    );
    let row = c.cli(&["actor", "inspect", actor, "--json"]).await?;
    let row: serde_json::Value = serde_json::from_str(&row)?;
    ensure!(
        row["owner"].as_str() == Some(n0.as_str()) && row["hold_valid"].as_bool() == Some(true),
        "the actor left before its socket's client answered the close: {row}"
    );

    let code = socket.recv_close_code().await?;
    ensure!(
        code == Some(CLOSE_SERVICE_RESTART),
        "the socket closed with {code:?}"
    );
    socket.finish_close().await?;
    wait_for_drain_word(c, &n0, "drained").await?;
    ensure!(
        hand_over_progress(c, &n0).await? == (0, 0),
        "progress after the drain"
    );
    let r = c
        .send_retrying(0, "GET", &format!("/{actor}/value"), deadline)
        .await?;
    ensure!(
        r.text() == "2" && r.node() == Some(n1.as_str()),
        "after the drain: {} from {:?}",
        r.text(),
        r.node()
    );
    // The close event ran before the hand-over: its count moved along.
    let r = c
        .send_retrying(1, "GET", &format!("/{actor}/closes"), deadline)
        .await?;
    ensure!(r.count()? == 1, "closes after the drain: {}", r.text());
    Ok(())
}

/// Runs `drive` while [`LOADERS`] load loops increment the actors through
/// `nodes`; the loops stop when `drive` ends, whatever it returns.
pub(crate) async fn under_load<T>(
    c: &Cluster,
    nodes: &[usize],
    seen: &Load,
    drive: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let stop = AtomicBool::new(false);
    let loaders = futures::future::join_all((0..LOADERS).map(|l| load(c, nodes, l, &stop, seen)));
    let drive = async {
        let result = drive.await;
        stop.store(true, Ordering::Relaxed);
        result
    };
    let (_, driven) = tokio::join!(loaders, drive);
    driven
}

/// Prints how many of the load's requests during `what` got 503, and why.
pub(crate) fn report_unavailable(what: &str, seen: &Load) {
    let unavailable = seen.unavailable.load(Ordering::Relaxed);
    eprintln!(
        "{what}: {unavailable} of {} requests answered 503: {:#?}",
        seen.acked.lock().values().sum::<u64>() + unavailable,
        seen.unavailable_reasons.lock()
    );
}

/// Increments the counter `actor` (`tenant/class/name`) through node `i`
/// and checks that node `i` ran it: its first event claims it there.
pub(crate) async fn claim_through(
    c: &Cluster,
    i: usize,
    actor: &str,
    deadline: Instant,
) -> anyhow::Result<()> {
    let r = c
        .send_retrying(i, "POST", &format!("/{actor}/increment"), deadline)
        .await?;
    ensure!(
        r.node() == Some(c.node_id(i)),
        "{actor} not on node {i}: {:?}",
        r.node()
    );
    Ok(())
}

/// Opens a socket to the counter `actor` through node `i` and increments it
/// once over it; returns the socket and the count it answered.
pub(crate) async fn socket_increment(
    c: &Cluster,
    i: usize,
    actor: &str,
) -> anyhow::Result<(Socket, String)> {
    let mut socket = c.http.websocket(&c.url(i, &format!("/{actor}/ws"))).await?;
    socket.send_text("inc").await?;
    let count = socket.recv_text().await?;
    Ok((socket, count))
}

/// Sets the counter `actor`'s alarm `in_ms` ahead through node `i`; returns
/// its time (ms since the Unix epoch).
pub(crate) async fn set_alarm(
    c: &Cluster,
    i: usize,
    actor: &str,
    in_ms: u64,
) -> anyhow::Result<i64> {
    let r = c
        .http
        .post(&c.url(i, &format!("/{actor}/alarm?in_ms={in_ms}")))
        .await?;
    ensure!(
        r.status == 200,
        "setting the alarm of {actor}: {} {}",
        r.status,
        r.text()
    );
    r.text().trim().parse().context("the alarm's time")
}

/// What the load saw: acknowledged increments per actor, 503s, failures.
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) acked: Mutex<BTreeMap<usize, u64>>,
    pub(crate) unavailable: AtomicU64,
    /// Why requests got 503 (for the report), by reason text.
    pub(crate) unavailable_reasons: Mutex<BTreeMap<String, u64>>,
    pub(crate) failures: Mutex<Vec<String>>,
}

/// Increments actors round-robin through `nodes` until `stop`; only a 503
/// with Retry-After may fail (it is not counted as acknowledged).
pub(crate) async fn load(
    c: &Cluster,
    nodes: &[usize],
    loader: usize,
    stop: &AtomicBool,
    seen: &Load,
) {
    let mut k = loader;
    while !stop.load(Ordering::Relaxed) {
        let a = k % ACTORS;
        let i = nodes[(k / ACTORS + loader) % nodes.len()];
        k += LOADERS;
        let path = format!("/t/counter/d{a}/increment");
        match c.http.post(&c.url(i, &path)).await {
            Ok(r) if r.status == 200 => {
                *seen.acked.lock().entry(a).or_default() += 1;
            }
            Ok(r) if r.status == 503 && r.header("retry-after").is_some() => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
                let reason = r.text().replace(&format!("d{a}"), "*");
                *seen
                    .unavailable_reasons
                    .lock()
                    .entry(format!("via node {i}: {reason}"))
                    .or_default() += 1;
                tokio::time::sleep(crate::client::RETRY_PAUSE).await;
            }
            Ok(r) => seen.failures.lock().push(format!(
                "POST {path} via node {i}: {} {}",
                r.status,
                r.text()
            )),
            Err(e) => seen
                .failures
                .lock()
                .push(format!("POST {path} via node {i}: {e:#}")),
        }
    }
}

/// One increment of each actor through node `a % n`; returns the nodes
/// that answered.
pub(crate) async fn warm_up(c: &Cluster, load: &Load) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let mut owners = Vec::new();
    for a in 0..ACTORS {
        let r = c
            .send_retrying(
                a % c.len(),
                "POST",
                &format!("/t/counter/d{a}/increment"),
                deadline,
            )
            .await?;
        ensure!(r.status == 200, "warm-up d{a}: {} {}", r.status, r.text());
        *load.acked.lock().entry(a).or_default() += 1;
        owners.push(r.node().context("no x-wasmkeep-node")?.to_owned());
    }
    Ok(owners)
}

/// Every actor's value, read through node `via`, equals its acknowledged
/// increments (plus `extra` of actor `a`).
pub(crate) async fn check_counts(
    c: &Cluster,
    via: usize,
    load: &Load,
    extra: &BTreeMap<usize, u64>,
) -> anyhow::Result<()> {
    let failures = load.failures.lock().clone();
    ensure!(
        failures.is_empty(),
        "requests failed beyond 503: {failures:?}"
    );
    let deadline = Instant::now() + PHASE_TIME_MAX;
    for a in 0..ACTORS {
        let r = c
            .send_retrying(via, "GET", &format!("/t/counter/d{a}/value"), deadline)
            .await?;
        ensure!(r.status == 200, "value of d{a}: {} {}", r.status, r.text());
        let expected =
            load.acked.lock().get(&a).copied().unwrap_or(0) + extra.get(&a).copied().unwrap_or(0);
        ensure!(
            r.count()? == expected,
            "d{a}: value {} after {expected} acknowledged increments",
            r.count()?
        );
    }
    Ok(())
}

/// `(state, drain, resident_actors)` of `node` in `node list --json`.
async fn node_row(c: &Cluster, node: &str) -> anyhow::Result<Option<(String, String, u64)>> {
    let out = c.cli(&["node", "list", "--json"]).await?;
    let rows: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("node list is not JSON: {out}"))?;
    let rows = rows.as_array().context("node list: not an array")?;
    Ok(rows
        .iter()
        .find(|r| r["node"].as_str() == Some(node))
        .map(|r| {
            (
                r["state"].as_str().unwrap_or_default().to_owned(),
                r["drain"].as_str().unwrap_or_default().to_owned(),
                r["resident_actors"].as_u64().unwrap_or(u64::MAX),
            )
        }))
}

pub(crate) async fn wait_for_drain_word(c: &Cluster, node: &str, word: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    loop {
        let row = node_row(c, node).await?;
        if row.as_ref().is_some_and(|(_, drain, _)| drain == word) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("node {node} never showed drain {word:?}: {row:?}");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

async fn drain_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let seen = Load::default();
    let owners = warm_up(c, &seen).await?;
    let drained = c.node_id(0).to_owned();
    let on_drained: Vec<usize> = (0..ACTORS).filter(|&a| owners[a] == drained).collect();
    ensure!(
        on_drained.len() >= 2,
        "fewer than two actors on {drained}: {owners:?}"
    );
    let (alarm_actor, socket_actor) = (on_drained[0], on_drained[1]);

    // A socket to an actor of the drained node, through that node.
    let socket_key = format!("t/counter/d{socket_actor}");
    let (mut socket, _) = socket_increment(c, 0, &socket_key).await?;
    let mut extra = BTreeMap::from([(socket_actor, 1u64)]);

    // An alarm that falls due while the drain runs.
    set_alarm(c, 0, &format!("t/counter/d{alarm_actor}"), ALARM_IN_MS).await?;

    let all: Vec<usize> = (0..c.len()).collect();
    under_load(c, &all, &seen, async {
        let started = Instant::now();
        c.cli(&["node", "drain", &drained, "--wait"]).await?;
        eprintln!("drain of {drained} under load took {:?}", started.elapsed());
        // The socket was closed with 1012; a client that reconnects
        // (through the drained node) reaches the new owner.
        let code = socket.recv_close_code().await?;
        ensure!(
            code == Some(CLOSE_SERVICE_RESTART),
            "socket closed with {code:?}"
        );
        let (again, _) = socket_increment(c, 0, &socket_key).await?;
        again.close().await;
        *extra.entry(socket_actor).or_default() += 1;
        anyhow::Ok(())
    })
    .await?;
    report_unavailable("drain under load", &seen);
    check_counts(c, 1, &seen, &extra).await?;

    // The drained node holds nothing and says so.
    let resident = c.metric(0, "wasmkeep_resident_actors").await?;
    ensure!(
        resident == Some(0.0),
        "resident actors on {drained}: {resident:?}"
    );
    let row = node_row(c, &drained).await?;
    ensure!(
        row.as_ref().is_some_and(|(_, drain, _)| drain == "drained"),
        "node list row of {drained}: {row:?}"
    );

    // The alarm fired once, on a peer.
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let path = format!("/t/counter/d{alarm_actor}/alarms");
    loop {
        let r = c.send_retrying(1, "GET", &path, deadline).await?;
        ensure!(r.status == 200, "GET {path}: {} {}", r.status, r.text());
        let fired = r.count()?;
        ensure!(fired <= 1, "the alarm fired {fired} times");
        if fired == 1 {
            ensure!(
                r.node() != Some(drained.as_str()),
                "the alarm's actor answered from the drained node"
            );
            break;
        }
        if Instant::now() >= deadline {
            bail!("the alarm due during the drain never fired");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }

    // Undrain: the node acquires actors again.
    c.cli(&["node", "undrain", &drained]).await?;
    wait_for_drain_word(c, &drained, "none").await
}

async fn sigterm_body(c: &mut Cluster) -> anyhow::Result<()> {
    let seen = Load::default();
    let owners = warm_up(c, &seen).await?;
    let stopped = c.len() - 1;
    ensure!(
        owners.iter().any(|o| o == c.node_id(stopped)),
        "no actor on the node to stop: {owners:?}"
    );
    let rest: Vec<usize> = (0..stopped).collect();
    let status = {
        let c = &*c;
        under_load(c, &rest, &seen, c.sigterm_and_wait(stopped)).await?
    };
    ensure!(status.success(), "node {stopped} exited with {status}");
    report_unavailable("SIGTERM drain under load", &seen);
    check_counts(c, 0, &seen, &BTreeMap::new()).await
}

async fn alone_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let node = c.node_id(0).to_owned();
    // Bad input: an unknown node, and the last serving node.
    let unknown = c.cli(&["node", "drain", "no-such-node"]).await;
    ensure!(
        unknown
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("no heartbeat")),
        "draining an unknown node: {unknown:?}"
    );
    let last = c.cli(&["node", "drain", &node]).await;
    ensure!(
        last.as_ref()
            .is_err_and(|e| format!("{e:#}").contains("last serving node")),
        "draining the last node: {last:?}"
    );
    ensure!(
        node_row(c, &node)
            .await?
            .is_some_and(|(_, drain, _)| drain == "none"),
        "a refused drain changed the node"
    );
    // A drain key of another app is not this node's.
    let renewals_before = c
        .metric(0, "wasmkeep_lease_renewals_total")
        .await?
        .context("wasmkeep_lease_renewals_total missing")?;
    let other_app = tokio::process::Command::new(crate::runner::BIN)
        .args(["node", "drain", &node, "--force"])
        .args(["--bucket", c.bucket_url(), "--app", "other"])
        .output()
        .await?;
    ensure!(
        other_app.status.success(),
        "drain key of another app: {}",
        String::from_utf8_lossy(&other_app.stderr)
    );
    // Two renewals later the node has looked for its key at least once.
    let deadline = Instant::now() + PHASE_TIME_MAX;
    loop {
        let renewals = c.metric(0, "wasmkeep_lease_renewals_total").await?;
        if renewals.is_some_and(|r| r >= renewals_before + 2.0) {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the node stopped renewing its lease");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let row = node_row(c, &node).await?;
    ensure!(
        row.as_ref().is_some_and(|(_, drain, _)| drain == "none"),
        "a drain key of another app changed the node: {row:?}"
    );

    // Forced: the node is asked, has nowhere to go, and keeps serving.
    c.cli(&["node", "drain", &node, "--force"]).await?;
    wait_for_drain_word(c, &node, "asked").await?;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    loop {
        if c.metric(0, "wasmkeep_drain_blocked").await? == Some(1.0) {
            break;
        }
        if Instant::now() >= deadline {
            bail!("wasmkeep_drain_blocked never became 1");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
    for k in 1..=3u64 {
        let r = c
            .send_retrying(0, "POST", "/t/counter/alone/increment", deadline)
            .await?;
        ensure!(
            r.status == 200 && r.count()? == k,
            "increment {k} on a node with no eligible peer: {} {}",
            r.status,
            r.text()
        );
    }
    c.cli(&["node", "undrain", &node]).await?;
    wait_for_drain_word(c, &node, "none").await
}

/// Measurement, not a check (`--ignored`): how long `node drain --wait`
/// takes for `idle` resident idle actors, then for `busy` actors under load.
pub async fn measure_drain_time(tls: bool, bucket: BucketKind) {
    let mut options = ClusterOptions::new("drain-measure", bucket, tls);
    options.nodes = 2;
    options.extra_args = vec!["--max-actors".into(), "5000".into()];
    crate::run(options, measure_body).await
}

/// Idle actors drained in the measurement.
const MEASURE_IDLE_ACTORS: usize = 1000;
/// Busy actors drained in the measurement.
const MEASURE_BUSY_ACTORS: usize = 100;
/// Requests in flight while creating actors.
const MEASURE_IN_FLIGHT_MAX: usize = 32;

async fn measure_body(c: &mut Cluster) -> anyhow::Result<()> {
    use futures::StreamExt;
    let c = &*c;
    let deadline = Instant::now() + Duration::from_secs(120);
    let created: Vec<anyhow::Result<()>> = futures::stream::iter(0..MEASURE_IDLE_ACTORS)
        .map(|a| async move {
            let r = c
                .send_retrying(0, "POST", &format!("/t/counter/m{a}/increment"), deadline)
                .await?;
            ensure!(r.status == 200, "m{a}: {}", r.status);
            Ok(())
        })
        .buffer_unordered(MEASURE_IN_FLIGHT_MAX)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let resident = c.metric(0, "wasmkeep_resident_actors").await?;
    let started = Instant::now();
    c.cli(&["node", "drain", c.node_id(0), "--wait"]).await?;
    eprintln!(
        "MEASURE: drain of {resident:?} idle actors: {:?} (node drain --wait, incl. the CLI start and the heartbeat that notices the key)",
        started.elapsed()
    );
    c.cli(&["node", "undrain", c.node_id(0)]).await?;
    wait_for_drain_word(c, c.node_id(0), "none").await?;

    // Busy: MEASURE_BUSY_ACTORS actors claimed on node 0, under load from both nodes.
    let stop = AtomicBool::new(false);
    let unavailable = AtomicU64::new(0);
    let answered = AtomicU64::new(0);
    let reasons: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    for a in 0..MEASURE_BUSY_ACTORS {
        c.send_retrying(0, "POST", &format!("/t/counter/b{a}/increment"), deadline)
            .await?;
    }
    let loaders = futures::future::join_all((0..LOADERS).map(|l| {
        let (stop, unavailable, answered, reasons) = (&stop, &unavailable, &answered, &reasons);
        async move {
            let mut k = l;
            while !stop.load(Ordering::Relaxed) {
                let a = k % MEASURE_BUSY_ACTORS;
                let path = format!("/t/counter/b{a}/increment");
                k += LOADERS;
                if let Ok(r) = c.http.post(&c.url(k % 2, &path)).await {
                    answered.fetch_add(1, Ordering::Relaxed);
                    if r.status == 503 {
                        unavailable.fetch_add(1, Ordering::Relaxed);
                        // The reason without the actor's name.
                        let reason = r.text().replace(&format!("b{a}"), "*");
                        *reasons
                            .lock()
                            .entry(format!("via n{} {reason}", k % 2))
                            .or_default() += 1;
                    }
                }
            }
        }
    }));
    let drive = async {
        let started = Instant::now();
        let result = c.cli(&["node", "drain", c.node_id(0), "--wait"]).await;
        let elapsed = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        result.map(|_| elapsed)
    };
    let (_, elapsed) = tokio::join!(loaders, drive);
    eprintln!(
        "MEASURE: drain of {MEASURE_BUSY_ACTORS} busy actors: {:?}; {} of {} requests answered 503",
        elapsed?,
        unavailable.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed)
    );
    eprintln!("MEASURE: 503 reasons: {:#?}", reasons.lock());
    Ok(())
}
