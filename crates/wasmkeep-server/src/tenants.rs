//! Tenant tokens. SKELETON: filled in by the tenants work.

/// Whether client requests must carry their tenant's bearer token.
#[derive(Debug, Default)]
pub struct TenantGate {
    pub required: bool,
}

impl TenantGate {
    pub fn new(required: bool) -> Self {
        Self { required }
    }
}
