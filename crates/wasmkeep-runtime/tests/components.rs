//! Loading components: validation with clear errors, the precompiled cache,
//! and switching an instance to a new version.

mod common;

use common::{RecordingHost, actor_id, body_text, get, guest, recorder, runtime, small_config};
use wasmkeep_runtime::{Error, Runtime, RuntimeConfig};

fn cached_runtime(dir: &std::path::Path) -> Runtime {
    Runtime::new(RuntimeConfig {
        cache_dir: Some(dir.to_path_buf()),
        ..small_config()
    })
    .expect("runtime")
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("cache dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_second_runtime_loads_the_precompiled_component_from_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = guest("kitchen-sink");

    let first = cached_runtime(dir.path())
        .load_component(&bytes)
        .expect("compiles");
    assert!(!first.from_cache());
    let files = files_in(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with(first.digest()) && files[0].ends_with(".cwasm"),
        "{files:?}"
    );

    let second = cached_runtime(dir.path())
        .load_component(&bytes)
        .expect("loads");
    assert!(second.from_cache());
    assert_eq!(second.digest(), first.digest());
    let mut actor = second
        .instantiate(actor_id("cached"), Box::new(RecordingHost::default()))
        .await
        .expect("instance");
    let response = actor.handle(get("/identity")).await.expect("event");
    assert_eq!(body_text(&response), "acme/sink/cached");
    assert_eq!(files_in(dir.path()), files, "a hit writes nothing");
}

#[test]
fn the_digest_is_the_sha256_of_the_bytes() {
    let component = runtime().load_component(&guest("trap")).expect("loads");
    assert_eq!(component.digest().len(), 64);
    assert!(component.digest().bytes().all(|b| b.is_ascii_hexdigit()));
    let again = runtime().load_component(&guest("trap")).expect("loads");
    assert_eq!(again.digest(), component.digest());
    let other = runtime().load_component(&guest("spin")).expect("loads");
    assert_ne!(other.digest(), component.digest());
}

/// Loads `bytes` into a runtime with a fresh cache dir; returns the error and
/// asserts nothing was written.
fn refused(bytes: &[u8]) -> Error {
    let dir = tempfile::tempdir().expect("tempdir");
    let Err(error) = cached_runtime(dir.path()).load_component(bytes) else {
        panic!("a bad component was accepted")
    };
    assert_eq!(
        files_in(dir.path()),
        Vec::<String>::new(),
        "nothing cached on error"
    );
    error
}

#[test]
fn random_bytes_are_refused_as_not_webassembly() {
    let error = refused(b"definitely not a component");
    assert!(matches!(error, Error::NotWasm), "{error:?}");
    assert!(
        error.to_string().contains("not a WebAssembly component"),
        "{error}"
    );
}

#[test]
fn a_core_module_is_refused_with_what_to_do() {
    // The smallest valid core module: magic and version 1.
    let error = refused(b"\0asm\x01\0\0\0");
    assert!(matches!(error, Error::CoreModule), "{error:?}");
    assert!(
        error.to_string().contains("core WebAssembly module"),
        "{error}"
    );
    assert!(error.to_string().contains("wasm32-wasip2"), "{error}");
}

#[test]
fn a_truncated_component_is_refused_as_invalid() {
    let bytes = guest("kitchen-sink");
    let error = refused(&bytes[..bytes.len() / 2]);
    assert!(matches!(error, Error::Compile(_)), "{error:?}");
}

#[test]
fn a_component_of_another_world_is_refused_naming_the_missing_exports() {
    let error = refused(&guest("no-exports"));
    let message = error.to_string();
    assert!(matches!(error, Error::WrongWorld(_)), "{error:?}");
    assert!(
        message.contains("`wasmkeep:actor/handler@0.1.0`"),
        "{message}"
    );
    assert!(
        message.contains("`wasmkeep:actor/events@0.1.0`"),
        "{message}"
    );
    assert!(message.contains("it exports `run`"), "{message}");
}

#[test]
fn a_component_importing_what_the_host_lacks_is_refused_naming_the_import() {
    let error = refused(&guest("bad-import"));
    let message = error.to_string();
    assert!(matches!(error, Error::Imports(_)), "{error:?}");
    assert!(message.contains("test:bad-import/missing"), "{message}");
}

#[tokio::test]
async fn set_component_switches_version_at_the_next_event_and_keeps_the_host() {
    let trap = runtime().load_component(&guest("trap")).expect("loads");
    let sink = runtime()
        .load_component(&guest("kitchen-sink"))
        .expect("loads");
    let mut actor = trap
        .instantiate(actor_id("upgraded"), Box::new(RecordingHost::default()))
        .await
        .expect("instance");
    assert_eq!(
        body_text(&actor.handle(get("/count")).await.expect("event")),
        "1"
    );
    recorder(&mut actor).secrets.insert("k".into(), "v".into());

    actor.set_component(sink.clone());
    assert_eq!(actor.component_digest(), sink.digest());
    let response = actor
        .handle(get("/secret?name=k"))
        .await
        .expect("event on the new version");
    assert_eq!(body_text(&response), "v");
    assert_eq!(recorder(&mut actor).calls, vec!["secrets.get k"]);
}
