//! A node's configuration from its layers (flag > environment > `--config`
//! file > default): the config file's keys, the defaults that differ
//! between `dev` and `serve`, the checks of every value, the runtime's
//! settings that follow from them, and the warning about misspelt
//! `WASMKEEP_*` variables. It never opens a bucket or starts anything.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, CommandFactory};
use wasmkeep_runtime::RuntimeConfig;
use wasmkeep_types::{AppName, ClassName, NodeId};

use super::args::{Cli, NodeArgs, parse_duration};
use zeroize::Zeroizing;

use crate::{Console, NodeConfig};

/// Every `WASMKEEP_*` variable a flag reads, in every command.
fn env_names(command: &clap::Command) -> Vec<String> {
    let mut names: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_env()?.to_str().map(str::to_owned))
        .collect();
    for sub in command.get_subcommands() {
        names.extend(env_names(sub));
    }
    names
}

/// Of `names`, the `WASMKEEP_*` ones that no flag reads but that are close
/// to one that does (`WASMKEEP_IDLE_TIMOUT`), each with that one. Names far
/// from every setting are left alone: other tools may use the prefix.
fn misspelt_env_names(names: impl Iterator<Item = String>) -> Vec<(String, String)> {
    /// Edits that still make a name a misspelling of a setting.
    const MISSPELLING_DISTANCE_MAX: usize = 2;
    let known = env_names(&Cli::command());
    names
        .filter(|name| name.starts_with("WASMKEEP_") && !known.contains(name))
        .filter_map(|name| {
            let closest = closest(&known, &name, MISSPELLING_DISTANCE_MAX)?.clone();
            Some((name, closest))
        })
        .collect()
}

/// The one of `known` fewest edits away from `name`, if at most
/// `distance_max` edits away.
fn closest<'a>(known: &'a [String], name: &str, distance_max: usize) -> Option<&'a String> {
    known
        .iter()
        .map(|k| (strsim::levenshtein(k, name), k))
        .min()
        .filter(|(distance, _)| *distance <= distance_max)
        .map(|(_, k)| k)
}

/// Warns about environment variables that look like a misspelt setting:
/// the flag they meant keeps its default, which is easy to miss.
pub fn warn_misspelt_env() {
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for (name, setting) in misspelt_env_names(names) {
        tracing::warn!(
            "{name} is not a setting of wasmkeep and is ignored; did you mean {setting}?"
        );
    }
}

/// Values from the `--config` file, keyed by flag name with `_` for `-`.
#[derive(Debug, Default)]
struct FileConfig(BTreeMap<String, String>);

/// The keys a config file may set: the flags of a node.
fn file_keys() -> Vec<String> {
    let mut keys: Vec<String> = NodeArgs::augment_args(clap::Command::new("node"))
        .get_arguments()
        .map(|arg| arg.get_id().as_str().to_owned())
        .filter(|key| key != "config")
        .collect();
    keys.sort();
    keys
}

impl FileConfig {
    fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .with_context(|| format!("parsing config file {}", path.display()))?;
        let known = file_keys();
        let mut values = BTreeMap::new();
        for (key, value) in table {
            let name = key.replace('-', "_");
            if !known.contains(&name) {
                let hint = match closest(&known, &name, 3) {
                    Some(k) => format!("did you mean {k}?"),
                    None => format!("the keys are {}", known.join(", ")),
                };
                bail!(
                    "config file {}: unknown key {key:?} ({hint})",
                    path.display()
                );
            }
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Array(items) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                other => bail!("config key {key}: unsupported value {other}"),
            };
            values.insert(name, text);
        }
        Ok(Self(values))
    }

    fn pick(&self, flag: Option<&String>, key: &str) -> Option<String> {
        flag.cloned().or_else(|| self.0.get(key).cloned())
    }
}

/// Defaults that differ between `dev` and `serve`.
pub(super) struct Defaults {
    pub(super) bucket: Option<String>,
    pub(super) node_id: String,
    pub(super) listen: &'static str,
    /// The web console without a token on a loopback listener (`dev`).
    pub(super) console: bool,
}

pub(super) fn default_data_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("wasmkeep")
}

pub(super) fn default_node_id() -> String {
    // The kernel's host name: shells do not export HOSTNAME, and systemd
    // does not set it, so the variable alone made every node `node-1`.
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if NodeId::new(cleaned.clone()).is_ok() {
        cleaned
    } else {
        "node-1".to_owned()
    }
}

/// `true`/`false` (or yes/no, on/off, 1/0) of a switch flag.
fn parse_switch(flag: &str, text: &str) -> anyhow::Result<bool> {
    match text.trim() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        other => bail!("--{flag} {other:?}: use true or false"),
    }
}

/// The console's operator token: the first line of `file`, 16 to 256
/// visible ASCII characters.
fn read_console_token(file: &Path) -> anyhow::Result<Zeroizing<String>> {
    let text = Zeroizing::new(
        std::fs::read_to_string(file)
            .with_context(|| format!("--console-token-file {}", file.display()))?,
    );
    let token = Zeroizing::new(text.lines().next().unwrap_or_default().trim().to_owned());
    if !(16..=256).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "--console-token-file {}: its first line must be the token, 16 to 256 visible \
             ASCII characters (e.g. from `openssl rand -hex 24`)",
            file.display()
        );
    }
    Ok(token)
}

/// Builds the node configuration and the bucket URL from flags, env and file.
pub(super) fn node_config(
    args: &NodeArgs,
    defaults: Defaults,
) -> anyhow::Result<(NodeConfig, String)> {
    let file = FileConfig::load(args.config.as_deref())?;
    let bucket = file
        .pick(args.bucket.as_ref(), "bucket")
        .or(defaults.bucket)
        .ok_or_else(|| anyhow!("--bucket (or WASMKEEP_BUCKET) is required: file:///path, s3://bucket/prefix or memory://"))?;
    let app = AppName::new(
        file.pick(args.app.as_ref(), "app")
            .unwrap_or_else(|| "default".into()),
    )?;
    let node_id = NodeId::new(
        file.pick(args.node_id.as_ref(), "node_id")
            .unwrap_or(defaults.node_id),
    )?;
    let listen_text = file
        .pick(args.listen.as_ref(), "listen")
        .unwrap_or_else(|| defaults.listen.into());
    let listen: SocketAddr = listen_text.parse().with_context(|| {
        format!("--listen {listen_text:?} is not an address like 127.0.0.1:8787")
    })?;
    let data_dir = args
        .data_dir
        .clone()
        .or_else(|| file.0.get("data_dir").map(PathBuf::from))
        .unwrap_or_else(default_data_dir);
    let mut config = NodeConfig::new(app, node_id, listen, data_dir);
    config.advertise = file.pick(args.advertise.as_ref(), "advertise");
    if let Some(url) = &config.advertise
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        bail!("--advertise {url:?} must start with http:// or https://");
    }
    let path = |flag: &Option<PathBuf>, key: &str| {
        flag.clone().or_else(|| file.0.get(key).map(PathBuf::from))
    };
    config.cluster_key_file = path(&args.cluster_key_file, "cluster_key_file");
    config.tls_cert = path(&args.tls_cert, "tls_cert");
    config.tls_key = path(&args.tls_key, "tls_key");
    config.tls_ca = path(&args.tls_ca, "tls_ca");
    config.secrets_identity = path(&args.secrets_identity, "secrets_identity");
    config.outbound_ca = path(&args.outbound_ca, "outbound_ca");
    if let Some(text) = file.pick(args.tenant_tokens.as_ref(), "tenant_tokens") {
        config.tenant_tokens = parse_switch("tenant-tokens", &text)?;
    }
    let console_token_file = path(&args.console_token_file, "console_token_file");
    let console_on = match file.pick(args.console.as_ref(), "console") {
        Some(text) => parse_switch("console", &text)?,
        None => defaults.console || console_token_file.is_some(),
    };
    config.console = match (console_on, console_token_file) {
        (false, _) => Console::Off,
        (true, Some(file)) => Console::Token(Arc::new(read_console_token(&file)?)),
        (true, None) if listen.ip().is_loopback() => Console::Open,
        (true, None) => bail!(
            "--console on: a console on a listener other than loopback needs \
             --console-token-file (the operator token its API asks for)"
        ),
    };
    if config.tls_cert.is_some() != config.tls_key.is_some() {
        bail!("--tls-cert and --tls-key go together");
    }
    if let Some(list) = file.pick(args.classes.as_ref(), "classes") {
        let list = list.trim();
        if !list.is_empty() && list != "*" {
            let classes = list
                .split(',')
                .map(|c| ClassName::new(c.trim()))
                .collect::<Result<Vec<_>, _>>()?;
            config.classes = Some(classes);
        }
    }
    let duration =
        |flag: Option<&String>, key: &str, target: &mut Duration| -> anyhow::Result<()> {
            if let Some(text) = file.pick(flag, key) {
                *target = parse_duration(&text)
                    .with_context(|| format!("--{}", key.replace('_', "-")))?;
            }
            Ok(())
        };
    let limits = &mut config.limits;
    for (flag, key, target) in [
        (&args.heartbeat, "heartbeat", &mut config.heartbeat_period),
        (&args.lease_ttl, "lease_ttl", &mut config.lease_ttl),
        (&args.idle_timeout, "idle_timeout", &mut config.idle_timeout),
        (
            &args.instance_idle_timeout,
            "instance_idle_timeout",
            &mut config.instance_idle_timeout,
        ),
        (
            &args.alarm_sweep,
            "alarm_sweep",
            &mut config.alarm_sweep_period,
        ),
        (
            &args.drain_timeout,
            "drain_timeout",
            &mut config.drain_timeout,
        ),
        (
            &args.event_time_max,
            "event_time_max",
            &mut limits.event_time_max,
        ),
        (
            &args.header_timeout,
            "header_timeout",
            &mut limits.header_time_max,
        ),
        (
            &args.body_timeout,
            "body_timeout",
            &mut limits.body_idle_time_max,
        ),
        (
            &args.send_timeout,
            "send_timeout",
            &mut limits.send_idle_time_max,
        ),
    ] {
        duration(flag.as_ref(), key, target)?;
    }
    let count = |flag: Option<&String>, key: &str, target: &mut usize| -> anyhow::Result<()> {
        if let Some(text) = file.pick(flag, key) {
            let flag_name = key.replace('_', "-");
            *target = text
                .trim()
                .parse()
                .with_context(|| format!("--{flag_name} {text:?} is not a number"))?;
            if *target == 0 {
                bail!("--{flag_name} must be at least 1");
            }
        }
        Ok(())
    };
    for (flag, key, target) in [
        (&args.max_actors, "max_actors", &mut config.actors_max),
        (
            &args.max_connections,
            "max_connections",
            &mut limits.connections_max,
        ),
        (
            &args.max_body_bytes,
            "max_body_bytes",
            &mut limits.body_bytes_max,
        ),
        (
            &args.max_database_memory,
            "max_database_memory",
            &mut limits.database_memory_bytes_max,
        ),
        (
            &args.max_mailbox_events,
            "max_mailbox_events",
            &mut limits.mailbox_events_max,
        ),
        (
            &args.max_socket_message_bytes,
            "max_socket_message_bytes",
            &mut limits.socket_message_bytes_max,
        ),
        (
            &args.max_sockets_per_actor,
            "max_sockets_per_actor",
            &mut limits.sockets_per_actor_max,
        ),
        (
            &args.max_outbound_body_bytes,
            "max_outbound_body_bytes",
            &mut limits.outbound_body_bytes_max,
        ),
        (
            &args.max_outbound_per_actor,
            "max_outbound_per_actor",
            &mut limits.outbound_per_actor_max,
        ),
        (
            &args.max_outbound_per_node,
            "max_outbound_per_node",
            &mut limits.outbound_per_node_max,
        ),
    ] {
        count(flag.as_ref(), key, target)?;
    }
    if config.heartbeat_period.is_zero()
        || config.alarm_sweep_period.is_zero()
        || config.idle_timeout.is_zero()
        || config.lease_ttl.is_zero()
        || config.limits.header_time_max.is_zero()
        || config.limits.body_idle_time_max.is_zero()
        || config.limits.send_idle_time_max.is_zero()
    {
        bail!(
            "--heartbeat, --lease-ttl, --alarm-sweep, --idle-timeout, --header-timeout, \
             --body-timeout and --send-timeout must be longer than zero"
        );
    }
    if config.heartbeat_period >= config.lease_ttl {
        bail!(
            "--heartbeat must be shorter than --lease-ttl (a lease is renewed several times per TTL)"
        );
    }
    Ok((config, bucket))
}

pub(super) fn runtime_config_for(config: &NodeConfig) -> RuntimeConfig {
    RuntimeConfig {
        cache_dir: Some(config.data_dir.join("components")),
        // Headroom over --max-actors: actors being evicted still hold their
        // instance while new ones activate.
        instances_max: u32::try_from(config.actors_max * 2 + 64).unwrap_or(u32::MAX),
        event_time_max: config.limits.event_time_max,
        outbound: wasmkeep_runtime::OutboundConfig {
            body_bytes_max: config.limits.outbound_body_bytes_max as u64,
            in_flight_per_actor: config.limits.outbound_per_actor_max,
            in_flight_per_node: config.limits.outbound_per_node_max,
            extra_ca: config.outbound_ca.clone(),
        },
        ..RuntimeConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_fills_what_flags_leave_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "bucket = \"memory://\"\nidle-timeout = \"5s\"\nmax_actors = 7\nclasses = [\"counter\", \"chat\"]\n").expect("write");
        let args = NodeArgs {
            config: Some(path),
            idle_timeout: Some("9s".into()),
            ..NodeArgs::default()
        };
        let (config, bucket) = node_config(
            &args,
            Defaults {
                bucket: None,
                node_id: "n1".into(),
                listen: "127.0.0.1:0",
                console: false,
            },
        )
        .expect("config");
        assert_eq!(bucket, "memory://");
        assert_eq!(
            config.idle_timeout,
            Duration::from_secs(9),
            "the flag wins over the file"
        );
        assert_eq!(config.actors_max, 7);
        assert_eq!(config.classes.as_ref().map(Vec::len), Some(2));
    }

    #[test]
    fn misspelt_environment_variables_are_named_with_the_setting_they_meant() {
        let names = [
            "WASMKEEP_IDLE_TIMOUT",
            "WASMKEEP_IDLE_TIMEOUT",
            "WASMKEEP_BUKET",
            "WASMKEEP_WEED",
            "HOME",
        ];
        assert_eq!(
            misspelt_env_names(names.iter().map(|n| (*n).to_owned())),
            [
                (
                    "WASMKEEP_IDLE_TIMOUT".to_owned(),
                    "WASMKEEP_IDLE_TIMEOUT".to_owned()
                ),
                ("WASMKEEP_BUKET".to_owned(), "WASMKEEP_BUCKET".to_owned()),
            ]
        );
    }

    #[test]
    fn config_file_keys_are_checked_and_each_flag_is_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let load = |text: &str| {
            let path = dir.path().join("node.toml");
            std::fs::write(&path, text).expect("write");
            let args = NodeArgs {
                config: Some(path),
                ..NodeArgs::default()
            };
            let defaults = Defaults {
                bucket: Some("memory://".into()),
                node_id: "n1".into(),
                listen: "127.0.0.1:0",
                console: false,
            };
            node_config(&args, defaults).map(|(config, _)| config)
        };
        let typo = load("idle_timout = \"5s\"\n").expect_err("a misspelt key");
        assert!(
            format!("{typo:#}")
                .contains("unknown key \"idle_timout\" (did you mean idle_timeout?)"),
            "{typo:#}"
        );
        let unknown = load("colour = \"blue\"\n").expect_err("an unknown key");
        assert!(
            format!("{unknown:#}").contains("the keys are advertise, alarm_sweep, app, "),
            "{unknown:#}"
        );
        // Every flag of a node is a key, `serve`'s drain time included.
        let config = load("drain-timeout = \"7s\"\nheader_timeout = \"9s\"\n").expect("known keys");
        assert_eq!(config.drain_timeout, Duration::from_secs(7));
        assert_eq!(config.limits.header_time_max, Duration::from_secs(9));
        assert!(
            !file_keys().contains(&"config".to_owned()),
            "a file names no other file"
        );
    }

    #[test]
    fn a_console_without_a_token_is_served_on_loopback_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123\n").expect("write");
        let config = |listen: &str, console: Option<&str>, token: Option<&Path>| {
            let args = NodeArgs {
                bucket: Some("memory://".into()),
                listen: Some(listen.into()),
                console: console.map(Into::into),
                console_token_file: token.map(Path::to_path_buf),
                ..NodeArgs::default()
            };
            let defaults = Defaults {
                bucket: None,
                node_id: "n1".into(),
                listen: "127.0.0.1:0",
                console: true,
            };
            node_config(&args, defaults).map(|(config, _)| config.console)
        };
        assert!(matches!(
            config("127.0.0.1:0", None, None),
            Ok(Console::Open)
        ));
        assert!(matches!(config("[::1]:0", None, None), Ok(Console::Open)));
        let open_wide = config("0.0.0.0:0", None, None).expect_err("no token, not loopback");
        assert!(
            format!("{open_wide:#}").contains("needs --console-token-file"),
            "{open_wide:#}"
        );
        assert!(matches!(
            config("0.0.0.0:0", Some("off"), None),
            Ok(Console::Off)
        ));
        assert!(matches!(
            config("0.0.0.0:0", None, Some(&token)),
            Ok(Console::Token(t)) if t.as_str() == "0123456789abcdef0123"
        ));
        assert!(config("127.0.0.1:0", Some("maybe"), None).is_err());
    }

    #[test]
    fn bad_flags_are_refused() {
        let base = || NodeArgs {
            bucket: Some("memory://".into()),
            ..NodeArgs::default()
        };
        let d = || Defaults {
            bucket: None,
            node_id: "n1".into(),
            listen: "127.0.0.1:0",
            console: false,
        };
        let bad: [(&str, NodeArgs); 4] = [
            (
                "listen",
                NodeArgs {
                    listen: Some("nowhere".into()),
                    ..base()
                },
            ),
            (
                "max-actors",
                NodeArgs {
                    max_actors: Some("0".into()),
                    ..base()
                },
            ),
            (
                "node-id",
                NodeArgs {
                    node_id: Some("Bad Id".into()),
                    ..base()
                },
            ),
            (
                "classes",
                NodeArgs {
                    classes: Some("ok,Not-ok".into()),
                    ..base()
                },
            ),
        ];
        for (flag, args) in &bad {
            assert!(node_config(args, d()).is_err(), "a bad --{flag} is refused");
        }
        assert!(node_config(&base(), d()).is_ok(), "the base is good");
        assert!(node_config(&NodeArgs::default(), d()).is_err(), "no bucket");
    }
}
