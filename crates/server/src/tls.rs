//! TLS: certificate loading or generation, rustls configuration, and the
//! channel-binding data SCRAM-*-PLUS needs.
//!
//! Only the `ring` provider is compiled in and it is passed explicitly, so no
//! process-wide default provider is ever needed.

use crate::transport::tls::{note_chosen_certificate, ExporterCapture, TlsAcceptor, TlsStream};
use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sha2::{Digest, Sha256, Sha384, Sha512};
use starling_core::Env;
use starling_proto::sasl::ChannelBindings;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};

/// TLS material shared by all listeners.
#[derive(Clone)]
pub struct TlsContext {
    /// Acceptor for STARTTLS upgrades (no ALPN).
    pub starttls: TlsAcceptor,
    /// Acceptor for direct TLS, offering ALPN `xmpp-client` (XEP-0368).
    pub direct: TlsAcceptor,
    /// Acceptor for the HTTPS listeners (ALPN `http/1.1`).
    pub http: TlsAcceptor,
    /// RFC 5929 tls-server-end-point data: the hash of the default
    /// certificate (a connection that got another one by SNI has that
    /// one's hash in its stream).
    pub server_end_point: Vec<u8>,
    /// Where the default certificate came from, for logs.
    pub source: String,
    /// Picks the certificate of each handshake by SNI (every listener's
    /// configuration shares it).
    pub resolver: Arc<SniResolver>,
}

impl TlsContext {
    /// Loads the configured certificate, or generates (on first start) and
    /// reuses a self-signed one under `data_dir/tls/`. Domains added at
    /// run time get theirs by SNI ([`SniResolver`]).
    pub fn load_or_generate(
        cert: Option<&Path>,
        key: Option<&Path>,
        data_dir: &Path,
        domains: &[String],
    ) -> anyhow::Result<TlsContext> {
        let (cert_path, key_path) = match (cert, key) {
            (Some(c), Some(k)) => (c.to_owned(), k.to_owned()),
            _ => ensure_self_signed(data_dir, domains, unix_now())?,
        };
        Self::load_with(&cert_path, &key_path, Some(data_dir))
    }

    /// Loads a PEM certificate chain and its private key and checks that
    /// they match (what `run` does, and `check-config` too).
    pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<TlsContext> {
        Self::load_with(cert_path, key_path, None)
    }

    /// [`TlsContext::load`], with the data directory under which domains'
    /// self-signed certificates are kept (`tls/domains/<domain>/`).
    fn load_with(
        cert_path: &Path,
        key_path: &Path,
        data_dir: Option<&Path>,
    ) -> anyhow::Result<TlsContext> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let default = ServedCert::load(&provider, cert_path, key_path)?;
        let server_end_point = default.end_point.to_vec();
        let resolver = Arc::new(SniResolver {
            default_facts: CertificateFacts::from_pem_file(cert_path).ok(),
            default: Arc::new(default),
            provider: provider.clone(),
            data_dir: data_dir.map(Path::to_owned),
            env: std::sync::OnceLock::new(),
            cache: RwLock::new(HashMap::new()),
        });
        let base = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        // Stateless TLS 1.3 session tickets (ChaCha20-Poly1305 under keys
        // rotated every 6 h, rustls' recommended ticketer): a reconnecting
        // client resumes without the certificate signature and holds no
        // server memory. rustls' default instead keeps a 256-entry session
        // cache, too small for a server. One ticket per handshake: a
        // client reconnects one connection at a time, and each resumption
        // brings a fresh ticket (fewer bytes on slow links). rustls
        // resumes a ticket only for the server name it was issued for.
        let mut base = base;
        // Keeps the exporter secret for the tls-exporter channel binding
        // (see transport/tls.rs); logs nothing.
        base.key_log = Arc::new(ExporterCapture);
        base.ticketer = rustls::crypto::ring::Ticketer::new().context("TLS session tickets")?;
        base.send_tls13_tickets = 1;
        let mut direct = base.clone();
        direct.alpn_protocols = vec![b"xmpp-client".to_vec()];
        let mut http = base.clone();
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsContext {
            http: TlsAcceptor::new(Arc::new(http)),
            starttls: TlsAcceptor::new(Arc::new(base)),
            direct: TlsAcceptor::new(Arc::new(direct)),
            server_end_point,
            source: cert_path.display().to_string(),
            resolver,
        })
    }

    /// The channel bindings available on an established TLS connection.
    /// tls-exporter (RFC 9266) is offered on TLS 1.3 only, where it is
    /// always safe; on TLS 1.2 it would need the extended master secret.
    pub fn bindings(&self, tls: &mut TlsStream) -> ChannelBindings {
        ChannelBindings {
            tls_exporter: tls.tls_exporter(),
            tls_server_end_point: Some(match tls.server_end_point() {
                Some(h) => h.to_vec(),
                None => self.server_end_point.clone(),
            }),
        }
    }
}

/// One certificate ready to present, with its RFC 5929
/// tls-server-end-point hash.
#[derive(Debug)]
pub struct ServedCert {
    key: Arc<CertifiedKey>,
    end_point: Arc<[u8]>,
}

impl ServedCert {
    fn load(
        provider: &rustls::crypto::CryptoProvider,
        cert_path: &Path,
        key_path: &Path,
    ) -> anyhow::Result<ServedCert> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
            .with_context(|| format!("cannot read certificate {}", cert_path.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad PEM in {}", cert_path.display()))?;
        if chain.is_empty() {
            bail!("no certificate found in {}", cert_path.display());
        }
        let key = PrivateKeyDer::from_pem_file(key_path)
            .with_context(|| format!("cannot read private key {}", key_path.display()))?;
        let end_point: Arc<[u8]> = server_end_point_hash(&chain[0]).into();
        let key = CertifiedKey::from_der(chain, key, provider).with_context(|| {
            format!(
                "certificate {} does not match key {}",
                cert_path.display(),
                key_path.display()
            )
        })?;
        Ok(ServedCert {
            key: Arc::new(key),
            end_point,
        })
    }
}

/// The certificate of each TLS handshake, by SNI, on every listener
/// (STARTTLS, direct TLS, HTTPS; docs/domains.md):
///
/// 1. the default certificate (`[tls]`, or the generated one for the
///    configured domains) when it covers the name;
/// 2. else, when the name is a served domain or a service under one
///    (`conference.<domain>`), that domain's own certificate files
///    (`certificate`/`private_key` in its settings), else its self-signed
///    certificate under `data_dir/tls/domains/<domain>/` (made when the
///    domain was added, or here if missing);
/// 3. else (no SNI, an unknown name) the default certificate.
///
/// A domain's certificate is loaded on its first handshake and cached
/// (a domain that nobody connects to costs nothing); the domain service
/// forgets it when the domain's settings change or it goes.
#[derive(Debug)]
pub struct SniResolver {
    default: Arc<ServedCert>,
    default_facts: Option<CertificateFacts>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    data_dir: Option<PathBuf>,
    /// The served domains and their settings (set once the `Env` exists).
    env: std::sync::OnceLock<Weak<Env>>,
    cache: RwLock<HashMap<String, Arc<ServedCert>>>,
}

impl SniResolver {
    /// Gives the resolver the served domains (at start, once).
    pub fn set_env(&self, env: &Arc<Env>) {
        let _ = self.env.set(Arc::downgrade(env));
    }

    /// Drops the cached certificate of `domain` (its settings changed, or
    /// it is no longer served).
    pub fn forget(&self, domain: &str) {
        self.cache
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(domain);
    }

    /// True if the default certificate covers `name`.
    pub fn default_covers(&self, name: &str) -> bool {
        self.default_facts.as_ref().is_some_and(|f| f.covers(name))
    }

    /// How many domain certificates are loaded.
    pub fn cached(&self) -> usize {
        self.cache.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The certificate for server name `name` (lower case).
    fn pick(&self, name: &str) -> Arc<ServedCert> {
        if self.default_covers(name) {
            return self.default.clone();
        }
        let Some(env) = self.env.get().and_then(Weak::upgrade) else {
            return self.default.clone();
        };
        // The served domain the name is, or a service's parent domain.
        let (domain, host) = match env.hosts.get(name) {
            Some(h) => (name, h),
            None => match name
                .split_once('.')
                .and_then(|(_, parent)| Some((parent, env.hosts.get(parent)?)))
            {
                Some(found) => found,
                None => return self.default.clone(),
            },
        };
        if let Some(c) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
        {
            return c.clone();
        }
        // First handshake for this domain: two small files read (and, if
        // they are missing, a P-256 key made), once; then cached.
        let loaded = match host.settings.certificate_pair() {
            Some((cert, key)) => ServedCert::load(&self.provider, cert, key),
            None => match &self.data_dir {
                Some(dir) => ensure_domain_certificate(dir, domain, unix_now())
                    .and_then(|(c, k)| ServedCert::load(&self.provider, &c, &k)),
                None => return self.default.clone(),
            },
        };
        match loaded {
            Ok(c) => {
                let c = Arc::new(c);
                self.cache
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(domain.to_owned(), c.clone());
                c
            }
            Err(e) => {
                tracing::warn!(domain, error = %format!("{e:#}"), "cannot load the domain's certificate; presenting the default one");
                self.default.clone()
            }
        }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let chosen = match hello.server_name() {
            Some(name) => self.pick(&name.to_ascii_lowercase()),
            None => self.default.clone(),
        };
        // For this connection's tls-server-end-point binding: the
        // handshake step runs on this thread (transport/tls.rs).
        note_chosen_certificate(chosen.end_point.clone());
        Some(chosen.key.clone())
    }
}

/// The directory of a domain's self-signed certificate. `domain` must be
/// a validated domain name (`domains::validate_name`: no `/`, no empty
/// label, so no `..`).
pub fn domain_certificate_dir(data_dir: &Path, domain: &str) -> PathBuf {
    data_dir.join("tls").join("domains").join(domain)
}

/// Makes (or keeps, while valid) the self-signed certificate of a domain
/// added at run time: CN and SANs `domain` and `*.domain`, one year, the
/// key 0600 in a 0700 directory `data_dir/tls/domains/<domain>/`.
pub fn ensure_domain_certificate(
    data_dir: &Path,
    domain: &str,
    now: i64,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    if domain.is_empty() || domain.contains(['/', '\\', '\0']) || domain.starts_with('.') {
        bail!("{domain:?} is not a domain name");
    }
    let dir = domain_certificate_dir(data_dir, domain);
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let domains = [domain.to_owned()];
    if cert.exists() && key.exists() && renewal_reason(&cert, &domains, now).is_none() {
        return Ok((cert, key));
    }
    generate_self_signed(&dir, &domains, now)?;
    Ok((cert, key))
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

/// A generated certificate is replaced when it expires within this long.
const RENEW_BEFORE_SECS: i64 = 7 * 86_400;
/// Validity of a generated certificate.
const GENERATED_VALIDITY_SECS: i64 = 365 * 86_400;

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// What a certificate says about itself, for checks before use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateFacts {
    /// The subject's common name, if any.
    pub common_name: Option<String>,
    /// DNS names among the subject alternative names.
    pub dns_names: Vec<String>,
    /// Validity start, Unix seconds.
    pub not_before: i64,
    /// Validity end, Unix seconds.
    pub not_after: i64,
}

impl CertificateFacts {
    /// Parses the first certificate of a PEM file.
    pub fn from_pem_file(path: &Path) -> anyhow::Result<CertificateFacts> {
        let der = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read certificate {}", path.display()))?
            .next()
            .with_context(|| format!("no certificate found in {}", path.display()))?
            .with_context(|| format!("bad PEM in {}", path.display()))?;
        Self::from_der(&der).with_context(|| format!("{}", path.display()))
    }

    /// Parses one DER certificate.
    pub fn from_der(der: &[u8]) -> anyhow::Result<CertificateFacts> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| anyhow::anyhow!("not an X.509 certificate: {e}"))?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let mut dns_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(n) = name {
                    dns_names.push((*n).to_owned());
                }
            }
        }
        Ok(CertificateFacts {
            common_name,
            dns_names,
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// True if a DNS name of the certificate matches `domain` (RFC 6125
    /// §6.4: equal ignoring case, or a `*` as the whole leftmost label).
    pub fn covers(&self, domain: &str) -> bool {
        let domain = domain.trim_end_matches('.');
        self.dns_names.iter().any(|n| {
            let n = n.trim_end_matches('.');
            if n.eq_ignore_ascii_case(domain) {
                return true;
            }
            match (n.strip_prefix("*."), domain.split_once('.')) {
                (Some(rest), Some((label, parent))) => {
                    !label.is_empty() && rest.eq_ignore_ascii_case(parent)
                }
                _ => false,
            }
        })
    }

    /// The configured domains this certificate does not cover.
    pub fn uncovered<'a>(&self, domains: &'a [String]) -> Vec<&'a str> {
        domains
            .iter()
            .map(String::as_str)
            .filter(|d| !self.covers(d))
            .collect()
    }
}

/// Why a generated certificate must be made anew, if it must.
fn renewal_reason(cert: &Path, domains: &[String], now: i64) -> Option<&'static str> {
    match CertificateFacts::from_pem_file(cert) {
        Err(_) => Some("unreadable"),
        Ok(f) if f.not_after <= now => Some("expired"),
        Ok(f) if f.not_after - now < RENEW_BEFORE_SECS => Some("expires_soon"),
        Ok(f) if !f.uncovered(domains).is_empty() => Some("domains_changed"),
        Ok(_) => None,
    }
}

fn ensure_self_signed(
    data_dir: &Path,
    domains: &[String],
    now: i64,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = data_dir.join("tls");
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        match renewal_reason(&cert, domains, now) {
            None => return Ok((cert, key)),
            Some(reason) => {
                tracing::info!(cert = %cert.display(), reason, "regenerating the self-signed certificate");
            }
        }
    }
    generate_self_signed(&dir, domains, now)?;
    tracing::info!(cert = %cert.display(), domains = ?domains, valid_days = GENERATED_VALIDITY_SECS / 86_400, "generated a self-signed certificate; set [tls] certificate/private_key for a real one");
    Ok((cert, key))
}

/// Writes `cert.pem` and `key.pem` (0600) into `dir` (made 0700): a
/// self-signed certificate for `domains` and their subdomains
/// (`*.domain`), CN the first domain, valid one year.
fn generate_self_signed(dir: &Path, domains: &[String], now: i64) -> anyhow::Result<()> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    starling_storage::fsperm::create_private_dir_all(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut names = domains.to_vec();
    for d in domains {
        // Subdomains for services added later (conference., upload.…).
        names.push(format!("*.{d}"));
    }
    let mut params = rcgen::CertificateParams::new(names).context("certificate names")?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(
        rcgen::DnType::CommonName,
        domains.first().map_or("localhost", String::as_str),
    );
    params.distinguished_name = dn;
    let at = |secs: i64| {
        x509_parser::time::ASN1Time::from_timestamp(secs)
            .map(|t| t.to_datetime())
            .context("certificate validity")
    };
    // An hour back: clients whose clock is a little behind accept it too.
    params.not_before = at(now - 3600)?;
    params.not_after = at(now + GENERATED_VALIDITY_SECS)?;
    let signing_key = rcgen::KeyPair::generate().context("generating a key")?;
    let generated = params
        .self_signed(&signing_key)
        .context("generating certificate")?;
    write_private(&key, signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert, generated.pem())
        .with_context(|| format!("cannot write {}", cert.display()))?;
    Ok(())
}

#[cfg(unix)]
pub(crate) fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
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
pub(crate) fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
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

    fn temp() -> PathBuf {
        std::env::temp_dir().join(format!("starling-tls-{}", starling_proto::random_id(10)))
    }

    /// Issue 9: the generated certificate was "rcgen self signed cert",
    /// valid 1975-4096.
    #[test]
    fn self_signed_names_the_domain_and_lasts_a_year() {
        let dir = temp();
        let domains = vec!["example.org".to_string(), "chat.example.net".to_string()];
        let now = unix_now();
        let (cert, _) = ensure_self_signed(&dir, &domains, now).unwrap();
        let f = CertificateFacts::from_pem_file(&cert).unwrap();
        assert_eq!(f.common_name.as_deref(), Some("example.org"));
        for d in ["example.org", "chat.example.net", "conference.example.org"] {
            assert!(f.covers(d), "{d}: {f:?}");
        }
        assert!(!f.covers("example.com") && !f.covers("a.b.example.org"));
        assert!((now - 3700..=now).contains(&f.not_before), "{f:?}");
        let year = 365 * 86_400;
        assert!(
            (now + year - 60..=now + year + 60).contains(&f.not_after),
            "{f:?}"
        );
        TlsContext::load_or_generate(None, None, &dir, &domains).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn self_signed_regenerated_when_expiring_or_domains_change() {
        let dir = temp();
        let domains = vec!["example.org".to_string()];
        let year = 365 * 86_400;
        // Generated "a year ago": it expires within 7 days now.
        let (cert, _) = ensure_self_signed(&dir, &domains, unix_now() - year + 86_400).unwrap();
        let old = std::fs::read(&cert).unwrap();
        let now = unix_now();
        assert_eq!(renewal_reason(&cert, &domains, now), Some("expires_soon"));
        ensure_self_signed(&dir, &domains, now).unwrap();
        let renewed = std::fs::read(&cert).unwrap();
        assert_ne!(old, renewed);
        assert!(CertificateFacts::from_pem_file(&cert).unwrap().not_after > now + year - 60);
        // Kept while valid and covering the domains.
        ensure_self_signed(&dir, &domains, now).unwrap();
        assert_eq!(renewed, std::fs::read(&cert).unwrap());
        assert_eq!(renewal_reason(&cert, &domains, now + year), Some("expired"));
        let more = vec!["example.org".to_string(), "example.net".to_string()];
        assert_eq!(renewal_reason(&cert, &more, now), Some("domains_changed"));
        std::fs::write(&cert, "garbage").unwrap();
        assert_eq!(renewal_reason(&cert, &domains, now), Some("unreadable"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
