//! Moving one actor (ADR 0017): `wasmkeep actor move --to NODE` under
//! concurrent load hands a resident actor to the target with its data, its
//! socket closed with 1012 (close event first) and its alarm; the target
//! takes actors nobody holds; mistyped names are never created; targets that
//! cannot take (no `take` on line 11, draining, unknown) make the key wait
//! while the actor stays reachable; a take marker from a client is an
//! ordinary request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, bail, ensure};

use crate::drain::{
    ACTORS, CLOSE_SERVICE_RESTART, LOADERS, Load, PHASE_TIME_MAX, check_counts, claim_through,
    load, report_unavailable, set_alarm, socket_increment, under_load, warm_up,
};
use crate::runner::{BucketKind, Cluster, ClusterOptions, POLL_PERIOD};

/// The alarm is set this far ahead of the move key, so it falls due while
/// the move runs (the owner's pass comes within one heartbeat, 300 ms).
const ALARM_IN_MS: u64 = 500;

pub async fn resident_actor_moves_under_load(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("move", bucket, tls), move_body).await
}

pub async fn moves_that_cannot_happen_now_wait_and_nobody_held_actors_are_taken(
    tls: bool,
    bucket: BucketKind,
) {
    let mut options =
        ClusterOptions::new("move-edges", bucket, tls).with_class("sink", "kitchen-sink");
    // Node 2 runs without the cluster key: it does not advertise `take`.
    options.without_cluster_key = vec![2];
    options.extra_args = vec!["--idle-timeout".into(), "1s".into()];
    crate::run(options, edges_body).await
}

pub async fn an_alarm_due_after_the_move_fires_on_the_target_once_the_old_owner_is_gone(
    tls: bool,
    bucket: BucketKind,
) {
    let mut options = ClusterOptions::new("move-alarm", bucket, tls);
    options.nodes = 2;
    // The sweep would find the alarm too; slowed, only the target's own
    // registration (armed by the take) can fire it.
    options.extra_args = vec!["--alarm-sweep".into(), "1h".into()];
    crate::run(options, alarm_after_move_body).await
}

async fn alarm_after_move_body(c: &mut Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let n1 = c.node_id(1).to_owned();
    claim_through(c, 0, "t/counter/late", deadline).await?;
    set_alarm(c, 0, "t/counter/late", 2500).await?;
    c.cli(&["actor", "move", "t/counter/late", "--to", &n1, "--wait"])
        .await
        .context("the move")?;
    c.kill9(0);
    loop {
        let r = c
            .send_retrying(1, "GET", "/t/counter/late/alarms", deadline)
            .await?;
        ensure!(r.node() == Some(n1.as_str()), "answered by {:?}", r.node());
        let fired = r.count()?;
        ensure!(fired <= 1, "the alarm fired {fired} times");
        if fired == 1 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the alarm due after the move never fired on the target");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

pub async fn a_release_that_fails_keeps_the_key_and_the_alarm(tls: bool, bucket: BucketKind) {
    let mut options = ClusterOptions::new("move-release-fails", bucket, tls);
    options.nodes = 2;
    options.bucket_proxy = true;
    // Only the target's registration (armed by its take) may fire the alarm.
    options.extra_args = vec!["--alarm-sweep".into(), "1h".into()];
    crate::run(options, release_fails_body).await
}

/// The alarm falls due well after the failed release and the move that
/// follows it (the failure phase takes about one lease TTL, 2 s).
const LATE_ALARM_IN_MS: u64 = 20_000;

/// The move keys in the bucket for `name` (a counter of tenant `t`).
async fn move_keys(c: &Cluster, name: &str) -> anyhow::Result<Vec<String>> {
    let bucket = c.bucket().await?;
    let listed = bucket
        .list(&format!(
            "apps/{}/control/move/t/counter/{}/",
            crate::runner::APP,
            hex::encode(name)
        ))
        .await?;
    Ok(listed.into_iter().map(|m| m.key).collect())
}

/// `actor inspect --json` of `actor`.
async fn inspect(c: &Cluster, actor: &str) -> anyhow::Result<serde_json::Value> {
    let out = c.cli(&["actor", "inspect", actor, "--json"]).await?;
    serde_json::from_str(&out).with_context(|| format!("actor inspect: {out}"))
}

async fn release_fails_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let (n0, n1) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    let actor = "t/counter/kept";
    claim_through(c, 0, actor, deadline).await?;
    let alarm_ms = set_alarm(c, 0, actor, LATE_ALARM_IN_MS).await?;

    // Every write of an ownership record fails: the owner's release too.
    let proxy = c.fault_proxy()?;
    proxy.refuse(&[http::Method::PUT, http::Method::DELETE], "/owners/");
    c.cli(&["actor", "move", actor, "--to", &n1]).await?;
    loop {
        if c.metric(0, "wasmkeep_leftover_holds").await? == Some(1.0) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the owner never reported the failed release"
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }
    ensure!(proxy.refused() > 0, "the proxy refused nothing");
    let log = c.node_log(0);
    ensure!(
        log.contains("ownership record not released"),
        "node 0 did not log the failed release"
    );
    let retried = c.metric(0, "wasmkeep_moves_retried_total").await?;
    ensure!(retried >= Some(1.0), "moves retried on node 0: {retried:?}");
    // The key and the alarm are kept; the record still names the owner,
    // so the target has not taken the actor.
    let keys = move_keys(c, "kept").await?;
    ensure!(
        keys.len() == 1,
        "move keys after the failed release: {keys:?}"
    );
    let row = inspect(c, actor).await?;
    ensure!(
        row["owner"].as_str() == Some(n0.as_str()) && row["hold_valid"].as_bool() == Some(true),
        "after the failed release: {row}"
    );
    ensure!(
        row["alarm_ms"].as_i64() == Some(alarm_ms),
        "the alarm after the failed release: {row} (set for {alarm_ms})"
    );

    // The bucket takes the record's writes again: the owner gives its
    // leftover hold back and the target takes the actor, with no event
    // sent to it meanwhile.
    proxy.heal();
    loop {
        if holder(c, actor).await?.as_deref() == Some(n1.as_str())
            && move_keys(c, "kept").await?.is_empty()
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the move never completed after the release failure ended: {}",
            inspect(c, actor).await?
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }
    // Before the alarm fell due: no event had to claim the actor back.
    let r = c
        .send_retrying(1, "GET", &format!("/{actor}/alarms"), deadline)
        .await?;
    ensure!(
        r.node() == Some(n1.as_str()) && r.count()? == 0,
        "the alarm had fired ({}, on {:?}) before the target took the actor",
        r.text(),
        r.node()
    );
    let leftovers = c.metric(0, "wasmkeep_leftover_holds").await?;
    ensure!(
        leftovers == Some(0.0),
        "leftover holds on node 0: {leftovers:?}"
    );
    let row = inspect(c, actor).await?;
    ensure!(
        row["alarm_ms"].as_i64() == Some(alarm_ms),
        "the alarm after the move: {row} (set for {alarm_ms})"
    );

    // The kept alarm fires once, on the target, with the data moved along.
    let late = Instant::now() + std::time::Duration::from_millis(LATE_ALARM_IN_MS) + PHASE_TIME_MAX;
    loop {
        let r = c
            .send_retrying(0, "GET", &format!("/{actor}/alarms"), late)
            .await?;
        ensure!(r.node() == Some(n1.as_str()), "answered by {:?}", r.node());
        let fired = r.count()?;
        ensure!(fired <= 1, "the alarm fired {fired} times");
        if fired == 1 {
            break;
        }
        ensure!(
            Instant::now() < late,
            "the kept alarm never fired on the target"
        );
        tokio::time::sleep(POLL_PERIOD).await;
    }
    let r = c
        .send_retrying(0, "GET", &format!("/{actor}/value"), deadline)
        .await?;
    ensure!(r.text() == "1", "the count after the move: {}", r.text());
    Ok(())
}

pub async fn measure_move_time(tls: bool, bucket: BucketKind) {
    crate::run(
        ClusterOptions::new("move-measure", bucket, tls),
        measure_body,
    )
    .await
}

/// The owner (valid hold) of `actor` as `actor inspect --json` says, or `None`.
async fn holder(c: &Cluster, actor: &str) -> anyhow::Result<Option<String>> {
    let out = c.cli(&["actor", "inspect", actor, "--json"]).await;
    let out = match out {
        Ok(out) => out,
        Err(e) if format!("{e:#}").contains("nothing in the bucket") => return Ok(None),
        Err(e) => return Err(e),
    };
    let row: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("actor inspect: {out}"))?;
    if row["hold_valid"].as_bool() != Some(true) {
        return Ok(None);
    }
    Ok(row["owner"].as_str().map(str::to_owned))
}

/// Whether the bucket has any data or record of `actor`.
async fn actor_known(c: &Cluster, actor: &str) -> anyhow::Result<bool> {
    let out = c.cli(&["actor", "list", "--json"]).await?;
    let rows: serde_json::Value = serde_json::from_str(&out)?;
    Ok(rows
        .as_array()
        .context("actor list: not an array")?
        .iter()
        .any(|r| r["actor"].as_str() == Some(actor)))
}

async fn move_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let seen = Load::default();
    let owners = warm_up(c, &seen).await?;
    let (old, target) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    let a = (0..ACTORS)
        .find(|&a| owners[a] == old)
        .context("no actor on node 0")?;
    let actor = format!("t/counter/d{a}");

    // The target learns a fresh owner hint for the old owner (it forwards
    // a request there); the take must not trust it.
    let r = c
        .http
        .post(&c.url(1, &format!("/{actor}/increment")))
        .await?;
    ensure!(
        r.status == 200 && r.node() == Some(old.as_str()),
        "increment through the target: {} {:?}",
        r.status,
        r.node()
    );
    let mut extra = BTreeMap::from([(a, 1u64)]);

    // A socket to the moving actor, through its owner.
    let (mut socket, _) = socket_increment(c, 0, &actor).await?;
    *extra.entry(a).or_default() += 1;

    // An alarm that falls due while the move runs.
    set_alarm(c, 0, &actor, ALARM_IN_MS).await?;

    let all: Vec<usize> = (0..c.len()).collect();
    under_load(c, &all, &seen, async {
        let started = Instant::now();
        let out = c
            .cli(&["actor", "move", &actor, "--to", &target, "--wait"])
            .await;
        eprintln!("move of {actor} under load took {:?}", started.elapsed());
        out?;
        let code = socket.recv_close_code().await?;
        ensure!(
            code == Some(CLOSE_SERVICE_RESTART),
            "the moving actor's socket closed with {code:?}"
        );
        // A client that reconnects through the old owner reaches the target.
        let (again, _) = socket_increment(c, 0, &actor).await?;
        again.close().await;
        anyhow::Ok(())
    })
    .await?;
    *extra.entry(a).or_default() += 1;
    report_unavailable("move under load", &seen);
    check_counts(c, 2, &seen, &extra).await?;

    // The target holds it, with its data; requests to the old owner reach it.
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let r = c
        .send_retrying(0, "GET", &format!("/{actor}/value"), deadline)
        .await?;
    ensure!(
        r.status == 200 && r.node() == Some(target.as_str()),
        "value through the old owner: {} from {:?}",
        r.status,
        r.node()
    );
    let h = holder(c, &actor).await?;
    ensure!(
        h.as_deref() == Some(target.as_str()),
        "holder after the move: {h:?}"
    );

    // The socket's close event ran before the hand-over (its count moved along).
    let r = c
        .send_retrying(2, "GET", &format!("/{actor}/closes"), deadline)
        .await?;
    ensure!(r.count()? >= 1, "closes after the move: {}", r.text());

    // The alarm due during the move fired once.
    loop {
        let r = c
            .send_retrying(2, "GET", &format!("/{actor}/alarms"), deadline)
            .await?;
        let fired = r.count()?;
        ensure!(fired <= 1, "the alarm fired {fired} times");
        if fired == 1 {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the alarm due during the move never fired");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }

    // Moving to the node that holds it: the key is deleted, nothing moves.
    c.cli(&["actor", "move", &actor, "--to", &target, "--wait"])
        .await
        .context("a move to the current owner")?;
    let h = holder(c, &actor).await?;
    ensure!(
        h.as_deref() == Some(target.as_str()),
        "holder after a no-op move: {h:?}"
    );
    let waiting = c.metric(1, "wasmkeep_moves_started_total").await?;
    ensure!(
        waiting == Some(0.0),
        "the target started moves: {waiting:?}"
    );
    Ok(())
}

async fn edges_body(c: &mut Cluster) -> anyhow::Result<()> {
    let c = &*c;
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let (n0, n1, n2) = (
        c.node_id(0).to_owned(),
        c.node_id(1).to_owned(),
        c.node_id(2).to_owned(),
    );

    // A take marker from a client is an ordinary request (stripped, unsigned).
    let r = c
        .http
        .send(
            "POST",
            &c.url(0, "/t/counter/e1/increment"),
            &[("x-wasmkeep-take".to_owned(), "1".to_owned())],
            bytes::Bytes::new(),
        )
        .await?;
    ensure!(
        r.status == 200 && r.text() == "1" && r.node() == Some(n0.as_str()),
        "increment with a client's take marker: {} {} from {:?}",
        r.status,
        r.text(),
        r.node()
    );

    // ... and so is a take marker in a guest's call to another actor.
    let r = c
        .send_retrying(
            0,
            "POST",
            "/t/sink/caller/call?class=counter&name=e0&path=/increment&header=x-wasmkeep-take",
            deadline,
        )
        .await?;
    ensure!(
        r.status == 200 && r.text() == "1",
        "a guest's call with a take marker: {} {}",
        r.status,
        r.text()
    );

    // An actor nobody holds (it hibernated after 1 s idle) is taken by the target.
    let wait_free = Instant::now() + PHASE_TIME_MAX;
    while holder(c, "t/counter/e1").await?.is_some() {
        ensure!(Instant::now() < wait_free, "t/counter/e1 never hibernated");
        tokio::time::sleep(POLL_PERIOD).await;
    }
    c.cli(&["actor", "move", "t/counter/e1", "--to", &n1, "--wait"])
        .await
        .context("moving an actor nobody holds")?;
    let r = c
        .send_retrying(0, "GET", "/t/counter/e1/value", deadline)
        .await?;
    ensure!(
        r.status == 200 && r.text() == "1" && r.node() == Some(n1.as_str()),
        "after the take: {} {} from {:?}",
        r.status,
        r.text(),
        r.node()
    );

    // A mistyped name is not created: the move reports it, nothing is written.
    let typo = c
        .cli(&["actor", "move", "t/counter/no-such", "--to", &n1, "--wait"])
        .await;
    ensure!(
        typo.as_ref()
            .is_err_and(|e| format!("{e:#}").contains("does not exist")),
        "moving a mistyped name: {typo:?}"
    );
    ensure!(
        !actor_known(c, "t/counter/no-such").await?,
        "a mistyped name was created"
    );

    // Bad input is refused before anything is written.
    for (actor, to) in [("t/counter", n1.as_str()), ("t/counter/x", "Bad Node")] {
        let bad = c.cli(&["actor", "move", actor, "--to", to]).await;
        ensure!(bad.is_err(), "actor move {actor} --to {to:?} was accepted");
    }

    // Targets that cannot take now: the key waits, the actor stays reachable.
    claim_through(c, 0, "t/counter/e2", deadline).await?;
    // An open socket keeps e2 resident on node 0 past the 1 s idle timeout.
    let mut socket = c.http.websocket(&c.url(0, "/t/counter/e2/ws")).await?;
    // ... a node that does not advertise take (no cluster key);
    c.cli(&["actor", "move", "t/counter/e2", "--to", &n2])
        .await?;
    wait_metric_at_least(c, 0, "wasmkeep_moves_waiting", 1.0).await?;
    // ... an unknown (down) node: still waiting, and reachable.
    c.cli(&["actor", "move", "t/counter/e2", "--to", "gone"])
        .await?;
    keep_busy_and_check(c, "t/counter/e2", &n0, 2).await?;
    // ... a draining node: waits; once it is undrained the move happens.
    c.cli(&["node", "drain", &n1, "--wait"]).await?;
    c.cli(&["actor", "move", "t/counter/e2", "--to", &n1])
        .await?;
    wait_metric_at_least(c, 0, "wasmkeep_moves_waiting", 1.0).await?;
    keep_busy_and_check(c, "t/counter/e2", &n0, 3).await?;
    c.cli(&["node", "undrain", &n1]).await?;
    c.cli(&["actor", "move", "t/counter/e2", "--to", &n1, "--wait"])
        .await
        .context("the move once the target is undrained")?;
    let code = socket.recv_close_code().await?;
    ensure!(
        code == Some(CLOSE_SERVICE_RESTART),
        "e2's socket closed with {code:?}"
    );
    let r = c
        .send_retrying(0, "GET", "/t/counter/e2/value", deadline)
        .await?;
    ensure!(
        r.text() == "3" && r.node() == Some(n1.as_str()),
        "e2 after the move: {} from {:?}",
        r.text(),
        r.node()
    );

    // Once the app has secrets (a recipient), a target without the identity
    // cannot open them: it refuses the take with 503, the key stays, and the
    // actor stays reachable.
    let identity = tempfile::tempdir()?;
    let identity_file = identity.path().join("app.key");
    c.cli(&[
        "secret",
        "keygen",
        "--identity-file",
        identity_file.to_str().context("a UTF-8 temp path")?,
    ])
    .await?;
    claim_through(c, 0, "t/counter/e3", deadline).await?;
    let _keep_resident = c.http.websocket(&c.url(0, "/t/counter/e3/ws")).await?;
    c.cli(&["actor", "move", "t/counter/e3", "--to", &n1])
        .await?;
    wait_metric_at_least(c, 0, "wasmkeep_moves_retried_total", 1.0).await?;
    let key = move_key_path(c, "e3", &n1)?;
    ensure!(key.exists(), "the move key {} was deleted", key.display());
    let r = c
        .send_retrying(2, "POST", "/t/counter/e3/increment", deadline)
        .await?;
    ensure!(
        r.status == 200 && r.text() == "2",
        "e3 after a refused take: {} {}",
        r.status,
        r.text()
    );
    let h = holder(c, "t/counter/e3").await?;
    ensure!(
        h.as_deref() != Some(n1.as_str()),
        "the refusing target holds e3"
    );
    Ok(())
}

/// The file of a move key of actor `t/counter/<name>` in the folder bucket.
fn move_key_path(c: &Cluster, name: &str, target: &str) -> anyhow::Result<std::path::PathBuf> {
    let root = c
        .bucket_url()
        .strip_prefix("file://")
        .context("a folder bucket")?;
    Ok(std::path::Path::new(root).join(format!(
        "apps/{}/control/move/t/counter/{}/{target}",
        crate::runner::APP,
        hex::encode(name)
    )))
}

/// Polls node `i`'s metric until it reaches `at_least`.
async fn wait_metric_at_least(
    c: &Cluster,
    i: usize,
    name: &str,
    at_least: f64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    loop {
        let value = c.metric(i, name).await?;
        if value.is_some_and(|v| v >= at_least) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("node {i}: {name} stayed {value:?}, below {at_least}");
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

/// Increments `actor` through every node: still served by `owner`, and the
/// count is `expected` afterwards.
async fn keep_busy_and_check(
    c: &Cluster,
    actor: &str,
    owner: &str,
    expected: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIME_MAX;
    let r = c
        .send_retrying(1, "POST", &format!("/{actor}/increment"), deadline)
        .await?;
    ensure!(
        r.status == 200 && r.node() == Some(owner) && r.count()? == expected,
        "{actor} while its move waits: {} {} from {:?}",
        r.status,
        r.text(),
        r.node()
    );
    Ok(())
}

/// Moves idle actors, then actors under load, one at a time, and prints the
/// owner's pass-to-take time of each (the `wasmkeep_move_seconds` sum).
async fn measure_body(c: &mut Cluster) -> anyhow::Result<()> {
    const MOVES: usize = 20;
    let c = &*c;
    let seen = Load::default();
    let owners = warm_up(c, &seen).await?;
    let holders = parking_lot::Mutex::new(owners);
    for loaded in [false, true] {
        let stop = AtomicBool::new(false);
        let all: Vec<usize> = (0..c.len()).collect();
        let loaders = async {
            if loaded {
                futures::future::join_all((0..LOADERS).map(|l| load(c, &all, l, &stop, &seen)))
                    .await;
            }
        };
        let drive = async {
            let result = async {
                let mut times_ms = Vec::new();
                for m in 0..MOVES {
                    let a = m % ACTORS;
                    let from = c.index_of(&holders.lock()[a]).context("holder index")?;
                    let to = (from + 1) % c.len();
                    let sum = |i| async move {
                        c.metric(i, "wasmkeep_move_seconds_sum").await.map(|v| v.unwrap_or(0.0))
                    };
                    let before = sum(from).await?;
                    c.cli(&[
                        "actor",
                        "move",
                        &format!("t/counter/d{a}"),
                        "--to",
                        c.node_id(to),
                        "--wait",
                    ])
                    .await?;
                    let after = sum(from).await?;
                    times_ms.push((after - before) * 1000.0);
                    holders.lock()[a] = c.node_id(to).to_owned();
                }
                eprintln!("move times (ms, in order): {times_ms:.1?}");
                times_ms.sort_by(f64::total_cmp);
                eprintln!(
                    "move time ({}, {}): p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms over {MOVES} moves",
                    if loaded { "under load" } else { "idle" },
                    if c.options().bucket == BucketKind::Folder { "folder" } else { "SeaweedFS" },
                    times_ms[MOVES / 2],
                    times_ms[MOVES * 9 / 10],
                    times_ms[MOVES - 1]
                );
                anyhow::Ok(())
            }
            .await;
            stop.store(true, Ordering::Relaxed);
            result
        };
        let (_, driven) = tokio::join!(loaders, drive);
        driven?;
    }
    eprintln!(
        "requests: {} acknowledged, {} answered 503, failures: {:?}",
        seen.acked.lock().values().sum::<u64>(),
        seen.unavailable.load(Ordering::Relaxed),
        seen.failures.lock()
    );
    check_counts(c, 0, &seen, &BTreeMap::new()).await
}
