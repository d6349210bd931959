//! TLS: certificate loading or generation, rustls configuration, and the
//! channel-binding data SCRAM-*-PLUS needs.
//!
//! Only the `ring` provider is compiled in and it is passed explicitly, so no
//! process-wide default provider is ever needed.

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use sha2::{Digest, Sha256, Sha384, Sha512};
use starling_proto::sasl::ChannelBindings;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// TLS material shared by all listeners.
#[derive(Clone)]
pub struct TlsContext {
    /// Acceptor for STARTTLS upgrades (no ALPN).
    pub starttls: TlsAcceptor,
    /// Acceptor for direct TLS, offering ALPN `xmpp-client` (XEP-0368).
    pub direct: TlsAcceptor,
    /// RFC 5929 tls-server-end-point data: the hash of our certificate.
    pub server_end_point: Vec<u8>,
    /// Where the certificate came from, for logs.
    pub source: String,
}

impl TlsContext {
    /// Loads the configured certificate, or generates (on first start) and
    /// reuses a self-signed one under `data_dir/tls/`.
    pub fn load_or_generate(
        cert: Option<&Path>,
        key: Option<&Path>,
        data_dir: &Path,
        domains: &[String],
    ) -> anyhow::Result<TlsContext> {
        let (cert_path, key_path) = match (cert, key) {
            (Some(c), Some(k)) => (c.to_owned(), k.to_owned()),
            _ => ensure_self_signed(data_dir, domains)?,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
            .with_context(|| format!("cannot read certificate {}", cert_path.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad PEM in {}", cert_path.display()))?;
        if chain.is_empty() {
            bail!("no certificate found in {}", cert_path.display());
        }
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .with_context(|| format!("cannot read private key {}", key_path.display()))?;
        let server_end_point = server_end_point_hash(&chain[0]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let base = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .with_context(|| {
                format!(
                    "certificate {} does not match key {}",
                    cert_path.display(),
                    key_path.display()
                )
            })?;
        let mut direct = base.clone();
        direct.alpn_protocols = vec![b"xmpp-client".to_vec()];
        Ok(TlsContext {
            starttls: TlsAcceptor::from(Arc::new(base)),
            direct: TlsAcceptor::from(Arc::new(direct)),
            server_end_point,
            source: cert_path.display().to_string(),
        })
    }

    /// The channel bindings available on an established TLS connection.
    /// tls-exporter (RFC 9266) is offered on TLS 1.3 only, where it is
    /// always safe; on TLS 1.2 it would need the extended master secret.
    pub fn bindings(&self, tls: &TlsStream<tokio::net::TcpStream>) -> ChannelBindings {
        let conn = tls.get_ref().1;
        let tls_exporter = if conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3) {
            conn.export_keying_material([0u8; 32], b"EXPORTER-Channel-Binding", None)
                .ok()
                .map(|k| k.to_vec())
        } else {
            None
        };
        ChannelBindings {
            tls_exporter,
            tls_server_end_point: Some(self.server_end_point.clone()),
        }
    }
}

/// RFC 5929 §4.1: hash the certificate with the hash of its signature
/// algorithm, SHA-256 when that is MD5, SHA-1 or SHA-256. The signature
/// algorithm is the certificate's last AlgorithmIdentifier; we look for the
/// OIDs of SHA-384 and SHA-512 based signatures near the end of the DER.
fn server_end_point_hash(cert: &CertificateDer<'_>) -> Vec<u8> {
    const SHA384_OIDS: [&[u8]; 2] = [
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03], // ecdsa-with-SHA384
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c], // sha384WithRSAEncryption
    ];
    const SHA512_OIDS: [&[u8]; 2] = [
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04], // ecdsa-with-SHA512
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d], // sha512WithRSAEncryption
    ];
    let der = cert.as_ref();
    // signatureAlgorithm + signature BIT STRING sit in the last ~600 bytes.
    let tail = &der[der.len().saturating_sub(600)..];
    let contains = |oid: &[u8]| tail.windows(oid.len()).any(|w| w == oid);
    if SHA512_OIDS.iter().any(|o| contains(o)) {
        Sha512::digest(der).to_vec()
    } else if SHA384_OIDS.iter().any(|o| contains(o)) {
        Sha384::digest(der).to_vec()
    } else {
        Sha256::digest(der).to_vec()
    }
}

fn ensure_self_signed(data_dir: &Path, domains: &[String]) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = data_dir.join("tls");
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut names = domains.to_vec();
    for d in domains {
        // Subdomains for services added later (conference., upload.…).
        names.push(format!("*.{d}"));
    }
    let generated = rcgen::generate_simple_self_signed(names).context("generating certificate")?;
    write_private(&key, generated.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert, generated.cert.pem())
        .with_context(|| format!("cannot write {}", cert.display()))?;
    tracing::info!(cert = %cert.display(), "generated a self-signed certificate; set [tls] certificate/private_key for a real one");
    Ok((cert, key))
}

#[cfg(unix)]
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(data)?;
    Ok(())
}

#[cfg(not(unix))]
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, data).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_generated_once_then_reused() {
        let dir =
            std::env::temp_dir().join(format!("starling-tls-{}", starling_proto::random_id(10)));
        let domains = vec!["localhost".to_string()];
        let a = TlsContext::load_or_generate(None, None, &dir, &domains).unwrap();
        let pem1 = std::fs::read(dir.join("tls/cert.pem")).unwrap();
        let b = TlsContext::load_or_generate(None, None, &dir, &domains).unwrap();
        let pem2 = std::fs::read(dir.join("tls/cert.pem")).unwrap();
        assert_eq!(pem1, pem2);
        assert_eq!(a.server_end_point, b.server_end_point);
        assert_eq!(
            a.server_end_point.len(),
            32,
            "P-256/SHA-256 cert hashes with SHA-256"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
