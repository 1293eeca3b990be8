//! `wasmkeep new` and `wasmkeep build` (issue 55, ADR 0070): a working
//! actor project (a counter) in Rust or TypeScript, with its README and a
//! test that runs it on a real node, and the one command that builds any
//! such project into a component.
//!
//! The SDKs and test harnesses are not published yet: a project depends on
//! them by path, in a wasmkeep source tree (`--sdk`, `$WASMKEEP_SOURCE`, the tree this binary
//! was built from, or one above it).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The languages a project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Ts,
}

/// One file of a template: its path in the project and its text, with
/// `{{name}}`, `{{sdk_rust}}`, `{{sdk_js}}` and `{{sdk_test}}` (the test
/// harness of the project's language) to fill in.
type TemplateFile = (&'static str, &'static str);

const RUST: [TemplateFile; 5] = [
    ("Cargo.toml", include_str!("templates/rust/Cargo.toml")),
    ("src/lib.rs", include_str!("templates/rust/src/lib.rs")),
    (
        "tests/counter.rs",
        include_str!("templates/rust/tests/counter.rs"),
    ),
    ("README.md", include_str!("templates/rust/README.md")),
    (".gitignore", include_str!("templates/rust/gitignore")),
];

const TS: [TemplateFile; 6] = [
    ("package.json", include_str!("templates/ts/package.json")),
    ("tsconfig.json", include_str!("templates/ts/tsconfig.json")),
    ("src/actor.ts", include_str!("templates/ts/src/actor.ts")),
    (
        "test/actor.test.mjs",
        include_str!("templates/ts/test/actor.test.mjs"),
    ),
    ("README.md", include_str!("templates/ts/README.md")),
    (".gitignore", include_str!("templates/ts/gitignore")),
];

/// Longest project name (it is also the class name and the crate's or
/// package's name).
const NAME_BYTES_MAX: usize = 40;

/// A project name: a lower-case letter, then lower-case letters, digits
/// and single hyphens; valid as a class, a crate and an npm package name.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = (1..=NAME_BYTES_MAX).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        bail!(
            "{name:?} is not a project name: 1 to {NAME_BYTES_MAX} lower-case letters, digits \
             and single hyphens, starting with a letter (it is also the class name)"
        );
    }
    wasmkeep_types::ClassName::new(name)
        .map(drop)
        .with_context(|| format!("{name:?} is not a class name"))
}

/// A wasmkeep source tree: the folder with the SDKs (`crates/wasmkeep-sdk`,
/// `sdk/js`) and the test harnesses (`crates/wasmkeep-test`, `sdk/test`).
fn is_source_tree(dir: &Path) -> bool {
    dir.join("crates/wasmkeep-sdk/Cargo.toml").is_file()
        && dir.join("sdk/js/package.json").is_file()
        && dir.join("crates/wasmkeep-test/Cargo.toml").is_file()
        && dir.join("sdk/test/package.json").is_file()
}

/// Where the SDKs are (see the module).
fn source_tree(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = given {
        if !is_source_tree(dir) {
            bail!(
                "{} is not a wasmkeep source tree (no SDKs and test harnesses: crates/wasmkeep-sdk, sdk/js, crates/wasmkeep-test, sdk/test)",
                dir.display()
            );
        }
        return Ok(std::fs::canonicalize(dir)?);
    }
    if let Some(dir) = std::env::var_os("WASMKEEP_SOURCE") {
        return source_tree(Some(Path::new(&dir)));
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = std::env::current_exe().ok();
    let candidates = exe
        .iter()
        .flat_map(|exe| exe.ancestors().skip(1))
        .chain(std::iter::once(built_from.as_path()));
    for dir in candidates {
        if is_source_tree(dir) {
            return Ok(std::fs::canonicalize(dir)?);
        }
    }
    bail!(
        "no wasmkeep source tree found for the SDKs (they are not published yet): \
         give one with --sdk DIR or WASMKEEP_SOURCE"
    )
}

/// `wasmkeep new NAME`: writes the project into `dir` (default `./NAME`),
/// which must not exist or be empty.
pub fn new_project(
    name: &str,
    lang: Lang,
    dir: Option<&Path>,
    sdk: Option<&Path>,
) -> anyhow::Result<()> {
    check_name(name)?;
    let dir = dir.map_or_else(|| PathBuf::from(name), Path::to_path_buf);
    if dir.exists()
        && std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{} exists and is not empty; nothing was written",
            dir.display()
        );
    }
    let source = source_tree(sdk)?;
    let text = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace(
                "{{sdk_rust}}",
                &source.join("crates/wasmkeep-sdk").display().to_string(),
            )
            .replace("{{sdk_js}}", &source.join("sdk/js").display().to_string())
            .replace(
                "{{sdk_test}}",
                &source
                    .join(match lang {
                        Lang::Rust => "crates/wasmkeep-test",
                        Lang::Ts => "sdk/test",
                    })
                    .display()
                    .to_string(),
            )
    };
    let files: &[TemplateFile] = match lang {
        Lang::Rust => &RUST,
        Lang::Ts => &TS,
    };
    for (path, template) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text(template))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let next = match lang {
        Lang::Rust => "wasmkeep build && cargo test",
        Lang::Ts => "npm install && wasmkeep build && npm test",
    };
    eprintln!(
        "wasmkeep: a {} actor in {} (SDK from {}). Next: cd {} && {next}; then \
         wasmkeep dev {name}={name}.wasm",
        match lang {
            Lang::Rust => "Rust",
            Lang::Ts => "TypeScript",
        },
        dir.display(),
        source.display(),
        dir.display(),
    );
    Ok(())
}

/// `wasmkeep build [DIR]`: builds the project in `dir` into
/// `DIR/<name>.wasm` and returns the name (its class) and that path. A `package.json` makes it a
/// TypeScript project (`npm run build`, after `npm install` if its
/// `node_modules` is missing); a `Cargo.toml` a Rust one (cargo for
/// wasm32-wasip2: rustup's target when installed, else Debian's rustc-web
/// with `-Zbuild-std`).
pub fn build_project(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("reading {}", dir.display()))?;
    let (name, run) = if dir.join("package.json").is_file() {
        (package_name(&dir)?, build_ts(&dir)?)
    } else if dir.join("Cargo.toml").is_file() {
        let name = crate_name(&dir)?;
        (name.clone(), build_rust(&dir, &name)?)
    } else {
        bail!(
            "{} has neither a package.json nor a Cargo.toml: not an actor project \
             (`wasmkeep new NAME` makes one)",
            dir.display()
        );
    };
    let out = dir.join(format!("{name}.wasm"));
    if let Some(built) = run {
        std::fs::copy(&built, &out)
            .with_context(|| format!("copying {} to {}", built.display(), out.display()))?;
    }
    if !out.is_file() {
        bail!("the build wrote no {}", out.display());
    }
    eprintln!(
        "wasmkeep: built {} ({} bytes)",
        out.display(),
        std::fs::metadata(&out)?.len()
    );
    Ok((name, out))
}

/// How often `dev --watch` looks at the projects' files.
const WATCH_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Folders of a project that a build writes, never read for a change.
const WATCH_SKIPPED: [&str; 5] = ["target", "node_modules", ".wasmkeep", "dist", ".git"];

/// The newest modification time of the project's source files, and how
/// many there are (a removed file changes the count): what `dev --watch`
/// compares between two looks.
fn source_state(dir: &Path) -> (Option<std::time::SystemTime>, usize) {
    let mut newest = None;
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                if !WATCH_SKIPPED.iter().any(|s| name == *s) {
                    stack.push(path);
                }
            } else if path.extension().is_none_or(|e| e != "wasm") {
                count += 1;
                newest = newest.max(meta.modified().ok());
            }
        }
    }
    (newest, count)
}

/// `dev --watch`: builds a project again when its files change (looked at
/// every [`WATCH_POLL`]) and deploys the component as its class, keeping
/// the class's limits. Requests in flight finish on the version they
/// started on; an actor switches at its next event. A build that fails is
/// shown and the last version keeps serving. A change saved while a build
/// runs is taken by that build or missed (save again). Runs until the
/// process ends.
pub async fn watch(
    projects: Vec<(wasmkeep_types::ClassName, PathBuf)>,
    bucket: std::sync::Arc<dyn wasmkeep_bucket::Bucket>,
    keys: wasmkeep_types::Keys,
    runtime: wasmkeep_runtime::Runtime,
) {
    use crate::actor::classes;
    let mut seen: Vec<_> = projects.iter().map(|(_, dir)| source_state(dir)).collect();
    let mut ticker = tokio::time::interval(WATCH_POLL);
    loop {
        ticker.tick().await;
        for ((class, dir), seen) in projects.iter().zip(seen.iter_mut()) {
            let now = source_state(dir);
            if now == *seen {
                continue;
            }
            *seen = now;
            eprintln!("wasmkeep dev: {} changed; building", dir.display());
            let built = {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || build_project(&dir)).await
            };
            // What the build itself wrote is not a change.
            *seen = source_state(dir);
            let wasm = match built {
                Ok(Ok((_, wasm))) => wasm,
                Ok(Err(e)) => {
                    eprintln!(
                        "wasmkeep dev: the build of {} failed; the last version keeps serving: {e:#}",
                        dir.display()
                    );
                    continue;
                }
                Err(e) => {
                    eprintln!("wasmkeep dev: the build of {} stopped: {e}", dir.display());
                    continue;
                }
            };
            let deployed = async {
                let bytes = std::fs::read(&wasm)?;
                let limits = classes::current(&*bucket, &keys, class)
                    .await?
                    .map(|current| current.limits)
                    .unwrap_or_default();
                anyhow::Ok(classes::deploy(&*bucket, &keys, class, bytes, limits, &runtime).await?)
            };
            match deployed.await {
                Ok(digest) => eprintln!(
                    "wasmkeep dev: deployed {class} {} (served from the next heartbeat)",
                    &digest[..12.min(digest.len())]
                ),
                Err(e) => eprintln!(
                    "wasmkeep dev: deploying {class} failed; the last version keeps serving: {e:#}"
                ),
            }
        }
    }
}

/// Runs `command` in `dir`; an error says which command failed.
fn run(command: &mut Command, dir: &Path) -> anyhow::Result<()> {
    let status = command
        .current_dir(dir)
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status}); the old component, if any, is left as it was");
    }
    Ok(())
}

fn package_name(dir: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(dir.join("package.json"))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).context("package.json is not JSON")?;
    let name = json["name"]
        .as_str()
        .context("package.json has no name")?
        .to_owned();
    check_name(&name)?;
    Ok(name)
}

fn crate_name(dir: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml"))?;
    let manifest: toml::Table = toml::from_str(&text).context("Cargo.toml is not TOML")?;
    let name = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .context("Cargo.toml has no [package] name")?
        .to_owned();
    check_name(&name)?;
    Ok(name)
}

/// `npm run build` writes the component itself (`-o NAME.wasm`).
fn build_ts(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if !dir.join("node_modules").is_dir() {
        run(
            Command::new("npm").args(["install", "--no-audit", "--no-fund"]),
            dir,
        )?;
    }
    run(Command::new("npm").args(["run", "--silent", "build"]), dir)?;
    Ok(None)
}

/// Whether rustup has the wasm32-wasip2 target installed.
fn rustup_has_wasip2() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.trim() == "wasm32-wasip2")
        })
}

/// Builds the crate for wasm32-wasip2; the component cargo wrote.
fn build_rust(dir: &Path, name: &str) -> anyhow::Result<Option<PathBuf>> {
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| dir.join("target"), PathBuf::from);
    if rustup_has_wasip2() {
        run(
            Command::new("cargo").args(["build", "--release", "--target", "wasm32-wasip2"]),
            dir,
        )?;
    } else if Path::new("/usr/lib/wasm32-wasi/libc.a").exists()
        && Path::new("/usr/lib/rustlib/src/rust/library").is_dir()
    {
        // Debian's rustc-web knows wasm32-wasip2 and builds std from
        // source; rustup's proxies would shadow it, so by absolute path.
        run(
            Command::new("/usr/bin/cargo")
                .env("RUSTC", "/usr/bin/rustc")
                .env("RUSTC_BOOTSTRAP", "1")
                .args([
                    "rustc",
                    "--quiet",
                    "--release",
                    "--target",
                    "wasm32-wasip2",
                    "-Zbuild-std=std,panic_abort",
                    "--",
                    "-L",
                    "native=/usr/lib/wasm32-wasi",
                ]),
            dir,
        )?;
    } else {
        bail!(
            "no wasm32-wasip2 toolchain: `rustup target add wasm32-wasip2`, or on Debian \
             `apt install rustc-web cargo-web rust-web-src lld-22 wasi-libc`"
        );
    }
    Ok(Some(
        target_dir
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_"))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_names_are_class_crate_and_package_names() {
        for good in ["counter", "my-actor", "a1", "x"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Counter",
            "1st",
            "-a",
            "a-",
            "a--b",
            "a_b",
            "a.b",
            &"a".repeat(41),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_placeholder_of_the_templates_is_known() {
        for (path, template) in RUST.iter().chain(TS.iter()) {
            let filled = template
                .replace("{{name}}", "x")
                .replace("{{sdk_rust}}", "/s")
                .replace("{{sdk_js}}", "/s")
                .replace("{{sdk_test}}", "/s");
            assert!(
                !filled.contains("{{sdk") && !filled.contains("{{name"),
                "{path}"
            );
        }
    }
}
