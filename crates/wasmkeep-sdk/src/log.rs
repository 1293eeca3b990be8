//! Logging through the host, which tags each line with the actor's id.
//!
//! Functions take a message (`log::info("started")`); the macros format
//! (`log::info!("count is {n}")`).

pub use crate::bindings::wasmkeep::actor::log::Level;

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    crate::bindings::wasmkeep::actor::log::log(level, message);
}

pub fn trace(message: &str) {
    log(Level::Trace, message);
}

pub fn debug(message: &str) {
    log(Level::Debug, message);
}

pub fn info(message: &str) {
    log(Level::Info, message);
}

pub fn warn(message: &str) {
    log(Level::Warn, message);
}

pub fn error(message: &str) {
    log(Level::Error, message);
}

#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_log {
    ($level:ident, $($arg:tt)+) => {
        $crate::log::log($crate::log::Level::$level, &::std::format!($($arg)+))
    };
}

/// `log::trace!("...", args)`
#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_trace { ($($arg:tt)+) => { $crate::__wasmkeep_log!(Trace, $($arg)+) }; }
/// `log::debug!("...", args)`
#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_debug { ($($arg:tt)+) => { $crate::__wasmkeep_log!(Debug, $($arg)+) }; }
/// `log::info!("...", args)`
#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_info { ($($arg:tt)+) => { $crate::__wasmkeep_log!(Info, $($arg)+) }; }
/// `log::warn!("...", args)`
#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_warn { ($($arg:tt)+) => { $crate::__wasmkeep_log!(Warn, $($arg)+) }; }
/// `log::error!("...", args)`
#[doc(hidden)]
#[macro_export]
macro_rules! __wasmkeep_error { ($($arg:tt)+) => { $crate::__wasmkeep_log!(Error, $($arg)+) }; }

#[doc(inline)]
pub use crate::{
    __wasmkeep_debug as debug, __wasmkeep_error as error, __wasmkeep_info as info,
    __wasmkeep_trace as trace, __wasmkeep_warn as warn,
};
