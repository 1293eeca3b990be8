//! The `wasmkeep` binary: see `wasmkeep_server::ops::cli`.

use clap::Parser;

/// mimalloc: per-thread heaps, where glibc's arenas made the actors'
/// threads queue on allocator locks (docs/adr/0026-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The index of `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (the
/// test below checks that it holds that option's default, 1,000 ms).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// How long mimalloc keeps memory that became free before giving it back
/// to the system. Its default, a second, held ~20 KiB per busy actor more
/// right after a burst of load; 100 ms costs no measurable CPU where 10 ms
/// and 0 did (docs/adr/0037-memory-of-busy-actors.md).
const PURGE_DELAY_MS: std::ffi::c_long = 100;

unsafe extern "C" {
    /// Sets an option's value unless it was already read (an environment
    /// variable `MIMALLOC_PURGE_DELAY` still overrides it).
    fn mi_option_set_default(option: std::ffi::c_int, value: std::ffi::c_long);
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

fn main() -> std::process::ExitCode {
    // SAFETY: mimalloc's options are plain integers; setting one is
    // thread-safe and valid at any time.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    // While the process has one thread (docs: the module).
    let descriptors = wasmkeep_server::ops::descriptors::prepare();
    let cli = wasmkeep_server::ops::cli::Cli::parse();
    let traces = matches!(
        cli.command,
        wasmkeep_server::ops::cli::Command::Serve(_) | wasmkeep_server::ops::cli::Command::Dev(_)
    );
    if let Err(e) = wasmkeep_server::ops::cli::init_logging(cli.log_format, traces) {
        eprintln!("wasmkeep: error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    wasmkeep_server::ops::cli::warn_misspelt_env();
    tracing::debug!(
        limit_before = descriptors.limit_before,
        limit = descriptors.limit,
        table_slots = descriptors.table_slots,
        "open-file limit raised and descriptor table grown"
    );
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
    let result = runtime.block_on(wasmkeep_server::ops::cli::run(cli));
    // The spans still queued go out before the process ends.
    wasmkeep_server::ops::telemetry::stop();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wasmkeep: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_set_is_mimallocs_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading an option has no preconditions.
        let default = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1000,
            "mimalloc's option {MI_OPTION_PURGE_DELAY} is not the purge delay"
        );
    }
}
