//! TLS: any certificate accepted, and what a simulated device keeps between
//! connections ([`as_device`]): its TLS session tickets, FAST tokens and
//! salted passwords.

use anyhow::Context as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// Accepts any server certificate: benchmarks run against self-signed certs.
#[derive(Debug)]
struct AcceptAny;

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

tokio::task_local! {
    /// The simulated device (user number) the current connection belongs
    /// to ([`as_device`]).
    static DEVICE: u64;
}

/// Runs `f` as user `n`'s device: like a real client, each device keeps
/// its own TLS session tickets and its SCRAM salted password between
/// connections, so its next connection resumes TLS (RFC 8446 §2.2) and
/// skips PBKDF2 (RFC 5802 §5.1). Outside `as_device` nothing is kept per
/// device.
pub async fn as_device<F: std::future::Future>(n: u64, f: F) -> F::Output {
    DEVICE.scope(n, f).await
}

pub(super) fn device() -> Option<u64> {
    DEVICE.try_with(|d| *d).ok()
}

type DeviceMap<T> = std::sync::Mutex<std::collections::HashMap<u64, T>>;

/// FAST tokens kept per device (XEP-0484).
pub(super) static TOKENS: std::sync::LazyLock<DeviceMap<String>> =
    std::sync::LazyLock::new(Default::default);

/// XEP-0484's namespace.
pub(super) const NS_FAST: &str = "urn:xmpp:fast:0";

/// Salted passwords kept per device.
pub(super) static SALTED: std::sync::LazyLock<DeviceMap<starling_proto::sasl::SaltedPassword>> =
    std::sync::LazyLock::new(Default::default);

/// TLS sessions kept per device ([`as_device`]); connections outside a
/// device share one small cache, as rustls does by default.
#[derive(Debug)]
struct PerDeviceSessions {
    devices: DeviceMap<Arc<rustls::client::ClientSessionMemoryCache>>,
    shared: Arc<rustls::client::ClientSessionMemoryCache>,
}

impl PerDeviceSessions {
    fn store(&self) -> Arc<rustls::client::ClientSessionMemoryCache> {
        match device() {
            Some(n) => self
                .devices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(n)
                .or_insert_with(|| Arc::new(rustls::client::ClientSessionMemoryCache::new(1)))
                .clone(),
            None => self.shared.clone(),
        }
    }
}

impl rustls::client::ClientSessionStore for PerDeviceSessions {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.store().set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.store().kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.store().set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.store().tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.store().remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.store().insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.store().take_tls13_ticket(name)
    }
}

/// A TLS connector with the ring provider that accepts self-signed
/// certificates and keeps TLS sessions per device ([`as_device`]).
pub fn tls_connector() -> anyhow::Result<TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::store(Arc::new(PerDeviceSessions {
        devices: Default::default(),
        shared: Arc::new(rustls::client::ClientSessionMemoryCache::new(256)),
    }));
    Ok(TlsConnector::from(Arc::new(cfg)))
}
