//! The actor's one alarm. Times are milliseconds since the Unix epoch; setting
//! replaces any alarm already set and commits with the current event. When it
//! fires the host calls [`Actor::alarm`](crate::Actor::alarm).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::bindings::wasmkeep::actor::alarm as wit;

/// When the alarm fires next, if one is set.
pub fn get() -> Option<i64> {
    wit::get()
}

/// Sets the alarm for `at_ms` (ms since the Unix epoch); a time in the past fires soon.
pub fn set_at(at_ms: i64) {
    wit::set(at_ms);
}

/// Sets the alarm `delay` from now; returns the time set (ms since the epoch).
pub fn set_in(delay: Duration) -> i64 {
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    let at_ms = now_ms().saturating_add(delay_ms);
    set_at(at_ms);
    at_ms
}

/// Removes the alarm, if one is set.
pub fn clear() {
    wit::clear();
}

/// The wall clock now, in ms since the Unix epoch (WASI's clock).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
