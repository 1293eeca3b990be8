//! TLS with rustls: the listener's certificate and key (`--tls-cert`,
//! `--tls-key`) and the roots that peer certificates are verified against
//! (`--tls-ca`). Configurations are built with an explicit crypto provider so
//! nothing depends on a process-wide default.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Error, Result};

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Every certificate in a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| {
            Error::Tls(format!(
                "cannot read certificates from {}: {e}",
                path.display()
            ))
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls(format!("bad certificate in {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("no certificate in {}", path.display())));
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        Error::Tls(format!(
            "cannot read a private key from {}: {e}",
            path.display()
        ))
    })
}

/// The listener's configuration (HTTP/1.1).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let certs = load_certs(cert)?;
    let key = load_key(key)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(format!("certificate and key do not match: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration for calls to peers: verified against `ca` when given,
/// otherwise against the system's roots.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in load_certs(ca)? {
                roots.add(cert).map_err(|e| {
                    Error::Tls(format!("bad CA certificate in {}: {e}", ca.display()))
                })?;
            }
        }
        None => {
            let found = rustls_native_roots();
            for cert in found {
                // A system root rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    // ALPN is left empty: the HTTP connector sets it for the protocols it enables.
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The system's trust store, read from the usual PEM bundle locations.
fn rustls_native_roots() -> Vec<CertificateDer<'static>> {
    const BUNDLES: [&str; 3] = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ];
    BUNDLES
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .and_then(|p| load_certs(p).ok())
        .unwrap_or_default()
}
