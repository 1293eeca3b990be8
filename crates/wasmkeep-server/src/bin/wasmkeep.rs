//! The `wasmkeep` binary: see `wasmkeep_server::cli`.

use clap::Parser;

/// mimalloc: per-thread heaps, where glibc's arenas made the actors'
/// threads queue on allocator locks (docs/adr/0026-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = wasmkeep_server::cli::Cli::parse();
    wasmkeep_server::cli::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("wasmkeep: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(wasmkeep_server::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wasmkeep: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
