//! Running a node and deploying a class: `dev` (a folder bucket and the
//! bundled examples), `serve`, `deploy`, opening the bucket (with the
//! runtime beside it), waiting for SIGTERM or SIGINT (and draining on it),
//! and `write_stdout`, the one place that writes data to stdout. It never
//! reads or writes a control key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use wasmkeep_bucket::Bucket;
use wasmkeep_runtime::{Runtime, RuntimeConfig};
use wasmkeep_types::{AppName, ClassName, Keys};

use super::args::{DeployArgs, DevArgs, ServeArgs};
use super::config::{Defaults, default_data_dir, default_node_id, node_config, runtime_config_for};
use crate::{NodeConfig, actor::classes, front::http, node::Node};

/// Opens the bucket while another thread builds the runtime: both take
/// milliseconds at start (the folder's recovery and pool adoption; the
/// instance pools' guard pages, some two thousand `mprotect`s).
async fn open_bucket_and_runtime(
    url: &str,
    config: &NodeConfig,
) -> anyhow::Result<(Arc<dyn Bucket>, Runtime)> {
    let runtime_config = runtime_config_for(config);
    let runtime = tokio::task::spawn_blocking(move || Runtime::new(runtime_config));
    let bucket = wasmkeep_bucket::open(url).await?;
    let runtime = runtime.await.context("building the runtime")??;
    Ok((bucket, runtime))
}

pub(super) async fn deploy(args: DeployArgs) -> anyhow::Result<()> {
    let class = ClassName::new(args.class)?;
    let app = AppName::new(args.app)?;
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let bucket = wasmkeep_bucket::open(&args.bucket).await?;
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(
            args.data_dir
                .unwrap_or_else(default_data_dir)
                .join("components"),
        ),
        instances_max: 1,
        ..RuntimeConfig::default()
    })?;
    let allow =
        wasmkeep_types::outbound::AllowList::parse(args.allow_outbound.iter().map(String::as_str))?;
    let retention = args
        .retention
        .as_deref()
        .map(super::args::parse_duration)
        .transpose()
        .context("--retention")?;
    let limits = classes::ClassLimits::new(args.database_max_bytes)?
        .with_retention(retention)?
        .with_allow_outbound(allow);
    let digest =
        classes::deploy(&*bucket, &Keys::new(&app), &class, bytes, limits, &runtime).await?;
    write_stdout(&format!("{class} {digest}\n"));
    Ok(())
}

#[allow(clippy::print_stdout)] // stdout is for data; this is the one place that writes it.
pub(super) fn write_stdout(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The examples `wasmkeep dev` deploys when it is given no component.
const BUNDLED: [&str; 3] = ["counter", "chat", "proxy"];

/// Finds the bundled examples: `--guests-dir`, else `<exe dir>/../wasm`.
fn bundled_components(guests_dir: Option<&Path>) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let dir = match guests_dir {
        Some(dir) => dir.to_path_buf(),
        None => {
            let exe = std::env::current_exe().context("locating this executable")?;
            exe.parent()
                .and_then(Path::parent)
                .map(|target| target.join("wasm"))
                .ok_or_else(|| anyhow!("cannot locate target/wasm from {}", exe.display()))?
        }
    };
    let mut found = Vec::new();
    for class in BUNDLED {
        let path = dir.join(format!("{class}.wasm"));
        if !path.is_file() {
            bail!(
                "the bundled example {} is missing: run scripts/build-guests (or pass CLASS=path.wasm, or --guests-dir DIR)",
                path.display()
            );
        }
        found.push((class.to_owned(), path));
    }
    Ok(found)
}

pub(super) async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let default_bucket = format!("file://{}", cwd.join(".wasmkeep").display());
    let (mut config, bucket_url) = node_config(
        &args.node,
        Defaults {
            bucket: Some(default_bucket),
            node_id: "dev".into(),
            listen: "127.0.0.1:8787",
            console: true,
        },
    )?;
    // The developer is the client: a trap's details go to the answer too.
    config.guest_error_detail = true;
    if args.test_routes {
        // They run anything on any actor and move the clock: never for
        // anyone but this machine.
        if !config.listen.ip().is_loopback() {
            bail!(
                "--test-routes serves only on a loopback address, not {} (--listen 127.0.0.1:PORT)",
                config.listen
            );
        }
        config.test_clock = Some(Arc::new(wasmkeep_cluster::TestClock::default()));
    }
    // Each watched project is built once before the node starts.
    let mut watched = Vec::new();
    for dir in &args.watch {
        let (name, wasm) = super::new::build_project(dir)?;
        watched.push((name, dir.clone(), wasm));
    }
    // A test node starts empty: its harness deploys what it tests.
    let components = if args.components.is_empty() && watched.is_empty() && !args.test_routes {
        bundled_components(args.guests_dir.as_deref())?
    } else {
        args.components
            .iter()
            .map(|spec| {
                let (class, path) = spec
                    .split_once('=')
                    .ok_or_else(|| anyhow!("component {spec:?}: write CLASS=path.wasm"))?;
                Ok((class.to_owned(), PathBuf::from(path)))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
            .into_iter()
            .chain(
                watched
                    .iter()
                    .map(|(name, _, wasm)| (name.clone(), wasm.clone())),
            )
            .collect()
    };
    let (bucket, runtime) = open_bucket_and_runtime(&bucket_url, &config).await?;
    let keys = Keys::new(&config.app);
    let mut classes_deployed = Vec::new();
    for (class, path) in components {
        let class = ClassName::new(class)?;
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        // A class deployed before keeps its limits and allow-list (`wasmkeep
        // deploy --allow-outbound` into this folder), new bytes or not.
        let limits = match classes::current(&*bucket, &keys, &class).await? {
            Some(current) => current.limits,
            None => classes::ClassLimits::default(),
        };
        let digest = classes::deploy(&*bucket, &keys, &class, bytes, limits, &runtime)
            .await
            .with_context(|| format!("deploying {}", path.display()))?;
        tracing::info!(%class, %digest, path = %path.display(), "deployed");
        classes_deployed.push(class);
    }
    if !watched.is_empty() {
        let projects = watched
            .into_iter()
            .map(|(name, dir, _)| Ok((ClassName::new(name)?, dir)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        tokio::spawn(super::new::watch(
            projects,
            Arc::clone(&bucket),
            keys.clone(),
            runtime.clone(),
        ));
    }
    let listen = config.listen;
    let console = config.console.clone();
    let bucket_note = bucket_url.clone();
    serve_node(config, bucket, &bucket_url, runtime, None, move |addr| {
        let mut text =
            format!("wasmkeep dev: serving on http://{addr} (bucket {bucket_note})\nTry:\n");
        for class in &classes_deployed {
            match class.as_str() {
                "counter" => {
                    text.push_str(&format!(
                        "  curl -X POST http://{addr}/demo/counter/alice/increment\n"
                    ));
                    text.push_str(&format!("  curl http://{addr}/demo/counter/alice/value\n"));
                }
                "chat" => {
                    text.push_str(&format!(
                        "  curl -X POST 'http://{addr}/demo/chat/lobby/post?user=ann' -d hello\n"
                    ));
                    text.push_str(&format!("  curl http://{addr}/demo/chat/lobby/history\n"));
                }
                "proxy" => text.push_str(&format!(
                    "  curl 'http://{addr}/demo/proxy/p1/fetch?url=https%3A%2F%2Fexample.com%2F'   (denied until: wasmkeep deploy proxy target/wasm/proxy.wasm --bucket {bucket_note} --allow-outbound example.com)\n"
                )),
                other => text.push_str(&format!("  curl http://{addr}/demo/{other}/some-name/\n")),
            }
        }
        text.push_str(&format!("  curl http://{addr}/_wasmkeep/metrics\n"));
        match console {
            crate::Console::Off => {}
            crate::Console::Open => text.push_str(&format!(
                "Console: http://{addr}/_wasmkeep/console (no token: anyone who reaches this \
                 loopback address can read every actor's data; --console off to stop it)\n"
            )),
            crate::Console::Token(_) => text.push_str(&format!(
                "Console: http://{addr}/_wasmkeep/console (asks for the token of --console-token-file)\n"
            )),
        }
        write_stdout(&text);
    })
    .await
    .with_context(|| format!("serving on {listen}"))
}

pub(super) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (config, bucket_url) = node_config(
        &args.node,
        Defaults {
            bucket: None,
            node_id: default_node_id(),
            listen: "127.0.0.1:8787",
            console: false,
        },
    )?;
    let (bucket, runtime) = open_bucket_and_runtime(&bucket_url, &config).await?;
    let drain_timeout = config.drain_timeout;
    serve_node(
        config,
        bucket,
        &bucket_url,
        runtime,
        Some(drain_timeout),
        |addr| {
            tracing::info!(%addr, "ready");
        },
    )
    .await
}

/// Starts the node and its HTTP front, and runs until SIGTERM or SIGINT.
/// With `drain_timeout` (`serve`), the signal first drains the node for at
/// most that long; `dev` has no peers and stops at once.
async fn serve_node(
    config: NodeConfig,
    bucket: Arc<dyn Bucket>,
    bucket_url: &str,
    runtime: Runtime,
    drain_timeout: Option<Duration>,
    on_ready: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    // Held until the process ends (ADR 0054).
    let identity = format!("{bucket_url}\n{}\n{}", config.app, config.node_id);
    let data_dir_lock = crate::peering::holder::DataDirLock::acquire(&config.data_dir, &identity)?;
    let mut config = config;
    config.holder = data_dir_lock.as_ref().map(|l| l.token().to_owned());
    let grace = config.limits.shutdown_grace;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(wasmkeep_transport::tls::server_config(cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    if config.advertise.is_none() {
        config.advertise = Some(format!("{scheme}://{addr}"));
    }
    let mut platform = crate::Platform::production(runtime);
    if let Some(clock) = &config.test_clock {
        // The clock the test routes move is the node's (alarms, sweeps).
        platform.clock = Arc::clone(clock) as Arc<dyn wasmkeep_cluster::Clock>;
    }
    let node = Node::start_with(config, bucket, platform).await?;
    let server = tokio::spawn(http::serve_tls(
        Arc::clone(&node),
        listener,
        tls,
        node.shutdown_rx(),
        grace,
    ));
    eprintln!(
        "wasmkeep: serving on {scheme}://{addr} as node {} (advertised {})",
        node.node_id, node.peering.advertise
    );
    on_ready(addr);
    wait_for_signal().await?;
    if let Some(timeout) = drain_timeout
        && node.peering.signer.is_some()
        && node.is_serving()
    {
        tracing::info!(?timeout, "SIGTERM: draining before stopping");
        crate::peering::drain::drain_for_signal(&node, timeout).await;
    }
    tracing::info!("shutting down: finishing events, closing sockets, releasing actors");
    node.shutdown(grace).await;
    let _ = server.await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        result = tokio::signal::ctrl_c() => result?,
    }
    Ok(())
}
