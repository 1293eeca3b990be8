//! A guest that traps, loops or allocates without bound is stopped; only the
//! guilty instance is affected, and its next event runs on a fresh instance.

mod common;

use std::time::Duration;

use common::{
    RecordingHost, actor_id, body_text, get, guest, instance, recorder, runtime, small_config,
};
use wasmkeep_runtime::{ActorInstance, ClassComponent, Error, EventError, Runtime, RuntimeConfig};

/// `/count` answers how many requests this instance has served.
async fn count(actor: &mut ActorInstance) -> String {
    body_text(
        &actor
            .handle(get("/count"))
            .await
            .expect("a normal request succeeds"),
    )
}

#[tokio::test]
async fn a_panic_traps_with_the_panic_message_and_only_that_instance_restarts() {
    let mut guilty = instance("trap", "guilty").await;
    let mut bystander = instance("trap", "bystander").await;
    assert_eq!(count(&mut guilty).await, "1");
    assert_eq!(count(&mut bystander).await, "1");
    recorder(&mut guilty).alarm = Some(42);

    let error = guilty
        .handle(get("/panic"))
        .await
        .expect_err("the guest panics");
    let EventError::Trap(message) = &error else {
        panic!("expected a trap, got {error:?}")
    };
    assert!(message.contains("unreachable"), "{message}");
    assert!(
        message.contains("trap guest panics on purpose"),
        "the guest's stderr is in the message: {message}"
    );

    // The bystander's instance kept its state; the guilty one starts afresh
    // (the /panic request was its third) but keeps its host.
    assert_eq!(count(&mut bystander).await, "2");
    assert_eq!(count(&mut guilty).await, "1");
    assert_eq!(recorder(&mut guilty).alarm, Some(42));
}

#[tokio::test]
async fn an_unreachable_instruction_traps_and_the_next_event_succeeds() {
    let mut actor = instance("trap", "unreachable").await;
    let error = actor.handle(get("/unreachable")).await.expect_err("traps");
    assert!(
        matches!(&error, EventError::Trap(m) if m.contains("unreachable")),
        "{error:?}"
    );
    assert!(
        error.to_string().starts_with("the guest trapped:"),
        "{error}"
    );
    assert_eq!(count(&mut actor).await, "1");
}

#[tokio::test]
async fn an_endless_loop_is_stopped_at_the_time_limit_while_others_keep_working() {
    let mut spinner = instance("spin", "spinner").await;
    let mut bystander = instance("spin", "bystander").await;
    assert_eq!(count(&mut bystander).await, "1");

    // The spinning guest yields to tokio at each epoch tick, so on this
    // single-threaded runtime the bystander is served while it spins.
    let spinning = tokio::spawn(async move {
        let error = spinner.handle(get("/spin")).await.expect_err("stopped");
        (spinner, error)
    });
    tokio::task::yield_now().await;
    assert_eq!(count(&mut bystander).await, "2");

    let (mut spinner, error) = spinning.await.expect("task");
    assert_eq!(error, EventError::TimeLimit);
    assert_eq!(count(&mut spinner).await, "1");
    assert_eq!(count(&mut bystander).await, "3");
}

#[tokio::test]
async fn unbounded_allocation_is_stopped_at_the_memory_limit() {
    let mut hog = instance("hog", "hog").await;
    let mut bystander = instance("hog", "bystander").await;
    assert_eq!(count(&mut bystander).await, "1");

    let error = hog.handle(get("/hog")).await.expect_err("stopped");
    let EventError::MemoryLimit(message) = &error else {
        panic!("expected the memory limit, got {error:?}")
    };
    assert!(
        message.contains(&format!("the limit is {} bytes", 32 << 20)),
        "{message}"
    );

    assert_eq!(count(&mut hog).await, "1");
    assert_eq!(count(&mut bystander).await, "2");
}

/// An actor call that never returns fails before the caller's time limit,
/// early enough for the caller to answer (here 502 with the error).
#[tokio::test]
async fn an_actor_call_that_never_returns_fails_before_the_time_limit() {
    let mut caller = instance("kitchen-sink", "caller").await;
    recorder(&mut caller).call_hangs = true;
    let response = caller
        .handle(get("/call"))
        .await
        .expect("the caller answers");
    assert_eq!(response.status, 502);
    let text = String::from_utf8(response.body).expect("utf-8");
    assert!(
        text.contains("call to other/n1 timed out") && text.contains("time limit is near"),
        "{text}"
    );

    // The host survived the cut-off call; the next event runs as usual.
    recorder(&mut caller).call_hangs = false;
    let response = caller
        .handle(get("/call"))
        .await
        .expect("the next event succeeds");
    assert_eq!(response.status, 201);
    assert_eq!(
        recorder(&mut caller).calls,
        vec!["actors.call other/n1", "actors.call other/n1"]
    );
}

#[test]
fn a_component_whose_initial_memory_exceeds_the_limit_is_refused_clearly() {
    let runtime = Runtime::new(RuntimeConfig {
        memory_bytes_max: 64 * 1024,
        ..small_config()
    })
    .expect("runtime");
    let Err(error) = runtime.load_component(&guest("kitchen-sink")) else {
        panic!("a component needing more memory than the limit was accepted")
    };
    let message = error.to_string();
    assert!(
        message.contains("exceeds the limit of 0x10000 bytes"),
        "{message}"
    );
}

/// The trap guest, in a runtime of its own whose pool holds `instances_max`
/// instances.
fn trap_in_a_pool_of(instances_max: u32) -> (Runtime, ClassComponent) {
    let runtime = Runtime::new(RuntimeConfig {
        instances_max,
        ..small_config()
    })
    .expect("runtime");
    let component = runtime.load_component(&guest("trap")).expect("loads");
    (runtime, component)
}

#[tokio::test]
async fn a_full_pool_refuses_another_instance_until_one_is_dropped() {
    let (_runtime, component) = trap_in_a_pool_of(2);
    let new =
        |name: &str| component.instantiate(actor_id(name), Box::new(RecordingHost::default()));
    let first = new("one").await.expect("first");
    let _second = new("two").await.expect("second");
    let Err(Error::Instantiate(message)) = new("three").await else {
        panic!("a third instance does not fit a pool of two")
    };
    assert!(
        message.contains("concurrent") || message.contains("limit"),
        "{message}"
    );
    drop(first);
    new("three").await.expect("a slot is free again");
}

#[tokio::test]
async fn configuration_out_of_range_is_refused() {
    for config in [
        RuntimeConfig {
            memory_bytes_max: 100,
            ..small_config()
        },
        RuntimeConfig {
            event_time_max: Duration::ZERO,
            ..small_config()
        },
        RuntimeConfig {
            instances_max: 0,
            ..small_config()
        },
    ] {
        let Err(error) = Runtime::new(config) else {
            panic!("accepted a bad configuration")
        };
        assert!(matches!(error, Error::Config(_)), "{error}");
    }
    // The shared runtime of the other tests is fine.
    let _ = runtime();
}

#[tokio::test]
async fn an_unloaded_instance_keeps_its_host_and_starts_fresh_at_the_next_event() {
    let mut actor = instance("trap", "idle").await;
    assert_eq!(count(&mut actor).await, "1");
    assert_eq!(count(&mut actor).await, "2");
    recorder(&mut actor).alarm = Some(7);
    assert!(actor.is_loaded());

    actor.unload();
    assert!(!actor.is_loaded());
    // The host survived; the guest's own memory did not.
    assert_eq!(recorder(&mut actor).alarm, Some(7));
    assert_eq!(count(&mut actor).await, "1");
    assert!(actor.is_loaded());
}

#[tokio::test]
async fn an_instance_in_a_reused_slot_starts_from_the_components_image() {
    // One slot: the second actor's instance gets the memory the first one
    // wrote to, reset (partly by memset, see `LINEAR_MEMORY_KEEP_RESIDENT`).
    let (_runtime, component) = trap_in_a_pool_of(1);
    let new =
        |name: &str| component.instantiate(actor_id(name), Box::new(RecordingHost::default()));
    let mut first = new("first").await.expect("first");
    for expected in ["1", "2", "3"] {
        assert_eq!(count(&mut first).await, expected);
    }
    drop(first);
    let mut second = new("second").await.expect("the slot is free again");
    assert_eq!(
        count(&mut second).await,
        "1",
        "the first actor's state leaked"
    );
}
