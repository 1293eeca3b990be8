//! The app's secrets (ADR 0016), read by name.

/// The secret `name`, or `None` when the app has no such secret.
pub fn get(name: &str) -> Option<String> {
    crate::bindings::wasmkeep::actor::secrets::get(name)
}
