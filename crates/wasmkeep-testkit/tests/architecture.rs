//! The architecture's invariants (ARCHITECTURE.md) as tests, read from the
//! workspace's source the way rust-analyzer's tidy does: each test names a
//! rule, scans the files it governs, and fails listing every place that
//! breaks it. Text, not types: a rule that a parser would check better is
//! still worth a line scan that a newcomer can read in a minute.
//!
//! "Non-test source" is every `.rs` file under a crate's `src/` (and
//! `sim/src/`), up to its first `#[cfg(test)]` line; `tests/`, `benches/`
//! and `examples/` are test source. A `templates/` folder holds the source
//! of other projects (what `wasmkeep new` writes, ADR 0070), built there
//! and not here: no rule governs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest non-test source file, in lines.
const SOURCE_FILE_LINES_MAX: usize = 1_000;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// Every `.rs` file under `dir`, sorted (build output skipped), but test
/// modules kept in files of their own (`tests.rs`) and test support
/// (`testing.rs`).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    every_rust_file(dir)
        .into_iter()
        .filter(|path| !path.ends_with("tests.rs") && !path.ends_with("testing.rs"))
        .collect()
}

/// The crates' `src/` folders: (crate folder name, path).
fn source_dirs() -> Vec<(String, PathBuf)> {
    let root = workspace();
    let mut dirs: Vec<(String, PathBuf)> = std::fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| {
            let name = p
                .file_name()
                .expect("a crate folder has a name")
                .to_string_lossy()
                .into_owned();
            (name, p.join("src"))
        })
        .collect();
    dirs.push(("sim".into(), root.join("sim/src")));
    dirs.sort();
    dirs
}

/// A file's non-test lines (up to its first `#[cfg(test)]`), numbered
/// from 1, with `//` comments removed.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).expect("a readable source file");
    text.lines()
        .enumerate()
        .take_while(|(_, line)| line.trim() != "#[cfg(test)]")
        .map(|(i, line)| {
            // A `//` inside a string ("http://") is kept: the comment starts
            // at the first one with balanced quotes before it.
            let code = line
                .match_indices("//")
                .find(|(at, _)| line[..*at].matches('"').count() % 2 == 0)
                .map_or(line, |(at, _)| &line[..at]);
            (i + 1, code.to_owned())
        })
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Fails listing `broken` under `rule`, if any.
fn check(rule: &str, broken: Vec<String>) {
    assert!(
        broken.is_empty(),
        "{rule}; broken at:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn only_the_runtime_crate_names_wasmtime() {
    let mut broken = Vec::new();
    for (name, src) in source_dirs() {
        if name == "wasmkeep-runtime" {
            continue;
        }
        for file in rust_files(&src) {
            for (n, line) in code_lines(&file) {
                if line.contains("wasmtime::") || line.contains("wasmtime_wasi") {
                    broken.push(format!("{}:{n}: {}", relative(&file), line.trim()));
                }
            }
        }
        let manifest = src.parent().expect("src/ has a parent").join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).expect("a readable manifest");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("wasmtime") {
                broken.push(format!(
                    "{}:{}: {}",
                    relative(&manifest),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    check("only wasmkeep-runtime may use wasmtime", broken);
}

/// The segments of bucket keys (`wasmkeep_types::keys`): a string literal
/// holding one, outside the types crate, builds a key by hand.
const KEY_SEGMENTS: [&str; 12] = [
    "\"apps/", "control/", "nodes/", "owners/", "actors/", "/log/", "/snap/", "alarms/",
    "classes/", "secrets/", "tenants/", "/tokens/",
];

#[test]
fn only_the_types_crate_builds_bucket_keys() {
    let mut broken = Vec::new();
    for (name, src) in source_dirs() {
        // The types crate builds the keys; the testkit and the harness are
        // test support (the harness's `format!`s are paths of a node's
        // test routes, not keys).
        if matches!(
            name.as_str(),
            "wasmkeep-types" | "wasmkeep-testkit" | "wasmkeep-test"
        ) {
            continue;
        }
        for file in rust_files(&src) {
            for (n, line) in code_lines(&file) {
                let in_string = |segment: &str| {
                    line.match_indices(segment).any(|(at, _)| {
                        line[..at].matches('"').count() % 2 == 1 || segment.starts_with('"')
                    })
                };
                // Log and error texts may name a key's shape in words
                // (`tracing::`, `format!` of a message): a key is a literal
                // passed to a bucket call or joined with `format!`.
                // Reading a key's kind (`key.contains("/log/")`) is
                // parsing; building is joining text into a key.
                let joins = line.contains("format!(")
                    || line.contains("push_str(")
                    || line.contains("concat!(")
                    || line.contains("\"apps/");
                let builds = joins
                    && KEY_SEGMENTS.iter().any(|s| in_string(s))
                    && !line.contains("tracing::");
                if builds {
                    broken.push(format!("{}:{n}: {}", relative(&file), line.trim()));
                }
            }
        }
    }
    check("every bucket key is built in wasmkeep_types::keys", broken);
}

/// What builds an HTTP client, a TLS configuration, or a TLS connection.
const CLIENT_BUILDERS: [&str; 7] = [
    "ClientConfig::builder",
    "ServerConfig::builder",
    "Client::builder",
    "client::conn::",
    "HttpsConnectorBuilder",
    "TlsConnector::from",
    "TcpStream::connect",
];

#[test]
fn only_the_transport_crate_builds_http_clients_and_tls_configs() {
    let mut broken = Vec::new();
    for (name, src) in source_dirs() {
        // The testkit and the harness are test support: the harness's
        // spawned mode is a client of one node on loopback, no peer.
        if matches!(
            name.as_str(),
            "wasmkeep-transport" | "wasmkeep-testkit" | "wasmkeep-test"
        ) {
            continue;
        }
        for file in rust_files(&src) {
            for (n, line) in code_lines(&file) {
                if CLIENT_BUILDERS.iter().any(|b| line.contains(b)) {
                    broken.push(format!("{}:{n}: {}", relative(&file), line.trim()));
                }
            }
        }
    }
    check(
        "only wasmkeep-transport builds HTTP clients, TLS configurations and connections to peers",
        broken,
    );
}

#[test]
fn no_non_test_source_file_is_over_a_thousand_lines() {
    let mut broken = Vec::new();
    for (_, src) in source_dirs() {
        for file in rust_files(&src) {
            let lines = code_lines(&file).len();
            if lines > SOURCE_FILE_LINES_MAX {
                broken.push(format!("{}: {lines} lines", relative(&file)));
            }
        }
    }
    check(
        &format!("no non-test source file is over {SOURCE_FILE_LINES_MAX} lines"),
        broken,
    );
}

#[test]
fn the_actor_part_of_the_server_never_imports_peering() {
    let actor = workspace().join("crates/wasmkeep-server/src/actor");
    let files = rust_files(&actor);
    assert!(!files.is_empty(), "the server has an actor/ folder");
    let mut broken = Vec::new();
    for file in files {
        for (n, line) in code_lines(&file) {
            if line.contains("peering::") || line.contains("peering::{") {
                broken.push(format!("{}:{n}: {}", relative(&file), line.trim()));
            }
        }
    }
    check(
        "actor/ never imports peering/ (moves and deletes reach a mailbox through actor/'s job variants)",
        broken,
    );
}

/// Where `Bucket` may be implemented directly (file, type): the three
/// backends, and the bucket crate's implementation for every `Around`.
/// A new backend is added here.
const BUCKET_IMPLEMENTORS: [(&str, &str); 4] = [
    ("crates/wasmkeep-bucket/src/memory.rs", "MemoryBucket"),
    ("crates/wasmkeep-bucket/src/folder/mod.rs", "FolderBucket"),
    ("crates/wasmkeep-bucket/src/s3.rs", "S3Bucket"),
    ("crates/wasmkeep-bucket/src/around.rs", "W"),
];

/// The type a line implements `Bucket` for (`impl Bucket for X`, `impl
/// wasmkeep_bucket::Bucket for X`, `impl<W: Around> Bucket for W`).
fn bucket_implementor(line: &str) -> Option<&str> {
    let line = line.trim_start();
    if !line.starts_with("impl") {
        return None;
    }
    let (before, after) = line.split_once(" for ")?;
    let trait_path = before.rsplit(' ').next()?;
    if trait_path != "Bucket" && !trait_path.ends_with("::Bucket") {
        return None;
    }
    after.split([' ', '{', '<']).next()
}

/// Every `.rs` file under `dir`, test source and test support included,
/// sorted (build output skipped).
fn every_rust_file(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a readable directory entry").path();
            if path.is_dir() {
                if !path.ends_with("target") && !path.ends_with("templates") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A bucket that wraps another implements `Around`, which passes the
/// bucket's hints on through its hook (ADR 0057). One that implemented
/// `Bucket` by hand would compile and work, and silently take the hints
/// away from the bucket inside (the folder's unhurried snapshots, its lone
/// writer's puts, compaction's bulk deletes). Test source counts too: a
/// test's wrapper that dropped them would test another path than
/// production's.
#[test]
fn only_the_backends_implement_bucket_and_every_wrapper_is_around() {
    let root = workspace();
    let mut files = every_rust_file(&root.join("crates"));
    files.extend(every_rust_file(&root.join("sim")));
    let mut found = Vec::new();
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            let Some(implementor) = bucket_implementor(line) else {
                continue;
            };
            let at = relative(&file);
            if BUCKET_IMPLEMENTORS.contains(&(at.as_str(), implementor)) {
                found.push(at);
            } else {
                broken.push(format!("{at}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    check(
        "only the backends implement Bucket; a wrapper implements wasmkeep_bucket::Around",
        broken,
    );
    assert_eq!(
        found.len(),
        BUCKET_IMPLEMENTORS.len(),
        "the scan finds every backend: {found:?}"
    );
}

/// The modules named in `text` by `crate::` and `super::` paths (for the
/// module `module`), resolved to the longest module of `modules` that
/// prefixes each path, and the module's own children named by a path of
/// their own (`child::Item`).
fn imports(module: &str, text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let resolve = |path: &str| -> Option<String> {
        let segments: Vec<&str> = path.split("::").collect();
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|candidate| modules.contains(candidate))
    };
    let lower_path = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == ':')
            .collect::<String>()
            .trim_end_matches(':')
            .to_owned()
    };
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::b, c};`: each item of the group.
            let group = &group[..group.find("};").unwrap_or(group.len())];
            for item in group.split([',', '{']) {
                found.extend(resolve(&lower_path(item.trim())));
            }
        } else {
            found.extend(resolve(&lower_path(rest)));
        }
    }
    for (at, _) in text.match_indices("super::") {
        let path = lower_path(&text[at + "super::".len()..]);
        let full = if parent.is_empty() {
            path
        } else {
            format!("{parent}::{path}")
        };
        found.extend(resolve(&full));
    }
    // A parent names its own child modules without a prefix
    // (`drain::Drain` in `peering/mod.rs`).
    for child in modules.iter().filter_map(|m| {
        m.strip_prefix(module)
            .and_then(|rest| rest.strip_prefix("::"))
            .filter(|rest| !rest.contains("::"))
    }) {
        let named = text.match_indices(&format!("{child}::")).any(|(at, _)| {
            !text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        });
        if named {
            found.insert(format!("{module}::{child}"));
        }
    }
    found.remove(module);
    found
}

/// The groups of modules that import each other in a cycle (strongly
/// connected components of more than one module), each sorted.
fn import_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(at) = stack.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for (module, from_here) in &reachable {
        if cycles.iter().any(|c| c.contains(module)) {
            continue;
        }
        let cycle: Vec<String> = from_here
            .iter()
            .filter(|other| reachable.get(other).is_some_and(|r| r.contains(*module)))
            .cloned()
            .collect();
        if cycle.len() > 1 {
            cycles.push(cycle);
        }
    }
    cycles
}

#[test]
fn the_servers_modules_import_each_other_without_a_cycle() {
    let src = workspace().join("crates/wasmkeep-server/src");
    let mut texts = BTreeMap::new();
    for file in rust_files(&src) {
        let relative = file
            .strip_prefix(&src)
            .expect("under src/")
            .with_extension("")
            .display()
            .to_string();
        let module = relative.trim_end_matches("/mod").replace('/', "::");
        if module == "lib" || module == "main" {
            continue;
        }
        let text: Vec<String> = code_lines(&file).into_iter().map(|(_, l)| l).collect();
        texts.insert(module, text.join("\n"));
    }
    assert!(texts.contains_key("node"), "the server has a node module");
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let graph: BTreeMap<String, BTreeSet<String>> = texts
        .iter()
        .map(|(m, text)| (m.clone(), imports(m, text, &modules)))
        .collect();
    let broken = import_cycles(&graph)
        .into_iter()
        .map(|cycle| cycle.join(" <-> "))
        .collect();
    check(
        "the server's modules import each other without a cycle (a part's handle never imports the node; the node's glue is imported by nobody)",
        broken,
    );
}

/// The rules' scans find what they look for: each check, run on a line
/// that breaks it, reports it (so a rule that matches nothing cannot pass
/// by accident).
#[test]
fn each_rule_catches_a_line_that_breaks_it() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let file = dir.path().join("broken.rs");
    std::fs::write(
        &file,
        "use wasmtime::Engine;\nlet k = format!(\"{}owners/{}\", root, a);\nlet c = rustls::ClientConfig::builder();\nuse crate::peering::moves;\n#[cfg(test)]\nuse wasmtime::Store;\n",
    )
    .expect("writable");
    let lines = code_lines(&file);
    assert_eq!(lines.len(), 4, "the test module is not counted: {lines:?}");
    assert!(lines[0].1.contains("wasmtime::"));
    assert!(KEY_SEGMENTS.iter().any(|s| lines[1].1.contains(s)));
    assert!(CLIENT_BUILDERS.iter().any(|b| lines[2].1.contains(b)));
    assert!(lines[3].1.contains("peering::"));
    assert_eq!(
        bucket_implementor("impl wasmkeep_bucket::Bucket for Wrapper {"),
        Some("Wrapper")
    );
    assert_eq!(
        bucket_implementor("impl<W: Around> Bucket for W {"),
        Some("W")
    );
    assert_eq!(bucket_implementor("impl Around for Wrapper {"), None);
    let modules: BTreeSet<String> = ["node", "actor", "actor::mailbox", "actor::orders"]
        .map(String::from)
        .into();
    let mailbox = imports(
        "actor::mailbox",
        "use crate::{node::Node, Result};\nuse super::orders::Job;",
        &modules,
    );
    assert_eq!(mailbox, ["actor::orders", "node"].map(String::from).into());
    let actor = imports(
        "actor",
        "pub struct S(mailbox::Job, my_mailbox::X);",
        &modules,
    );
    assert_eq!(actor, ["actor::mailbox"].map(String::from).into());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("node", ["actor::mailbox"].map(String::from).into()),
        ("actor::mailbox", mailbox),
        ("actor::orders", BTreeSet::new()),
    ]
    .map(|(m, i)| (m.to_owned(), i))
    .into();
    assert_eq!(
        import_cycles(&graph),
        vec![vec!["actor::mailbox".to_owned(), "node".to_owned()]]
    );
    let commented = dir.path().join("commented.rs");
    std::fs::write(&commented, "let url = \"http://x\"; // wasmtime::Engine\n").expect("writable");
    let lines = code_lines(&commented);
    assert_eq!(lines[0].1.trim(), "let url = \"http://x\";");
}
