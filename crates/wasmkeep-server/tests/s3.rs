//! The node against a real S3 server (SeaweedFS, started by wasmkeep-testkit).
//! `WASMKEEP_S3_TESTS=skip` skips it loudly where `weed` is not installed.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, count, free_port};
use wasmkeep_testkit::{SeaweedFs, s3_tests_skipped};

/// Starts `wasmkeep dev` in `dir` on the S3 bucket `bucket` (its server's
/// `env`), on a new port each time.
fn dev_on<'a>(
    dir: &'a std::path::Path,
    bucket: &'a str,
    env: &'a [(String, String)],
) -> impl Fn() -> Server + 'a {
    move || Server::start_with_env(dir, &["dev", "--bucket", bucket], free_port(), env)
}

#[test]
fn counter_survives_restart_and_kill_on_s3() {
    if s3_tests_skipped("counter_survives_restart_and_kill_on_s3") {
        return;
    }
    let s3 = SeaweedFs::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bucket = s3.bucket_url(&format!("node-test-{}", free_port()));
    let env = s3.env();
    let start = dev_on(dir.path(), &bucket, &env);

    let server = start();
    for expected in 1..=20u64 {
        assert_eq!(
            server.req("POST", "/demo/counter/s3/increment").text(),
            expected.to_string()
        );
    }
    assert!(server.stop(), "graceful shutdown exits 0");
    let server = start();
    assert_eq!(
        count(&server, "s3"),
        20,
        "a restart keeps every acknowledged increment"
    );
    for _ in 0..5 {
        assert_eq!(server.req("POST", "/demo/counter/s3/increment").status, 200);
    }
    server.kill();
    let server = start();
    assert_eq!(
        count(&server, "s3"),
        25,
        "kill -9 keeps every acknowledged increment"
    );
}

/// A stopped process (SIGSTOP) that is continued when this is dropped.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: signals our own child process (the test's SeaweedFS).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        // The signal takes hold asynchronously: wait until the kernel shows
        // the process stopped, so no request sent after this reaches it.
        let deadline = std::time::Instant::now() + common::WAIT_MAX;
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if state == Some('T') {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "SeaweedFS did not stop: {stat}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// An S3 server that stops answering (SIGSTOP: connections are accepted,
/// nothing is answered) gets an event waiting on it answered 504
/// `outcome_unknown` (its record was sent: ADR 0062) instead of held until
/// the client gives up; once the server
/// answers again the node serves by itself, and neither then nor after a
/// kill -9 is an acknowledged increment missing (nor is there one more than
/// was attempted). A SIGTERM during a hang stops waiting on the bucket once
/// the node's lease has run out.
#[test]
fn a_write_to_a_hung_s3_server_is_answered_outcome_unknown_and_the_node_recovers() {
    if s3_tests_skipped(
        "a_write_to_a_hung_s3_server_is_answered_outcome_unknown_and_the_node_recovers",
    ) {
        return;
    }
    // Its own server: this test stops it.
    let s3 = SeaweedFs::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bucket = s3.bucket_url("hung");
    let env = s3.env();
    let start = dev_on(dir.path(), &bucket, &env);

    let server = start();
    for expected in 1..=3u64 {
        let r = server.req("POST", "/demo/counter/h/increment");
        assert_eq!((r.status, r.text()), (200, expected.to_string()));
    }
    let (mut acked, mut attempted) = (3, 3);

    let stopped = Stopped::stop(s3.pid());
    // `req` gives up after common::WAIT_MAX (60 s) without an answer.
    let r = server.req("POST", "/demo/counter/h/increment");
    attempted += 1;
    // The record's request was sent and never answered: it may yet apply.
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json_code(), "outcome_unknown", "{}", r.text());
    assert_eq!(r.header("x-wasmkeep-outcome"), Some("unknown"));
    drop(stopped);

    server.wait_until("an increment once the server answers again", |s| {
        attempted += 1;
        s.req("POST", "/demo/counter/h/increment").status == 200
    });
    acked += 1;
    let n = count(&server, "h");
    assert!(
        (acked..=attempted).contains(&n),
        "{n} outside acknowledged {acked} ..= attempted {attempted}"
    );

    // A SIGTERM while the server hangs again: the node's lease runs out,
    // and from then on the shutdown waits on the bucket no more (the
    // actor's release is abandoned, the heartbeat left to expire).
    let stopped = Stopped::stop(s3.pid());
    let log = server.log.clone();
    assert!(server.stop(), "the shutdown exits 0");
    drop(stopped);
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("dropped without release: this node's lease lapsed")
            && logs.contains("the lease had lapsed; its heartbeat expires by itself"),
        "the shutdown waited on the hung server after the lease ran out:\n{logs}"
    );
    let server = start();
    assert_eq!(count(&server, "h"), n, "after that shutdown");
    server.kill();
    let server = start();
    assert_eq!(count(&server, "h"), n, "after a kill -9");
}

/// Wrong credentials: `wasmkeep dev` exits at once with an error that says
/// the server refused the request and what to check, with the server's
/// explanation once (not repeated by the error chain).
#[test]
fn wrong_credentials_fail_the_start_with_one_clear_error() {
    if s3_tests_skipped("wrong_credentials_fail_the_start_with_one_clear_error") {
        return;
    }
    let s3 = SeaweedFs::shared().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bucket = s3.bucket_url(&format!("creds-{}", free_port()));
    let output = std::process::Command::new(common::BIN)
        .args(["dev", "--bucket", &bucket, "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--data-dir")
        .arg(common::data_dir())
        .args(["--guests-dir"])
        .arg(common::guest("counter").parent().unwrap())
        .current_dir(dir.path())
        .envs(s3.env())
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("the S3 server refused the request (check AWS_ACCESS_KEY_ID"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("SignatureDoesNotMatch").count(),
        1,
        "the server's explanation once:\n{stderr}"
    );
}
