//! TLS for the OTLP receivers and the admin endpoint (rustls, ring): a server certificate,
//! optional client certificates (mTLS), and certificates reloaded without a restart.
//!
//! Edge. [`Tls`] holds the current rustls `ServerConfig` and builds a new one from the files
//! on [`Tls::reload`] (SIGHUP, and every `reload_interval` when a file changed); connections
//! already open keep the configuration they were accepted with. [`Tls::accept`] runs one
//! handshake within a timeout; [`crate::serve`] runs each in its connection's own task, so
//! one slow or hostile client cannot hold up the others.

use crate::config::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener's TLS settings, reloadable.
pub struct Tls {
    config: TlsConfig,
    base_dir: PathBuf,
    alpn: Vec<Vec<u8>>,
    current: RwLock<(Arc<ServerConfig>, Vec<Option<SystemTime>>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("config", &self.config).finish()
    }
}

impl Tls {
    /// Reads the certificate, key and client CA (paths relative to `base_dir`). `alpn` are
    /// the application protocols offered (`h2` for gRPC, `http/1.1` for HTTP).
    ///
    /// # Errors
    /// [`TlsError`] naming the file that cannot be read or used.
    pub fn load(config: &TlsConfig, base_dir: &Path, alpn: &[&[u8]]) -> Result<Tls, TlsError> {
        let tls = Tls {
            config: config.clone(),
            base_dir: base_dir.to_path_buf(),
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            current: RwLock::new((Arc::new(build(config, base_dir, alpn)?), Vec::new())),
        };
        tls.current_mut().1 = tls.stamps();
        Ok(tls)
    }

    fn current_mut(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, (Arc<ServerConfig>, Vec<Option<SystemTime>>)> {
        self.current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![&self.config.cert_file, &self.config.key_file];
        files.extend(self.config.client_ca_file.as_ref());
        files.into_iter().map(|f| self.base_dir.join(f)).collect()
    }

    fn stamps(&self) -> Vec<Option<SystemTime>> {
        self.files()
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// Reads the files again and swaps the configuration new connections get. On error the
    /// previous one stays in force.
    ///
    /// # Errors
    /// As [`Tls::load`].
    pub fn reload(&self) -> Result<(), TlsError> {
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        let fresh = build(&self.config, &self.base_dir, &alpn)?;
        let stamps = self.stamps();
        *self.current_mut() = (Arc::new(fresh), stamps);
        Ok(())
    }

    /// Reloads when a file's modification time changed since the last load; returns
    /// whether it did.
    ///
    /// # Errors
    /// As [`Tls::load`].
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let changed = {
            let current = self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            current.1 != self.stamps()
        };
        if changed {
            self.reload()?;
        }
        Ok(changed)
    }

    /// How often files are checked for change (0: only on SIGHUP).
    pub fn reload_interval(&self) -> Duration {
        self.config.reload_interval
    }

    fn acceptor(&self) -> TlsAcceptor {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        TlsAcceptor::from(Arc::clone(&current.0))
    }
}

/// A certificate, key or client CA file that cannot be used, or a configuration rustls
/// refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file: `cert_file`, `key_file` or `client_ca_file`.
    #[error("{setting} {}: {problem}", path.display())]
    File {
        /// Which setting names it.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The certificate and key together, or the protocol versions.
    #[error("{0}")]
    Config(String),
}

fn build(config: &TlsConfig, base_dir: &Path, alpn: &[&[u8]]) -> Result<ServerConfig, TlsError> {
    let file = |setting: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |problem: &dyn std::fmt::Display| TlsError::File {
            setting,
            path,
            problem: problem.to_string(),
        }
    };
    let cert_file = base_dir.join(&config.cert_file);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|certs| certs.collect())
        .map_err(|e| file("cert_file", &cert_file)(&e))?;
    if certs.is_empty() {
        return Err(file("cert_file", &cert_file)(&"no certificate"));
    }
    let key_file = base_dir.join(&config.key_file);
    let key =
        PrivateKeyDer::from_pem_file(&key_file).map_err(|e| file("key_file", &key_file)(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(format!("TLS versions: {e}")))?;
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let ca = base_dir.join(ca);
            let fail = |e: &dyn std::fmt::Display| file("client_ca_file", &ca)(e);
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&ca).map_err(|e| fail(&e))? {
                let cert = cert.map_err(|e| fail(&e))?;
                roots.add(cert).map_err(|e| fail(&e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| fail(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("cert_file and key_file: {e}")))?;
    server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(server)
}

/// Why a TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The client broke it off or sent what TLS refuses (plain text, a wrong certificate).
    #[error("TLS handshake failed: {0}")]
    Failed(#[from] std::io::Error),
    /// The client did not complete it within [`HANDSHAKE_TIMEOUT`].
    #[error("TLS handshake not completed within {HANDSHAKE_TIMEOUT:?}")]
    TimedOut,
}

impl Tls {
    /// Runs the server side of a TLS handshake on `tcp` with the current configuration,
    /// within [`HANDSHAKE_TIMEOUT`].
    ///
    /// # Errors
    /// [`HandshakeError`].
    pub async fn accept(&self, tcp: TcpStream) -> Result<TlsStream<TcpStream>, HandshakeError> {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor().accept(tcp)).await {
            Ok(accepted) => Ok(accepted?),
            Err(_) => Err(HandshakeError::TimedOut),
        }
    }
}
