//! Events that reach an actor through another node: a WebSocket opened on a
//! non-owner is relayed both ways, and an actor's call to an actor owned
//! elsewhere reaches that owner.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::runner::{BucketKind, Cluster, ClusterOptions};

const PHASE_TIME_MAX: Duration = Duration::from_secs(60);
/// Names tried to find a caller owned by another node than the callee.
const CALLER_CANDIDATES: usize = 20;

pub async fn websocket_through_a_non_owner_works_both_ways(tls: bool, bucket: BucketKind) {
    crate::run(ClusterOptions::new("websocket", bucket, tls), websocket).await
}

pub async fn actor_calls_across_nodes(tls: bool, bucket: BucketKind) {
    let options = ClusterOptions::new("calls", bucket, tls).with_class("sink", "kitchen-sink");
    crate::run(options, calls).await
}

/// Sends `method path` via node `i` (retrying 503), expects 200, returns
/// the answering node's index and the response.
async fn owner_of(
    c: &Cluster,
    i: usize,
    method: &str,
    path: &str,
) -> anyhow::Result<(usize, crate::client::Resp)> {
    let r = c
        .send_retrying(i, method, path, Instant::now() + PHASE_TIME_MAX)
        .await?;
    ensure!(
        r.status == 200,
        "{method} {path} via node {i}: {} {}",
        r.status,
        r.text()
    );
    let node = r
        .node()
        .with_context(|| format!("{method} {path}: no x-wasmkeep-node"))?;
    let index = c
        .index_of(node)
        .with_context(|| format!("unknown node {node}"))?;
    Ok((index, r))
}

async fn websocket(c: &mut Cluster) -> anyhow::Result<()> {
    let (owner, _) = owner_of(c, 0, "POST", "/t/counter/w1/increment").await?;
    let relay = (owner + 1) % c.len();
    let mut socket = c
        .http
        .websocket(&c.url(relay, "/t/counter/w1/ws"))
        .await
        .with_context(|| format!("opening the socket via node {relay} (owner {owner})"))?;
    // Client to actor and actor to client, through the relay.
    for expected in 2..=4 {
        socket.send_text("inc").await?;
        let answer = socket.recv_text().await?;
        ensure!(
            answer.trim() == expected.to_string(),
            "socket via node {relay}: `inc` answered {answer:?}, expected {expected}"
        );
    }
    // The socket's writes are the owner's, seen over HTTP through any node,
    // and an HTTP write is seen by the next socket message.
    let (served_by, r) = owner_of(c, relay, "POST", "/t/counter/w1/increment").await?;
    ensure!(
        served_by == owner,
        "w1 moved from node {owner} to node {served_by}"
    );
    ensure!(
        r.count()? == 5,
        "HTTP increment after 3 socket increments answered {}",
        r.text()
    );
    socket.send_text("inc").await?;
    let answer = socket.recv_text().await?;
    ensure!(
        answer.trim() == "6",
        "socket `inc` after the HTTP increment answered {answer:?}"
    );
    socket.close().await;
    Ok(())
}

async fn calls(c: &mut Cluster) -> anyhow::Result<()> {
    let (callee_owner, _) = owner_of(c, 0, "POST", "/t/sink/callee/echo").await?;
    // A caller on another node than the callee.
    let mut caller = None;
    for k in 0..CALLER_CANDIDATES {
        let name = format!("caller{k}");
        let via = (callee_owner + 1 + k) % c.len();
        let (owner, _) = owner_of(c, via, "POST", &format!("/t/sink/{name}/echo")).await?;
        if owner != callee_owner {
            caller = Some((name, owner));
            break;
        }
    }
    let Some((caller, caller_owner)) = caller else {
        bail!("{CALLER_CANDIDATES} callers all landed on the callee's node {callee_owner}");
    };
    // The kitchen sink's /call sends `POST /inner?x=1` to sink/callee, whose
    // guest answers 404 `no route /inner`: proof the callee's guest ran.
    let path = format!("/t/sink/{caller}/call?class=sink&name=callee");
    let r = c
        .send_retrying(caller_owner, "POST", &path, Instant::now() + PHASE_TIME_MAX)
        .await?;
    ensure!(
        r.status == 404 && r.text().contains("no route /inner"),
        "{caller} on node {caller_owner} calling callee on node {callee_owner}: {} {}",
        r.status,
        r.text()
    );
    // The call did not move the callee.
    let (after, _) = owner_of(c, caller_owner, "POST", "/t/sink/callee/echo").await?;
    ensure!(
        after == callee_owner,
        "after the call, callee answered from node {after}, not its owner {callee_owner}"
    );
    calls_that_wait_on_each_other(c, &caller, caller_owner, callee_owner).await?;
    calls_that_wait_round_three_nodes(c).await
}

/// Three actors on three nodes; each one's event waits a moment, then calls
/// the next (a → b → c → a). Every call reaches an actor busy waiting on
/// another node, so no call chain names a repeat: the node that receives
/// the last call asks the holder of the actor its target waits on
/// (ADR 0005, amended) and refuses the call as a call cycle, instead of
/// all three waiting for the forward time limit. The other two calls then
/// run.
async fn calls_that_wait_round_three_nodes(c: &Cluster) -> anyhow::Result<()> {
    /// Each event runs this long before its call, so that all three are
    /// busy when the calls arrive.
    const EVENT_WAIT_MS: u64 = 1500;
    ensure!(
        c.len() >= 3,
        "three nodes are needed, the cluster has {}",
        c.len()
    );
    // One actor per node: activated through that node, which claims it.
    let mut ring = Vec::new();
    for node in 0..3 {
        let mut found = None;
        for k in 0..CALLER_CANDIDATES {
            let name = format!("ring{node}x{k}");
            let (owner, _) = owner_of(c, node, "POST", &format!("/t/sink/{name}/echo")).await?;
            if owner == node {
                found = Some(name);
                break;
            }
        }
        ring.push(found.with_context(|| format!("no actor landed on node {node}"))?);
    }
    let urls: Vec<String> = (0..3)
        .map(|i| {
            let next = &ring[(i + 1) % 3];
            c.url(
                i,
                &format!(
                    "/t/sink/{}/call?class=sink&name={next}&path=/noop&sleep_ms={EVENT_WAIT_MS}",
                    ring[i]
                ),
            )
        })
        .collect();
    let (a, b, c2) = tokio::join!(
        c.http.post(&urls[0]),
        c.http.post(&urls[1]),
        c.http.post(&urls[2])
    );
    let answers = [a?, b?, c2?];
    let refused = answers
        .iter()
        .filter(|r| r.text().contains("call cycle"))
        .count();
    ensure!(
        refused >= 1,
        "no call of the ring {ring:?} was refused as a cycle: {:?}",
        answers
            .iter()
            .map(|r| (r.status, r.text()))
            .collect::<Vec<_>>()
    );
    for (i, r) in answers.iter().enumerate() {
        ensure!(
            r.status == 204 || r.text().contains("call cycle"),
            "{}'s call to {}: {} {}",
            ring[i],
            ring[(i + 1) % 3],
            r.status,
            r.text()
        );
    }
    Ok(())
}

/// The callee's event waits a moment, then calls the caller; meanwhile the
/// caller's event calls the callee, whose mailbox is busy. Each waits on the
/// other across two nodes: the caller's node refuses the callee's call as a
/// call cycle (508) instead of both waiting for the forward time limit, and
/// the caller's call then runs.
async fn calls_that_wait_on_each_other(
    c: &Cluster,
    caller: &str,
    caller_owner: usize,
    callee_owner: usize,
) -> anyhow::Result<()> {
    /// The callee's event runs this long before its call: the caller's
    /// call reaches the callee's mailbox meanwhile (one forward, ~1 ms).
    const CALLEE_WAIT_MS: u64 = 1500;
    let events = |i| async move {
        c.metric(i, "wasmkeep_events_total")
            .await?
            .context("no wasmkeep_events_total")
    };
    let before = events(callee_owner).await?;
    let callee_path = format!(
        "/t/sink/callee/call?class=sink&name={caller}&path=/noop&sleep_ms={CALLEE_WAIT_MS}"
    );
    let callee_url = c.url(callee_owner, &callee_path);
    let callee_event = c.http.post(&callee_url);
    let caller_event = async {
        // Once the callee's event runs, the caller calls it.
        let deadline = Instant::now() + PHASE_TIME_MAX;
        while events(callee_owner).await? <= before {
            ensure!(
                Instant::now() < deadline,
                "the callee's event never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let path = format!("/t/sink/{caller}/call?class=sink&name=callee&path=/noop");
        c.http.post(&c.url(caller_owner, &path)).await
    };
    let (callee_answer, caller_answer) = tokio::join!(callee_event, caller_event);
    let (callee_answer, caller_answer) = (callee_answer?, caller_answer?);
    ensure!(
        callee_answer.text().contains("call cycle"),
        "the callee's call back to {caller} (node {caller_owner}): {} {}",
        callee_answer.status,
        callee_answer.text()
    );
    ensure!(
        caller_answer.status == 204,
        "{caller}'s call to the callee after the cycle was refused: {} {}",
        caller_answer.status,
        caller_answer.text()
    );
    Ok(())
}
