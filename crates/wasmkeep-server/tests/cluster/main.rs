//! Cluster tests (DESIGN.md "Testing"): real `wasmkeep serve` processes on
//! loopback sharing one bucket — SeaweedFS (S3) for most, a folder for some —
//! each test once over plain HTTP and once over TLS.
//!
//! Run: `WASMKEEP_WEED=/work/venv-sw/bin/weed cargo test --release -j2 -p wasmkeep-server --test cluster`
//! (guests from scripts/build-guests). `WASMKEEP_S3_TESTS=skip` skips the
//! SeaweedFS ones loudly. `WASMKEEP_TEST_NODE_LOG` sets the nodes' `RUST_LOG`
//! (default `info`). The partition tests put nodes in network namespaces,
//! which needs root and `ip`: elsewhere they say "SKIPPED" and pass, unless
//! `WASMKEEP_REQUIRE_NETNS=1` (CI), which makes that a failure.

mod client;
mod fault_proxy;
mod netns;
mod runner;

mod bucket_loss;
mod calls;
mod deletes;
mod drain;
mod failover;
mod moves;
mod node_list;
mod outbound;
mod partitions;
mod requests;
mod restore;
mod signing;
mod traces;
#[path = "../common/upstream.rs"]
mod upstream;

use runner::{BucketKind, Cluster, ClusterOptions};

/// Starts the cluster, runs `body`, and panics with the error while the
/// cluster is still alive, so its Drop prints every node's log tail.
pub async fn run(
    options: ClusterOptions,
    body: impl AsyncFnOnce(&mut Cluster) -> anyhow::Result<()>,
) {
    if options.bucket != BucketKind::Folder
        && wasmkeep_testkit::s3_tests_skipped(&format!("cluster {}", options.name))
    {
        return;
    }
    if options.netns
        && let Some(why) = netns::unavailable()
    {
        assert!(
            std::env::var("WASMKEEP_REQUIRE_NETNS").as_deref() != Ok("1"),
            "WASMKEEP_REQUIRE_NETNS=1 but cluster {} cannot run: {why}",
            options.name
        );
        eprintln!(
            "!!!!! SKIPPED PARTITION TEST cluster {}: {why} (WASMKEEP_REQUIRE_NETNS=1 makes this a failure) !!!!!",
            options.name
        );
        return;
    }
    let name = options.name.clone();
    let mut cluster = match Cluster::start(options).await {
        Ok(cluster) => cluster,
        Err(e) => panic!("cluster {name} did not start: {e:#}"),
    };
    if let Err(e) = body(&mut cluster).await {
        panic!("cluster test {name} failed: {e:#}");
    }
}

/// Generates `NAME::plain` and `NAME::tls`, both calling `TEST(tls, bucket)`.
macro_rules! plain_and_tls {
    ($(#[$meta:meta])* $name:ident => $test:path, $bucket:expr) => {
        mod $name {
            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain() {
                $test(false, $bucket).await
            }

            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls() {
                $test(true, $bucket).await
            }
        }
    };
}

plain_and_tls!(
    round_robin_requests_have_one_owner_per_actor => crate::requests::round_robin_requests_have_one_owner_per_actor,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    round_robin_requests_have_one_owner_per_actor_on_a_folder_bucket => crate::requests::round_robin_requests_have_one_owner_per_actor,
    crate::BucketKind::Folder
);
plain_and_tls!(
    killed_owner_is_replaced_with_every_acknowledged_write => crate::failover::killed_owner_is_replaced_with_every_acknowledged_write,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    node_cut_off_from_the_bucket_stops_serving => crate::bucket_loss::node_cut_off_from_the_bucket_stops_serving,
    crate::BucketKind::PrivateSeaweedFs
);
plain_and_tls!(
    websocket_through_a_non_owner_works_both_ways => crate::calls::websocket_through_a_non_owner_works_both_ways,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    actor_calls_across_nodes => crate::calls::actor_calls_across_nodes,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    one_trace_covers_a_forwarded_request_and_a_call => crate::traces::one_trace_covers_a_forwarded_request_and_a_call,
    crate::BucketKind::Folder
);
plain_and_tls!(
    forged_and_replayed_signed_calls_are_refused => crate::signing::forged_and_replayed_signed_calls_are_refused,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    node_list_shows_every_node => crate::node_list::node_list_shows_every_node,
    crate::BucketKind::Folder
);
plain_and_tls!(
    drain_under_load_hands_every_actor_over => crate::drain::drain_under_load_hands_every_actor_over,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    sigterm_drains_under_load => crate::drain::sigterm_drains_under_load,
    crate::BucketKind::Folder
);
plain_and_tls!(
    a_drain_waits_for_an_events_outbound_request => crate::outbound::a_drain_waits_for_an_events_outbound_request,
    crate::BucketKind::Folder
);
plain_and_tls!(
    drain_without_eligible_peer_keeps_serving => crate::drain::drain_without_eligible_peer_keeps_serving,
    crate::BucketKind::Folder
);
plain_and_tls!(
    a_closing_socket_keeps_the_actor_until_its_client_answers => crate::drain::a_closing_socket_keeps_the_actor_until_its_client_answers,
    crate::BucketKind::Folder
);
/// Plain HTTP only: the hand-off's transport is what the tests above cover
/// both ways; this one waits out 14 s of backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_alarm_keeps_its_retries() {
    crate::drain::a_drained_alarm_keeps_its_retries(false, crate::BucketKind::Folder).await
}
plain_and_tls!(
    #[ignore = "a measurement; run with --ignored --nocapture"]
    measure_drain_time => crate::drain::measure_drain_time,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    resident_actor_moves_under_load => crate::moves::resident_actor_moves_under_load,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    moves_that_cannot_happen_now_wait_and_nobody_held_actors_are_taken => crate::moves::moves_that_cannot_happen_now_wait_and_nobody_held_actors_are_taken,
    crate::BucketKind::Folder
);
plain_and_tls!(
    an_alarm_due_after_the_move_fires_on_the_target_once_the_old_owner_is_gone => crate::moves::an_alarm_due_after_the_move_fires_on_the_target_once_the_old_owner_is_gone,
    crate::BucketKind::Folder
);
plain_and_tls!(
    a_release_that_fails_keeps_the_key_and_the_alarm => crate::moves::a_release_that_fails_keeps_the_key_and_the_alarm,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    #[ignore = "a measurement; run with --ignored --nocapture"]
    measure_move_time => crate::moves::measure_move_time,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    #[ignore = "a measurement; run with --ignored --nocapture"]
    measure_move_time_on_a_folder_bucket => crate::moves::measure_move_time,
    crate::BucketKind::Folder
);
plain_and_tls!(
    #[ignore = "a measurement; run with --ignored --nocapture"]
    measure_forwarded_body_latency => crate::requests::measure_forwarded_body_latency,
    crate::BucketKind::Folder
);
plain_and_tls!(
    the_holder_deletes_a_resident_actor_and_any_node_an_unheld_one => crate::deletes::the_holder_deletes_a_resident_actor_and_any_node_an_unheld_one,
    crate::BucketKind::Folder
);
plain_and_tls!(
    an_actor_goes_back_in_time_while_clients_write => crate::restore::an_actor_goes_back_in_time_while_clients_write,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    a_node_cut_off_from_the_bucket_stops_serving_and_another_takes_over => crate::partitions::a_node_cut_off_from_the_bucket_stops_serving_and_another_takes_over,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    cuts_between_nodes_fail_forwarded_requests_cleanly_and_heal => crate::partitions::cuts_between_nodes_fail_forwarded_requests_cleanly_and_heal,
    crate::BucketKind::SeaweedFs
);
plain_and_tls!(
    repeated_cuts_under_load_lose_no_acknowledged_write_and_every_alarm_fires => crate::partitions::repeated_cuts_under_load_lose_no_acknowledged_write_and_every_alarm_fires,
    crate::BucketKind::SeaweedFs
);
