//! `wasmkeep new` and `wasmkeep build` (issue 55, ADR 0070): a new project
//! in either language passes its own test, which builds it with `wasmkeep
//! build` and tests it with its language's harness (spawned `wasmkeep dev
//! --test-routes`, ADR 0075); bad names, a
//! folder in use and a folder that is no source tree are refused with
//! nothing written.
//!
//! The Rust project builds for wasm32-wasip2 as the guests do (the
//! suite's guests were built before it runs, so the toolchain is there).
//! The TypeScript project needs npm, the SDK and the harness built
//! (`scripts/build-guests --js`); without them its test is skipped, unless WASMKEEP_REQUIRE_JS=1
//! (CI) makes that a failure.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn wasmkeep(args: &[&str], cwd: &Path) -> Output {
    Command::new(common::BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the project's own test command with this build of wasmkeep.
fn project_test(program: &str, args: &[&str], dir: &Path, target_dir: Option<&Path>) {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .env("WASMKEEP_BIN", common::BIN);
    if let Some(target_dir) = target_dir {
        command.env("CARGO_TARGET_DIR", target_dir);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {}:\n{}",
        dir.display(),
        text(&out)
    );
}

#[test]
fn bad_names_and_used_folders_are_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let sdk = repo();
    let sdk = sdk.to_str().unwrap();
    for (args, says) in [
        (vec!["new", "Bad"], "not a project name"),
        (vec!["new", "a--b"], "not a project name"),
        (vec!["new", "-x"], "unexpected argument"),
        (
            vec!["new", "ok", "--sdk", "/nonexistent"],
            "not a wasmkeep source tree",
        ),
        (vec!["new", "ok", "--lang", "cobol"], "invalid value"),
    ] {
        let out = wasmkeep(&args, dir.path());
        assert!(
            !out.status.success() && text(&out).contains(says),
            "{args:?}: {}",
            text(&out)
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    std::fs::create_dir(dir.path().join("used")).unwrap();
    std::fs::write(dir.path().join("used/keep.txt"), "mine").unwrap();
    let out = wasmkeep(&["new", "used", "--sdk", sdk, "--lang", "ts"], dir.path());
    assert!(
        !out.status.success() && text(&out).contains("not empty"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("used")).unwrap().count(),
        1
    );

    let out = wasmkeep(&["build", "used"], dir.path());
    assert!(
        !out.status.success() && text(&out).contains("not an actor project"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_new_rust_project_passes_its_own_test() {
    let dir = tempfile::tempdir().unwrap();
    let out = wasmkeep(&["new", "hello-rs"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("hello-rs");
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("name = \"hello-rs\"") && manifest.contains("crates/wasmkeep-sdk"),
        "{manifest}"
    );
    // The guests' target directory: the standard library built for
    // wasm32-wasip2 with the same profile is already there.
    let target = repo().join("examples/target");
    project_test("cargo", &["test", "--quiet"], &project, Some(&target));
    assert!(project.join("hello-rs.wasm").is_file());
}

#[test]
fn a_new_typescript_project_passes_its_own_test() {
    // The SDK and the test harness the project links.
    for sdk in [repo().join("sdk/js"), repo().join("sdk/test")] {
        let ready = sdk.join("dist").is_dir() && sdk.join("node_modules").is_dir();
        if !ready {
            assert!(
                std::env::var("WASMKEEP_REQUIRE_JS").as_deref() != Ok("1"),
                "{} is not built: run scripts/build-guests --js",
                sdk.display()
            );
            eprintln!(
                "SKIPPED: {} is not built (scripts/build-guests --js)",
                sdk.display()
            );
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = wasmkeep(&["new", "hello-ts", "--lang", "ts"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("hello-ts");
    project_test(
        "npm",
        &["install", "--no-audit", "--no-fund", "--offline"],
        &project,
        None,
    );
    project_test("npm", &["test"], &project, None);
    assert!(project.join("hello-ts.wasm").is_file());
}

/// `wasmkeep dev --watch DIR` (ADR 0070): the project is built and served;
/// a saved change is built and deployed, and the actor answers the new
/// route; a change that does not build is shown, and the last version
/// keeps serving.
#[test]
fn dev_watch_builds_and_deploys_each_change() {
    use std::io::{BufRead as _, BufReader};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let out = wasmkeep(&["new", "watched"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let project = dir.path().join("watched");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = Command::new(common::BIN)
        .args([
            "dev",
            "--listen",
            &addr,
            "--console",
            "off",
            "--heartbeat",
            "200ms",
        ])
        .arg(format!(
            "--bucket=file://{}",
            dir.path().join("bucket").display()
        ))
        .arg(format!(
            "--data-dir={}",
            dir.path().join("scratch").display()
        ))
        .arg("--watch")
        .arg(&project)
        .env("CARGO_TARGET_DIR", repo().join("examples/target"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let stderr = node.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_line = |says: &str| {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(says) => return,
                Ok(_) => {}
                Err(_) => panic!("the node never said {says:?}"),
            }
        }
    };
    let ask = |method: &str, path: &str| {
        let r = common::request(&addr, method, &format!("/demo/watched/w{path}"), &[], b"");
        (r.status, r.text())
    };
    wait_line("wasmkeep: serving on");
    assert_eq!(ask("POST", "/increment"), (200, "1".to_owned()));
    assert_eq!(ask("GET", "/hello").0, 404);

    // A saved change: built, deployed, served from the next heartbeat.
    let source = project.join("src/lib.rs");
    let original = std::fs::read_to_string(&source).unwrap();
    let changed = original.replace(
        ".get(\"/value\", Counter::value);",
        ".get(\"/value\", Counter::value)\n            .get(\"/hello\", |_, _, _| \"hello\");",
    );
    assert_ne!(changed, original, "the template changed: update this test");
    std::fs::write(&source, &changed).unwrap();
    wait_line("wasmkeep dev: deployed watched");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ask("GET", "/hello") != (200, "hello".to_owned()) {
        assert!(Instant::now() < deadline, "the new version never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        ask("GET", "/value"),
        (200, "1".to_owned()),
        "the data stayed"
    );

    // A change that does not build: shown, and the last version serves.
    std::fs::write(&source, format!("{changed}\nthis is not Rust\n")).unwrap();
    wait_line("the build of");
    assert_eq!(ask("GET", "/hello"), (200, "hello".to_owned()));
    assert_eq!(ask("POST", "/increment"), (200, "2".to_owned()));
    let _ = node.kill();
    let _ = node.wait();
}
