//! The console in a real browser: Debian's headless Chromium, driven
//! through chromedriver (WebDriver) by fantoccini. Without chromedriver the
//! test says so and passes, unless WASMKEEP_REQUIRE_BROWSER=1 (CI), which
//! makes a missing browser a failure. A screenshot of each page is kept in
//! WASMKEEP_ARTIFACTS (default `target/artifacts`) under `console/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use super::super::common::{BIN, WAIT_MAX, folder_bucket, free_port};
use super::{dev, token_file};

/// The WebDriver Enter key.
const ENTER: &str = "\u{E007}";

fn find_program(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

fn artifacts_dir() -> PathBuf {
    let dir = std::env::var_os("WASMKEEP_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/artifacts"))
        .join("console");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// chromedriver on a free loopback port; killed (by its id) when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(program: &Path, log: &Path) -> Driver {
        let port = free_port();
        let child = Command::new(program)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        // Made first, so that a failure below still ends the process.
        let driver = Driver {
            child,
            url: format!("http://{addr}"),
        };
        // It listens once it is ready for sessions (it keeps connections
        // open after answering, so a request would wait on it).
        let deadline = Instant::now() + WAIT_MAX;
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver never listened on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, chromium: Option<&Path>, profile: &Path) -> Client {
    let mut options = serde_json::json!({
        "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,900",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    if let Some(binary) = chromium {
        options["binary"] = binary.display().to_string().into();
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

/// Waits until the element's text contains `expected` (the page draws
/// after its API answers).
async fn wait_text(client: &Client, css: &str, expected: &str) -> String {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let text = match client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains(expected) {
            return text;
        }
        let status = match client.find(Locator::Id("status")).await {
            Ok(line) => line.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        assert!(
            Instant::now() < deadline,
            "{css} never showed {expected:?}; it shows {text:?}; status line {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `locator` finds.
async fn click(client: &Client, locator: Locator<'_>) {
    client
        .find(locator)
        .await
        .expect("the element")
        .click()
        .await
        .expect("a click");
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(artifacts_dir().join(format!("{name}.png")), png).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_finds_an_actor_runs_a_query_and_follows_a_move_in_chromium() {
    let Some(chromedriver) = find_program("WASMKEEP_CHROMEDRIVER", "chromedriver") else {
        assert!(
            std::env::var("WASMKEEP_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "chromedriver is missing (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipping: no chromedriver (apt-get install chromium chromium-driver)");
        return;
    };
    let chromium = find_program("WASMKEEP_CHROMIUM", "chromium");
    let dir = tempfile::tempdir().unwrap();
    let token = "console-test-token-0123456789";
    let file = token_file(dir.path(), token);
    let server = dev(dir.path(), &["--console-token-file", &file]);
    for actor in ["alice", "alice", "alice", "bob"] {
        server.req("POST", &format!("/demo/counter/{actor}/increment"));
    }
    // A move to a node that has no heartbeat waits, and says why.
    let out = Command::new(BIN)
        .args(["actor", "move", "demo/counter/alice", "--to", "elsewhere"])
        .args(["--bucket", &folder_bucket(dir.path())])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let driver = Driver::start(&chromedriver, &dir.path().join("chromedriver.log"));
    let client = browser(&driver, chromium.as_deref(), &dir.path().join("profile")).await;
    let base = format!("http://{}/_wasmkeep/console", server.addr);

    // The token is asked for, and a wrong one is refused.
    client.goto(&base).await.unwrap();
    let input = client
        .wait()
        .for_element(Locator::Id("token-input"))
        .await
        .unwrap();
    screenshot(&client, "sign-in").await;
    input
        .send_keys(&format!("not-the-token{ENTER}"))
        .await
        .unwrap();
    wait_text(&client, "#status", "That token was refused").await;
    let input = client
        .wait()
        .for_element(Locator::Id("token-input"))
        .await
        .unwrap();
    input.send_keys(&format!("{token}{ENTER}")).await.unwrap();

    // Nodes, then classes.
    let nodes = wait_text(&client, "#nodes-table", "serving").await;
    assert!(nodes.contains("dev"), "{nodes}");
    screenshot(&client, "nodes").await;
    click(&client, Locator::LinkText("Classes")).await;
    wait_text(&client, "#classes-table", "counter").await;
    screenshot(&client, "classes").await;

    // Actors: found by search, with the keyboard.
    click(&client, Locator::LinkText("Actors")).await;
    let search = client
        .wait()
        .for_element(Locator::Id("search-prefix"))
        .await
        .unwrap();
    search
        .send_keys(&format!("demo/counter/al{ENTER}"))
        .await
        .unwrap();
    let found = wait_text(&client, "#actors-table", "starting with demo/counter/al").await;
    assert!(
        found.contains("demo/counter/alice") && !found.contains("bob"),
        "{found}"
    );
    screenshot(&client, "actors").await;

    // One actor: its table's rows, then a statement.
    click(&client, Locator::LinkText("demo/counter/alice")).await;
    wait_text(&client, "#tables-table", "counter").await;
    click(&client, Locator::LinkText("counter")).await;
    wait_text(&client, "#rows-table", "3").await;
    let sql = client
        .wait()
        .for_element(Locator::Id("sql-input"))
        .await
        .unwrap();
    sql.send_keys("SELECT n, n * 10 AS tenfold FROM counter")
        .await
        .unwrap();
    click(&client, Locator::Id("sql-run")).await;
    let result = wait_text(&client, "#sql-table", "tenfold").await;
    assert!(result.contains("30"), "{result}");
    screenshot(&client, "actor").await;
    sql.clear().await.unwrap();
    sql.send_keys("DELETE FROM counter").await.unwrap();
    click(&client, Locator::Id("sql-run")).await;
    wait_text(&client, "#sql-error", "read-only").await;

    // The move started from the command line, with its progress.
    click(&client, Locator::LinkText("Moves and drains")).await;
    let moves = wait_text(&client, "#moves-table", "demo/counter/alice").await;
    assert!(
        moves.contains("elsewhere") && moves.contains("has no heartbeat"),
        "{moves}"
    );
    screenshot(&client, "operations").await;
    client.close().await.unwrap();
    drop(driver);

    assert_eq!(
        server.req("GET", "/demo/counter/alice/value").text(),
        "3",
        "the refused statement changed nothing"
    );
    eprintln!("screenshots in {}", artifacts_dir().display());
}
