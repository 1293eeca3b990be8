//! The `wasmkeep` command line: `dev`, `serve`, `deploy`, and the
//! operator views `node list`, `class list`, `actor list`, `actor inspect`. Every flag can
//! also come from an environment variable `WASMKEEP_<FLAG>` or from a TOML
//! file given with `--config` (flag > environment > file > default).
//! Data goes to stdout, everything else to stderr.
//!
//! One file per part, each importing only from the files before it:
//! `args` (the clap definitions, `parse_duration`), `config` (the
//! layers of a node's configuration and their checks), `dev` (`dev`,
//! `serve`, `deploy`, opening the bucket, `write_stdout`), `views`
//! (`node list`, `class list`, `actor list`, `actor inspect`), `data` (`actor sql`,
//! `actor export`: an actor's data read from the bucket), `control` (the
//! commands that write control keys: `node drain` / `undrain`, `actor
//! move`, `actor delete`, and their `--wait`). This file dispatches a
//! parsed command line and sets up logging; it never implements a command.

mod args;
mod config;
mod control;
mod data;
mod dev;
pub(crate) mod new;
mod past;
mod views;

pub use args::{
    ActorCommand, ClassCommand, Cli, Command, DeployArgs, DevArgs, LogFormat, NodeArgs,
    NodeCommand, ServeArgs, ViewArgs, parse_duration,
};
pub use config::warn_misspelt_env;
use control::{actor_delete, actor_move, node_drain, node_undrain};
use data::{actor_export, actor_import, actor_sql, actor_sql_write};
use dev::{deploy, dev, serve};
use views::{actor_inspect, actor_list, class_list, node_list};

/// Logs to stderr (text or JSON lines, filtered by `RUST_LOG`) and, when
/// `traces` (a node's commands) and an `OTEL_*` endpoint is set, exports
/// the node's spans (`ops::telemetry`). A bad `OTEL_*` value is an error.
pub fn init_logging(format: Option<LogFormat>, traces: bool) -> crate::Result<()> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,wasmtime=warn,cranelift=warn")
    });
    use std::io::IsTerminal as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // Of the trace's spans, the log shows the request's (its trace id) and
    // the event's (the actor's task enters only that one: the request is
    // found as its parent). The commit, forward, call and alarm spans are
    // not formatted for the log: their fields would cost every request.
    let filter = filter.and(tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.is_span()
            && meta.target() == "wasmkeep::trace"
            && matches!(meta.name(), "commit" | "forward" | "call" | "alarm"))
    }));
    let fmt = match format.unwrap_or(LogFormat::Text) {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    let settings = if traces {
        crate::ops::telemetry::settings(|name| std::env::var(name).ok())?
    } else {
        None
    };
    // Only the node's own spans are exported (log events are not).
    let otel = match settings {
        Some(settings) => {
            let tracer = crate::ops::telemetry::start(&settings)?;
            Some(
                // Off: attributes and clock readings per span that nobody
                // here reads (source location, thread, target, busy and
                // idle times), and the OpenTelemetry context switched at
                // every poll of an instrumented future (no other
                // OpenTelemetry instrumentation runs in the process).
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_location(false)
                    .with_threads(false)
                    .with_target(false)
                    .with_tracked_inactivity(false)
                    .with_context_activation(false)
                    .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                        meta.is_span() && meta.target() == "wasmkeep::trace"
                    })),
            )
        }
        None => None,
    };
    tracing_subscriber::registry().with(fmt).with(otel).init();
    Ok(())
}

/// Runs the parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Dev(args) => dev(args).await,
        Command::Serve(args) => serve(args).await,
        Command::Deploy(args) => deploy(args).await,
        Command::Node(NodeCommand::List { view }) => node_list(view).await,
        Command::Class(ClassCommand::List { view }) => class_list(view).await,
        Command::Node(NodeCommand::Drain {
            node,
            wait,
            force,
            view,
        }) => node_drain(&node, wait, force, view).await,
        Command::Node(NodeCommand::Undrain { node, view }) => node_undrain(&node, view).await,
        Command::Actor(ActorCommand::List { prefix, view }) => {
            actor_list(prefix.as_deref(), view).await
        }
        Command::Actor(ActorCommand::Inspect { actor, view }) => actor_inspect(&actor, view).await,
        Command::Actor(ActorCommand::Sql {
            actor,
            statement,
            write: false,
            at,
            view,
            ..
        }) => actor_sql(&actor, &statement, at.as_deref(), view).await,
        Command::Actor(ActorCommand::Sql {
            actor,
            statement,
            write: true,
            timeout,
            view,
            ..
        }) => actor_sql_write(&actor, &statement, &timeout, view).await,
        Command::Actor(ActorCommand::Export {
            actor,
            file,
            at,
            view,
        }) => actor_export(&actor, &file, at.as_deref(), view).await,
        Command::Actor(ActorCommand::History { actor, view }) => {
            past::actor_history(&actor, view).await
        }
        Command::Actor(ActorCommand::Restore {
            actor,
            at,
            from,
            timeout,
            view,
        }) => past::actor_restore(&actor, &at, from.as_deref(), &timeout, view).await,
        Command::Actor(ActorCommand::Fork {
            actor,
            new,
            at,
            from,
            timeout,
            view,
        }) => past::actor_fork(&actor, &new, at.as_deref(), from.as_deref(), &timeout, view).await,
        Command::Backup { to, view } => past::backup(&to, view).await,
        Command::Actor(ActorCommand::Import {
            actor,
            file,
            replace,
            timeout,
            view,
        }) => actor_import(&actor, &file, replace, &timeout, view).await,
        Command::Actor(ActorCommand::Move {
            actor,
            to,
            wait,
            view,
        }) => actor_move(&actor, &to, wait, view).await,
        Command::Actor(ActorCommand::Delete {
            actor,
            wait,
            timeout,
            view,
        }) => actor_delete(&actor, wait, &timeout, view).await,
        Command::Secret(command) => crate::ops::admin::secret(command).await,
        Command::Tenant(command) => crate::ops::admin::tenant(command).await,
        Command::New {
            name,
            lang,
            dir,
            sdk,
        } => new::new_project(&name, lang, dir.as_deref(), sdk.as_deref()),
        Command::Build { dir } => new::build_project(&dir).map(drop),
    }
}
