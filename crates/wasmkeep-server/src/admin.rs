//! `wasmkeep secret …` and `wasmkeep tenant …`. SKELETON: filled in by the
//! secrets and tenants work.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum SecretCommand {}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {}

pub async fn secret(command: SecretCommand) -> anyhow::Result<()> {
    match command {}
}

pub async fn tenant(command: TenantCommand) -> anyhow::Result<()> {
    match command {}
}
