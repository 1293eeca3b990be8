//! App secrets end to end (ADR 0016): the `wasmkeep secret` commands, a node
//! with and without the app's identity, a guest reading secrets, and a scan
//! of the bucket and the logs for any value in clear.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{BIN, Server, failed, folder_bucket, guest, ok};

/// Runs `wasmkeep <args>` with `stdin` as its standard input.
fn wasmkeep(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that refuses early may close stdin before reading it.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn keygen(dir: &Path, app: &str, file: &str) -> PathBuf {
    let bucket = folder_bucket(dir);
    let path = dir.join(file);
    let out = ok(&wasmkeep(
        dir,
        &[
            "secret",
            "keygen",
            "--bucket",
            &bucket,
            "--app",
            app,
            "--identity-file",
            path.to_str().unwrap(),
        ],
        b"",
    ));
    assert!(
        out.trim().starts_with("age1"),
        "prints the recipient: {out}"
    );
    path
}

fn set(dir: &Path, app: &str, name: &str, value: &str) {
    let bucket = folder_bucket(dir);
    let out = wasmkeep(
        dir,
        &["secret", "set", name, "--bucket", &bucket, "--app", app],
        format!("{value}\n").as_bytes(),
    );
    ok(&out);
    assert!(!contains(&out.stdout, value) && !contains(&out.stderr, value));
}

fn list(dir: &Path, app: &str) -> String {
    let bucket = folder_bucket(dir);
    ok(&wasmkeep(
        dir,
        &["secret", "list", "--bucket", &bucket, "--app", app],
        b"",
    ))
}

fn node(dir: &Path, app: &str, identity: Option<&Path>) -> Server {
    let bucket = folder_bucket(dir);
    let ks = format!("ks={}", guest("kitchen-sink").display());
    let counter = format!("counter={}", guest("counter").display());
    let mut args = vec![
        "dev",
        "--bucket",
        bucket.as_str(),
        "--app",
        app,
        "--heartbeat",
        "200ms",
        ks.as_str(),
        counter.as_str(),
    ];
    if let Some(identity) = identity {
        args.extend(["--secrets-identity", identity.to_str().unwrap()]);
    }
    Server::start(dir, &args)
}

/// Heartbeat line 10 of node `dev` of `app`, read from the folder bucket
/// (through the backend: a node alone on its folder keeps young objects in
/// its journal, and this open makes it write them out, ADR 0034).
fn heartbeat_secrets_line(dir: &Path, app: &str) -> String {
    use wasmkeep_bucket::Bucket as _;
    let bucket = wasmkeep_bucket::FolderBucket::open(&dir.join("bucket")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let object = runtime
        .block_on(bucket.get(&format!("apps/{app}/nodes/dev")))
        .unwrap();
    let text = String::from_utf8(object.bytes.to_vec()).unwrap();
    text.lines().nth(9).unwrap_or_default().to_owned()
}

fn secret(server: &Server, name: &str) -> (u16, String) {
    let r = server.req("GET", &format!("/t/ks/reader/secret?name={name}"));
    (r.status, r.text())
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// The objects of a folder bucket: its files without the backend's own
/// (`.wal` journals come and go with the processes that open it).
fn objects(bucket_dir: &Path) -> Vec<PathBuf> {
    let own = [".wal", ".locks", ".tmp"].map(|d| bucket_dir.join(d));
    files(bucket_dir)
        .into_iter()
        .filter(|p| !own.iter().any(|d| p.starts_with(d)))
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn secrets_round_trip_through_a_guest_and_nothing_secret_is_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let first = "first-value-3f9a1c";
    let second = "second-value-77b2e0";
    let identity = keygen(dir.path(), "default", "identity.txt");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&identity).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the identity is private");
    }
    set(dir.path(), "default", "db_password", first);
    assert_eq!(list(dir.path(), "default"), "db_password\n");

    let server = node(dir.path(), "default", Some(&identity));
    assert_eq!(heartbeat_secrets_line(dir.path(), "default"), "yes");
    assert_eq!(
        secret(&server, "db_password"),
        (200, first.to_owned()),
        "the trailing newline from stdin is dropped"
    );
    assert_eq!(secret(&server, "absent").0, 404);

    // A change reaches guests at the next refresh, without a restart.
    set(dir.path(), "default", "db_password", second);
    server.wait_until("the changed secret", |s| {
        secret(s, "db_password") == (200, second.to_owned())
    });
    let bucket = folder_bucket(dir.path());
    ok(&wasmkeep(
        dir.path(),
        &["secret", "rm", "db_password", "--bucket", &bucket],
        b"",
    ));
    server.wait_until("the removed secret", |s| secret(s, "db_password").0 == 404);
    let removed_again = failed(&wasmkeep(
        dir.path(),
        &["secret", "rm", "db_password", "--bucket", &bucket],
        b"",
    ));
    assert!(
        removed_again.contains("no secret db_password"),
        "{removed_again}"
    );
    set(dir.path(), "default", "api_key", first);
    server.wait_until("the new secret", |s| {
        secret(s, "api_key") == (200, first.to_owned())
    });
    assert!(server.stop());

    // Neither value is in clear anywhere in the bucket, nor in any log.
    let bucket_files = files(&dir.path().join("bucket"));
    assert!(bucket_files.len() > 3, "the scan sees the bucket");
    for path in bucket_files.iter().chain(
        files(dir.path())
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "out")),
    ) {
        let bytes = std::fs::read(path).unwrap();
        for value in [first, second] {
            assert!(
                !contains(&bytes, value),
                "{} holds a secret value in clear",
                path.display()
            );
        }
    }
}

#[test]
fn a_node_without_the_identity_says_no_and_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    keygen(dir.path(), "default", "identity.txt");
    set(dir.path(), "default", "token", "not-for-this-node");
    let server = node(dir.path(), "default", None);
    assert_eq!(heartbeat_secrets_line(dir.path(), "default"), "no");
    assert_eq!(secret(&server, "token").0, 404);
}

#[test]
fn a_wrong_or_broken_identity_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    keygen(dir.path(), "default", "identity.txt");
    // An identity made for another app does not open this app's secrets.
    let other = keygen(dir.path(), "other", "other.txt");
    let broken = dir.path().join("broken.txt");
    std::fs::write(&broken, "AGE-SECRET-KEY-1NOTAKEY\n").unwrap();
    let bucket = folder_bucket(dir.path());
    let ks = format!("ks={}", guest("kitchen-sink").display());
    for (identity, expected) in [
        (&other, "does not match the app's recipient"),
        (&broken, "not an age X25519 identity"),
        (&dir.path().join("missing.txt"), "cannot read"),
    ] {
        let port = common::free_port().to_string();
        let listen = format!("127.0.0.1:{port}");
        let out = wasmkeep(
            dir.path(),
            &[
                "dev",
                "--bucket",
                &bucket,
                "--listen",
                &listen,
                "--data-dir",
                common::data_dir().to_str().unwrap(),
                "--secrets-identity",
                identity.to_str().unwrap(),
                &ks,
            ],
            b"",
        );
        let stderr = failed(&out);
        assert!(stderr.contains(expected), "{expected:?} in:\n{stderr}");
    }
}

#[test]
fn a_value_on_the_command_line_and_bad_names_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = folder_bucket(dir.path());
    let identity = dir.path().join("identity.txt");
    // A malformed app name: no identity file, nothing in the bucket.
    let bad_app = failed(&wasmkeep(
        dir.path(),
        &[
            "secret",
            "keygen",
            "--bucket",
            &bucket,
            "--app",
            "Bad App!",
            "--identity-file",
            identity.to_str().unwrap(),
        ],
        b"",
    ));
    assert!(bad_app.contains("invalid"), "{bad_app}");
    assert!(!identity.exists());
    keygen(dir.path(), "default", "identity.txt");
    let before = objects(&dir.path().join("bucket")).len();

    let on_argv = failed(&wasmkeep(
        dir.path(),
        &[
            "secret",
            "set",
            "db",
            "hunter2-on-argv",
            "--bucket",
            &bucket,
        ],
        b"",
    ));
    assert!(
        on_argv.contains("pass the value on stdin or with --file"),
        "{on_argv}"
    );
    for bad in ["a/b", "..", "", "sp ace"] {
        let e = failed(&wasmkeep(
            dir.path(),
            &["secret", "set", bad, "--bucket", &bucket],
            b"value",
        ));
        assert!(e.contains("invalid secret name"), "{bad:?}: {e}");
    }
    let bad_app = failed(&wasmkeep(
        dir.path(),
        &[
            "secret", "set", "db", "--bucket", &bucket, "--app", "Bad/App",
        ],
        b"value",
    ));
    assert!(bad_app.contains("invalid"), "{bad_app}");
    let empty = failed(&wasmkeep(
        dir.path(),
        &["secret", "set", "db", "--bucket", &bucket],
        b"",
    ));
    assert!(empty.contains("empty"), "{empty}");
    assert_eq!(list(dir.path(), "default"), "");
    assert_eq!(objects(&dir.path().join("bucket")).len(), before);

    // A second keygen would make every secret unreadable: refused without
    // --force, and an existing identity file is never overwritten.
    let again = failed(&wasmkeep(
        dir.path(),
        &[
            "secret",
            "keygen",
            "--bucket",
            &bucket,
            "--identity-file",
            dir.path().join("second.txt").to_str().unwrap(),
        ],
        b"",
    ));
    assert!(again.contains("--force"), "{again}");
    assert!(!dir.path().join("second.txt").exists());
    let kept = std::fs::read(&identity).unwrap();
    let overwrite = failed(&wasmkeep(
        dir.path(),
        &[
            "secret",
            "keygen",
            "--force",
            "--bucket",
            &bucket,
            "--identity-file",
            identity.to_str().unwrap(),
        ],
        b"",
    ));
    assert!(overwrite.contains("exists"), "{overwrite}");
    assert_eq!(std::fs::read(&identity).unwrap(), kept);
}

#[test]
fn two_apps_on_one_bucket_do_not_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let id_a = keygen(dir.path(), "alpha", "alpha.txt");
    let id_b = keygen(dir.path(), "beta", "beta.txt");
    set(dir.path(), "alpha", "shared_name", "alpha-value");
    // A value no log line holds by chance: `set` checks the output for it,
    // and the folder's path (a random temporary name) is in the log.
    set(dir.path(), "alpha", "only_alpha", "only-alpha-value");
    set(dir.path(), "beta", "shared_name", "beta-value");
    assert_eq!(list(dir.path(), "alpha"), "only_alpha\nshared_name\n");
    assert_eq!(list(dir.path(), "beta"), "shared_name\n");

    let a = node(dir.path(), "alpha", Some(&id_a));
    let b = node(dir.path(), "beta", Some(&id_b));
    assert_eq!(secret(&a, "shared_name"), (200, "alpha-value".to_owned()));
    assert_eq!(secret(&b, "shared_name"), (200, "beta-value".to_owned()));
    assert_eq!(secret(&b, "only_alpha").0, 404);

    // The same actor id in two apps is two actors.
    for _ in 0..3 {
        assert_eq!(a.req("POST", "/t/counter/same/increment").status, 200);
    }
    assert_eq!(a.req("GET", "/t/counter/same/value").text().trim(), "3");
    assert_eq!(b.req("GET", "/t/counter/same/value").text().trim(), "0");
}
