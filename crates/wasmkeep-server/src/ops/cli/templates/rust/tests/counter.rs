//! The actor on a real node: builds it (`wasmkeep build`), serves it with
//! `wasmkeep dev` on a free loopback port and a new folder bucket,
//! and asks it over HTTP. Finds `wasmkeep` on PATH, or in $WASMKEEP.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn wasmkeep() -> String {
    std::env::var("WASMKEEP").unwrap_or_else(|_| "wasmkeep".to_owned())
}

/// A `wasmkeep dev` node, stopped when dropped.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request; the status and the body.
fn send(addr: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[test]
fn increments_are_counted() {
    let dir: PathBuf = env!("CARGO_MANIFEST_DIR").into();
    let built = Command::new(wasmkeep())
        .args(["build", dir.to_str().expect("a UTF-8 path")])
        .status()
        .expect("wasmkeep runs (put it on PATH, or set WASMKEEP)");
    assert!(built.success(), "wasmkeep build failed");
    let component = dir.join("{{name}}.wasm");

    let data = std::env::temp_dir().join(format!("{{name}}-test-{}", std::process::id()));
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _node = Node(
        Command::new(wasmkeep())
            .arg("dev")
            .args(["--listen", &addr, "--console", "off"])
            .arg(format!("--bucket=file://{}", data.join("bucket").display()))
            // The compiled component is cached there from one run to the next.
            .arg(format!("--data-dir={}", dir.join(".wasmkeep").display()))
            .arg(format!("{{name}}={}", component.display()))
            .stdout(Stdio::null())
            .spawn()
            .expect("wasmkeep dev starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(send(&addr, "GET", "/_wasmkeep/health"), Ok((200, _))) {
        assert!(Instant::now() < deadline, "the node did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    let actor = "/demo/{{name}}/first";
    assert_eq!(send(&addr, "GET", &format!("{actor}/value")).unwrap(), (200, "0".into()));
    assert_eq!(send(&addr, "POST", &format!("{actor}/increment")).unwrap(), (200, "1".into()));
    assert_eq!(send(&addr, "POST", &format!("{actor}/increment")).unwrap(), (200, "2".into()));
    assert_eq!(send(&addr, "GET", &format!("{actor}/value")).unwrap(), (200, "2".into()));
    let _ = std::fs::remove_dir_all(&data);
}
