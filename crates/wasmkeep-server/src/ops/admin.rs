//! `wasmkeep secret …` (ADR 0016) and `wasmkeep tenant token …` (ADR 0022):
//! the operator commands that write an app's recipient, its encrypted
//! secrets and its tenants' token hashes to the bucket.
//!
//! Every name is validated before anything is written. A secret's value is
//! read from stdin or a file, never from the command line (where `ps` and
//! shell history would show it), and only its ciphertext leaves this
//! process. A tenant token is printed once and only its hash is stored.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Subcommand};
use wasmkeep_bucket::Bucket;
use wasmkeep_cluster::{Fenced, Outcome};
use wasmkeep_types::{AppName, Keys, TenantName};
use zeroize::Zeroizing;

use crate::actor::secrets::{self, SECRET_VALUE_BYTES_MAX};
use crate::front::tenants;

/// The bucket and app a command works on.
#[derive(Debug, Args)]
pub struct Target {
    #[arg(long, env = "WASMKEEP_BUCKET")]
    pub bucket: String,
    #[arg(long, env = "WASMKEEP_APP", default_value = "default")]
    pub app: String,
}

impl Target {
    /// Validates the app name, then opens the bucket.
    async fn open(&self) -> anyhow::Result<(Arc<dyn Bucket>, Keys, AppName)> {
        let app = AppName::new(self.app.clone())?;
        // `file:///abs/path`, `memory://` or `s3://bucket/prefix`.
        let bucket = wasmkeep_bucket::open(&self.bucket).await?;
        Ok((bucket, Keys::new(&app), app))
    }
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Makes the app's identity: writes it to --identity-file (give that
    /// file to nodes with --secrets-identity) and stores its public
    /// recipient in the bucket.
    Keygen {
        /// Where to write the identity (created with mode 0600; an existing
        /// file is never overwritten).
        #[arg(long)]
        identity_file: PathBuf,
        /// Replace the app's recipient. Secrets set before are then
        /// unreadable and must be set again.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Encrypts a value to the app's recipient and stores it. The value is
    /// read from stdin (or --file), never from the command line; one
    /// trailing newline is dropped.
    Set {
        /// 1 to 64 of letters, digits, '_', '.', '-'.
        name: String,
        /// Read the value from this file instead of stdin.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Catches a value given on the command line, to refuse it.
        #[arg(hide = true)]
        value_on_command_line: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// The app's secret names (never their values).
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Deletes a secret.
    Rm {
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// A tenant's bearer tokens (required on client requests while the
    /// app's policy says so: `tenant policy`).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Whether every node of the app requires tenant tokens (ADR 0059).
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Every node of the app requires a tenant token on every client
    /// request, within one heartbeat period.
    Require {
        #[command(flatten)]
        target: Target,
    },
    /// Tokens become optional again, within one heartbeat period, except on
    /// nodes started with --tenant-tokens true (which require them and
    /// write the policy back when they start).
    Optional {
        #[command(flatten)]
        target: Target,
    },
    /// Prints `required` or `optional`.
    Show {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Makes a token for the tenant and prints it once on stdout; only its
    /// hash is stored.
    Create {
        tenant: String,
        #[command(flatten)]
        target: Target,
    },
    /// The tenant's tokens, by id (the first characters of their hash).
    List {
        tenant: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Deletes a token; nodes refuse it within 10 s.
    Revoke {
        tenant: String,
        /// The id shown by `tenant token list`.
        id: String,
        #[command(flatten)]
        target: Target,
    },
}

pub async fn secret(command: SecretCommand) -> anyhow::Result<()> {
    match command {
        SecretCommand::Keygen {
            identity_file,
            force,
            target,
        } => keygen(&identity_file, force, &target).await,
        SecretCommand::Set {
            name,
            file,
            value_on_command_line,
            target,
        } => {
            if !value_on_command_line.is_empty() {
                bail!(
                    "refusing a secret value on the command line (shell history and `ps` would show it): pass the value on stdin or with --file, never on the command line, e.g. `printf %s \"$VALUE\" | wasmkeep secret set {name}`"
                );
            }
            secret_set(&name, file.as_deref(), &target).await
        }
        SecretCommand::List { json, target } => secret_list(json, &target).await,
        SecretCommand::Rm { name, target } => secret_rm(&name, &target).await,
    }
}

pub async fn tenant(command: TenantCommand) -> anyhow::Result<()> {
    match command {
        TenantCommand::Token(TokenCommand::Create { tenant, target }) => {
            token_create(&tenant, &target).await
        }
        TenantCommand::Token(TokenCommand::List {
            tenant,
            json,
            target,
        }) => token_list(&tenant, json, &target).await,
        TenantCommand::Token(TokenCommand::Revoke { tenant, id, target }) => {
            token_revoke(&tenant, &id, &target).await
        }
        TenantCommand::Policy(command) => policy(command).await,
    }
}

async fn policy(command: PolicyCommand) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Require { target } => {
            let (bucket, keys, app) = target.open().await?;
            let wrote = tenants::require(&*bucket, &keys)
                .await
                .context("writing the tenant-token policy")?;
            let already = if wrote { "" } else { " (it already did)" };
            eprintln!(
                "wasmkeep: every node of app {app} requires tenant tokens within one heartbeat period{already}"
            );
        }
        PolicyCommand::Optional { target } => {
            let (bucket, keys, app) = target.open().await?;
            match bucket.delete(&keys.tenant_tokens_policy()).await {
                Ok(()) | Err(wasmkeep_bucket::Error::NotFound { .. }) => {}
                Err(e) => return Err(e).context("deleting the tenant-token policy"),
            }
            eprintln!(
                "wasmkeep: tenant tokens are optional in app {app} within one heartbeat period, except on nodes started with --tenant-tokens true"
            );
        }
        PolicyCommand::Show { target } => {
            let (bucket, keys, _) = target.open().await?;
            let shown = match tenants::read_policy(&*bucket, &keys).await? {
                tenants::Policy::Required => "required",
                _ => "optional",
            };
            write_stdout(&format!("{shown}\n"));
        }
    }
    Ok(())
}

fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

async fn keygen(identity_file: &Path, force: bool, target: &Target) -> anyhow::Result<()> {
    let (bucket, keys, app) = target.open().await?;
    if identity_file.exists() {
        bail!(
            "{} exists; refusing to overwrite an identity (move it away, or pick another path)",
            identity_file.display()
        );
    }
    let existing = secrets::read_recipient(&*bucket, &keys)
        .await
        .context("reading the app's recipient")?;
    if existing.is_some() && !force {
        bail!(
            "app {app} already has a recipient (from an earlier `secret keygen`); --force replaces it, and every secret set before becomes unreadable"
        );
    }
    let identity = secrets::Identity::generate();
    let recipient = identity.to_public();
    write_new_private_file(identity_file, &secrets::identity_file_text(&identity))?;
    let stored = match existing {
        Some(_) => bucket
            .put(&keys.recipient(), Bytes::from(format!("{recipient}\n")))
            .await
            .map(|meta| meta.etag),
        // Created only if still absent: two keygens at once do not both
        // think they set the app's recipient.
        None => {
            let key = keys.recipient();
            match Fenced::new(&*bucket, &key)
                .create(Bytes::from(format!("{recipient}\n")))
                .await
            {
                Ok(Outcome::Done(etag)) => Ok(etag),
                Ok(Outcome::Conflict) => Err(wasmkeep_bucket::Error::Conflict { key }),
                Ok(Outcome::Gone) => Err(wasmkeep_bucket::Error::NotFound { key }),
                Ok(Outcome::Unknown(e)) | Err(e) => Err(e),
            }
        }
    };
    if let Err(e) = stored {
        // The identity is useless without its recipient in the bucket.
        let _ = std::fs::remove_file(identity_file);
        return Err(e).context("storing the app's recipient (no identity was kept)");
    }
    if existing.is_some() {
        let count = bucket.list(&keys.secrets_prefix()).await?.len();
        eprintln!(
            "wasmkeep: replaced app {app}'s recipient: its {count} existing secret(s) are now unreadable; set them again, and restart nodes with the new identity"
        );
    }
    eprintln!(
        "wasmkeep: identity written to {}; give it to nodes with --secrets-identity",
        identity_file.display()
    );
    write_stdout(&format!("{recipient}\n"));
    Ok(())
}

/// Creates `path` with mode 0600; fails if it exists.
fn write_new_private_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads a secret value (at most the limit) and drops one trailing newline.
fn read_value(file: Option<&Path>, name: &str) -> anyhow::Result<Zeroizing<String>> {
    let limit = SECRET_VALUE_BYTES_MAX as u64 + 2;
    // Room for the whole value up front: a growing buffer would leave
    // copies of it behind in freed memory. Zeroed when dropped.
    let mut bytes = Zeroizing::new(Vec::with_capacity(SECRET_VALUE_BYTES_MAX + 2));
    match file {
        Some(path) => {
            std::fs::File::open(path)
                .with_context(|| format!("opening {}", path.display()))?
                .take(limit)
                .read_to_end(&mut bytes)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprintln!("wasmkeep: type the value of {name}, then Ctrl-D");
            }
            stdin
                .lock()
                .take(limit)
                .read_to_end(&mut bytes)
                .context("reading the value from stdin")?;
        }
    }
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    if bytes.len() > SECRET_VALUE_BYTES_MAX {
        bail!("the value is larger than {SECRET_VALUE_BYTES_MAX} bytes");
    }
    if bytes.is_empty() {
        bail!("the value is empty (pass it on stdin or with --file)");
    }
    match String::from_utf8(std::mem::take(&mut *bytes)) {
        Ok(value) => Ok(Zeroizing::new(value)),
        Err(e) => {
            drop(Zeroizing::new(e.into_bytes()));
            bail!("the value is not UTF-8 text")
        }
    }
}

async fn secret_set(name: &str, file: Option<&Path>, target: &Target) -> anyhow::Result<()> {
    secrets::validate_name(name)?;
    let (bucket, keys, app) = target.open().await?;
    let Some(recipient) = secrets::read_recipient(&*bucket, &keys)
        .await
        .context("reading the app's recipient")?
    else {
        bail!("app {app} has no recipient: run `wasmkeep secret keygen` first");
    };
    let value = read_value(file, name)?;
    let sealed = secrets::encrypt(&recipient, value.as_bytes())?;
    bucket
        .put(&keys.secret(name), Bytes::from(sealed))
        .await
        .context("storing the secret")?;
    eprintln!("wasmkeep: secret {name} set in app {app}; nodes read it within one heartbeat");
    Ok(())
}

async fn secret_names(bucket: &dyn Bucket, keys: &Keys) -> anyhow::Result<Vec<String>> {
    let prefix = keys.secrets_prefix();
    Ok(bucket
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|meta| meta.key.strip_prefix(&prefix).map(str::to_owned))
        .filter(|name| secrets::validate_name(name).is_ok())
        .collect())
}

async fn secret_list(json: bool, target: &Target) -> anyhow::Result<()> {
    let (bucket, keys, _) = target.open().await?;
    let names = secret_names(&*bucket, &keys).await?;
    if json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&names)?));
    } else {
        write_stdout(&names.iter().map(|n| format!("{n}\n")).collect::<String>());
    }
    Ok(())
}

async fn secret_rm(name: &str, target: &Target) -> anyhow::Result<()> {
    secrets::validate_name(name)?;
    let (bucket, keys, app) = target.open().await?;
    let key = keys.secret(name);
    match bucket.head(&key).await {
        Ok(_) => {}
        Err(wasmkeep_bucket::Error::NotFound { .. }) => {
            bail!("app {app} has no secret {name}")
        }
        Err(e) => return Err(e).context("reading the secret"),
    }
    bucket.delete(&key).await.context("deleting the secret")?;
    eprintln!("wasmkeep: secret {name} removed from app {app}");
    Ok(())
}

async fn token_create(tenant: &str, target: &Target) -> anyhow::Result<()> {
    let tenant = TenantName::new(tenant.to_owned())?;
    let (bucket, keys, app) = target.open().await?;
    let token = tenants::new_token();
    let digest = tenants::token_digest(&token);
    let created_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let key = keys.tenant_token(&tenant, &digest);
    let stored = Fenced::new(&*bucket, &key)
        .create(Bytes::from(format!(
            "{}\ncreated_s {created_s}\n",
            tenants::TOKEN_OBJECT_HEADER
        )))
        .await
        .context("storing the token's hash")?;
    match stored {
        Outcome::Done(_) => {}
        // A fresh token's digest is never there before: a conflict (or a
        // lost reply) is told, not taken for success.
        Outcome::Conflict => bail!("storing the token's hash: {key} already exists"),
        Outcome::Gone => bail!("storing the token's hash: the bucket answered not found"),
        Outcome::Unknown(e) => {
            return Err(e).context("storing the token's hash (it may have been stored)");
        }
    }
    eprintln!(
        "wasmkeep: token {} created for tenant {tenant} of app {app}; it is shown only now: send it as `Authorization: Bearer <token>`",
        tenants::token_id(&digest)
    );
    if let Ok(tenants::Policy::Optional) = tenants::read_policy(&*bucket, &keys).await {
        eprintln!(
            "wasmkeep: note: app {app} does not require tenant tokens yet; `wasmkeep tenant policy require` makes every node require them"
        );
    }
    write_stdout(&format!("{token}\n"));
    Ok(())
}

/// The tenant's stored token digests.
async fn token_digests(
    bucket: &dyn Bucket,
    keys: &Keys,
    tenant: &TenantName,
) -> anyhow::Result<Vec<String>> {
    let prefix = keys.tenant_tokens_prefix(tenant);
    Ok(bucket
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|meta| meta.key.strip_prefix(&prefix).map(str::to_owned))
        .collect())
}

async fn token_list(tenant: &str, json: bool, target: &Target) -> anyhow::Result<()> {
    let tenant = TenantName::new(tenant.to_owned())?;
    let (bucket, keys, _) = target.open().await?;
    let ids: Vec<String> = token_digests(&*bucket, &keys, &tenant)
        .await?
        .iter()
        .map(|d| tenants::token_id(d).to_owned())
        .collect();
    if json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&ids)?));
    } else {
        write_stdout(&ids.iter().map(|n| format!("{n}\n")).collect::<String>());
    }
    Ok(())
}

async fn token_revoke(tenant: &str, id: &str, target: &Target) -> anyhow::Result<()> {
    let tenant = TenantName::new(tenant.to_owned())?;
    let id = id.trim().to_ascii_lowercase();
    if id.len() < tenants::TOKEN_ID_CHARS || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{id:?} is not a token id: use the {} hex digits `tenant token list` shows",
            tenants::TOKEN_ID_CHARS
        );
    }
    let (bucket, keys, app) = target.open().await?;
    let matching: Vec<String> = token_digests(&*bucket, &keys, &tenant)
        .await?
        .into_iter()
        .filter(|d| d.starts_with(&id))
        .collect();
    match matching.as_slice() {
        [] => bail!("tenant {tenant} of app {app} has no token {id}"),
        [digest] => {
            bucket
                .delete(&keys.tenant_token(&tenant, digest))
                .await
                .context("deleting the token")?;
            eprintln!(
                "wasmkeep: token {id} of tenant {tenant} revoked; nodes refuse it within {} s",
                tenants::TOKEN_VALID_CACHE.as_secs()
            );
            Ok(())
        }
        _ => bail!("more than one token of tenant {tenant} starts with {id}: give more digits"),
    }
}
