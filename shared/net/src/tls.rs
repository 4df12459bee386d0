//! Which certificates the service trusts, the HTTPS client deliveries go through,
//! and the handshake check run when an endpoint URL is registered.
//!
//! Trust is the system's roots plus the PEM file named by `TLS_EXTRA_ROOTS`. The
//! crypto provider is always aws-lc-rs, passed explicitly, so nothing depends on
//! a process-wide default provider being installed.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use url::{Host, Url};

use crate::guard::{GuardedResolver, TargetError, resolve_target};

/// How long an idle pooled connection to a receiver is kept for reuse.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per receiver host.
const POOL_MAX_IDLE_PER_HOST: usize = 32;

/// The trust anchors for outbound TLS: the system's roots, plus every
/// certificate in the PEM file `extra_roots` (`TLS_EXTRA_ROOTS`) so private CAs
/// and test CAs can be trusted without touching the system store.
///
/// System certificates that cannot be read or parsed are skipped; an extra-roots
/// file that is unreadable, malformed or holds no certificate is an error, since
/// the operator asked for it explicitly.
pub fn root_store(extra_roots: Option<&Path>) -> anyhow::Result<RootCertStore> {
    let mut store = RootCertStore::empty();

    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "skipping an unreadable system certificate source");
    }
    let (added, ignored) = store.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "loaded system trust roots");

    if let Some(path) = extra_roots {
        let pem = std::fs::read(path).with_context(|| format!("reading TLS extra roots {}", path.display()))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("parsing TLS extra roots {}", path.display()))?;
        if certs.is_empty() {
            bail!("TLS extra roots {} holds no certificate", path.display());
        }
        let count = certs.len();
        for cert in certs {
            store.add(cert).with_context(|| format!("adding a root from {}", path.display()))?;
        }
        tracing::debug!(count, path = %path.display(), "loaded extra trust roots");
    }

    if store.is_empty() {
        tracing::warn!("no trusted TLS roots: every delivery and endpoint check will fail");
    }
    Ok(store)
}

/// The TLS client configuration for deliveries and registration probes: safe
/// default protocol versions under aws-lc-rs, certificates verified against
/// `roots`, HTTP/2 offered before HTTP/1.1.
pub fn client_config(roots: RootCertStore) -> anyhow::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The HTTP client deliveries are sent with.
///
/// It follows no redirect (a receiver could bounce a delivery inside), ignores
/// proxy settings from the environment, speaks only HTTPS with `tls`, and
/// resolves through a [`GuardedResolver`]. IP-literal URLs bypass the resolver:
/// check them with [`crate::guard::check_literal_host`] before sending. The
/// `User-Agent` is set per request by the caller.
pub fn delivery_client(
    tls: ClientConfig,
    allow_private: bool,
    total_timeout: Duration,
    connect_timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .https_only(true)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(GuardedResolver::new(allow_private))
        .connect_timeout(connect_timeout)
        .timeout(total_timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .tcp_nodelay(true)
        .build()
        .context("building the delivery HTTP client")
}

/// Why an endpoint URL failed the registration handshake check.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The host did not resolve or is not an allowed target.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// No resolved address accepted a TCP connection.
    #[error("could not connect to the target")]
    Connect(#[source] io::Error),
    /// The TLS handshake with the host (the `String`) failed, usually because its
    /// certificate is not trusted or not valid for it.
    #[error("TLS handshake with {0} failed")]
    Tls(String, #[source] io::Error),
    /// The whole check did not finish in time.
    #[error("the endpoint check timed out")]
    Timeout,
}

impl ProbeError {
    /// A short stable reason, the same vocabulary as DeliveryLog errors.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Target(target) => target.code(),
            Self::Connect(_) => "connect",
            Self::Tls(..) => "tls",
            Self::Timeout => "timeout",
        }
    }

    /// What was wrong, for the API user who registered the URL: the TLS reason
    /// is included so they can fix their certificate, nothing else internal is.
    pub fn message(&self) -> String {
        match self {
            Self::Target(target) => target.message().to_owned(),
            Self::Connect(_) => "could not connect to the url's host and port".to_owned(),
            Self::Timeout => "the url's host did not complete a TLS handshake in time".to_owned(),
            Self::Tls(host, error) => match rustls_error(error) {
                Some(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
                )) => format!("the certificate presented by {host} is not valid for that host"),
                Some(rustls) => format!("the TLS handshake with {host} failed: {}", tls_reason(rustls)),
                None if error.kind() == io::ErrorKind::UnexpectedEof => {
                    format!("{host} closed the connection during the TLS handshake")
                }
                None => format!("the TLS handshake with {host} failed"),
            },
        }
    }
}

/// The rustls error tokio-rustls wrapped in an I/O error, if there is one.
fn rustls_error(error: &io::Error) -> Option<&rustls::Error> {
    crate::guard::causes(error).find_map(|cause| cause.downcast_ref::<rustls::Error>())
}

/// A user-facing reason for a failed handshake.
fn tls_reason(error: &rustls::Error) -> &'static str {
    match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "certificate expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => "certificate not yet valid",
            CertificateError::UnknownIssuer => {
                "unknown issuer: the certificate does not chain to a trusted root (a private CA is trusted by \
                 adding its PEM to TLS_EXTRA_ROOTS)"
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "certificate not valid for the host"
            }
            CertificateError::Revoked => "certificate revoked",
            CertificateError::BadSignature => "bad certificate signature",
            CertificateError::BadEncoding => "malformed certificate",
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                "certificate not valid for server authentication"
            }
            CertificateError::UnsupportedSignatureAlgorithmContext { .. }
            | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                "certificate uses an unsupported signature algorithm"
            }
            CertificateError::Other(other)
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity)) =>
            {
                "the server presents a CA certificate as its own, as a self-signed certificate made with `openssl \
                 req -x509` is: make a CA, list its PEM in TLS_EXTRA_ROOTS, and give the server a certificate \
                 issued by it (for development, `webhooks-api receiver` does all three)"
            }
            _ => "certificate rejected",
        },
        rustls::Error::NoCertificatesPresented => "no certificate presented",
        rustls::Error::PeerIncompatible(_) => "no TLS version or cipher suite in common",
        rustls::Error::AlertReceived(_) => "the server refused the handshake",
        rustls::Error::InvalidMessage(_)
        | rustls::Error::InappropriateMessage { .. }
        | rustls::Error::InappropriateHandshakeMessage { .. }
        | rustls::Error::PeerMisbehaved(_) => "the server did not answer with valid TLS",
        _ => "handshake failed",
    }
}

/// The name the certificate must be valid for: the URL's DNS name or IP address.
fn server_name(url: &Url) -> Result<(String, ServerName<'static>), ProbeError> {
    let host = url.host().ok_or(TargetError::NoHost)?;
    let shown = host.to_string();
    let name = match host {
        Host::Domain(domain) => ServerName::try_from(domain.to_owned())
            .map_err(|error| ProbeError::Tls(shown.clone(), io::Error::new(io::ErrorKind::InvalidInput, error)))?,
        Host::Ipv4(v4) => ServerName::from(std::net::IpAddr::V4(v4)),
        Host::Ipv6(v6) => ServerName::from(std::net::IpAddr::V6(v6)),
    };
    Ok((shown, name))
}

/// Checks at registration that the URL's host answers a TLS handshake with a
/// certificate trusted by `tls` and valid for that host, so a mistyped or
/// misconfigured receiver is reported to the user at once rather than as failed
/// deliveries later.
///
/// The host is resolved and checked like a delivery target, the first address
/// that accepts TCP gets a full handshake, and the connection is closed with a
/// `close_notify`; no HTTP request is sent, so the path need not exist. All of it
/// runs under `timeout`.
pub async fn probe(
    url: &Url,
    tls: Arc<ClientConfig>,
    allow_private: bool,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let (host, name) = server_name(url)?;
    let handshake = async {
        let addrs = resolve_target(url, allow_private).await?;
        let tcp = connect_first(&addrs).await?;
        let mut stream =
            TlsConnector::from(tls).connect(name, tcp).await.map_err(|error| ProbeError::Tls(host, error))?;
        if let Err(error) = stream.shutdown().await {
            tracing::debug!(%error, "closing the endpoint check connection");
        }
        Ok(())
    };
    tokio::time::timeout(timeout, handshake).await.map_err(|_| ProbeError::Timeout)?
}

/// Connects to the addresses in order and keeps the first that answers.
async fn connect_first(addrs: &[std::net::SocketAddr]) -> Result<TcpStream, ProbeError> {
    let mut last_error = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(error) => {
                tracing::debug!(%addr, %error, "endpoint check could not connect");
                last_error = Some(error);
            }
        }
    }
    Err(ProbeError::Connect(
        last_error.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address to connect to")),
    ))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
        Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
    };
    use rustls::ServerConfig;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use super::*;
    use crate::guard::{check_literal_host, classify_reqwest_error};

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// A throwaway CA whose certificate is written to a temporary PEM file,
    /// removed on drop.
    struct TestCa {
        issuer: CertifiedIssuer<'static, KeyPair>,
        pem_path: PathBuf,
    }

    impl TestCa {
        fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, "webhooks test CA");
            params.key_usages =
                vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
            let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
            let pem_path = std::env::temp_dir().join(format!(
                "shared-tls-test-ca-{}-{}.pem",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&pem_path, issuer.pem()).expect("write CA PEM");
            Self { issuer, pem_path }
        }

        fn issuer(&self) -> &Issuer<'static, KeyPair> {
            &self.issuer
        }

        fn client_config(&self) -> Arc<ClientConfig> {
            let roots = root_store(Some(&self.pem_path)).expect("roots");
            Arc::new(client_config(roots).expect("client config"))
        }
    }

    impl Drop for TestCa {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.pem_path);
        }
    }

    struct Leaf {
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    }

    enum Validity {
        Current,
        Expired,
    }

    /// A server certificate for `name`, issued by `issuer` or self-signed.
    fn leaf(name: &str, issuer: Option<&Issuer<'_, KeyPair>>, validity: Validity) -> Leaf {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("params");
        // A subject of its own: the system store may hold a root named after
        // the host (CN=localhost), which would change how a self-signed leaf fails.
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("webhooks test server {name}"));
        params.use_authority_key_identifier_extension = issuer.is_some();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if let Validity::Expired = validity {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = match issuer {
            Some(issuer) => params.signed_by(&key, issuer),
            None => params.self_signed(&key),
        }
        .expect("certificate");
        Leaf {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }

    /// A TLS server on 127.0.0.1:0 presenting `leaf`. It answers any HTTP/1.1
    /// request with 204 and otherwise waits for the client to close.
    async fn tls_server(leaf: Leaf) -> SocketAddr {
        let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(leaf.chain, leaf.key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut stream) = acceptor.accept(tcp).await {
                        let mut request = Vec::new();
                        let mut buf = [0u8; 1024];
                        while let Ok(n @ 1..) = stream.read(&mut buf).await {
                            request.extend_from_slice(&buf[..n]);
                            if request.windows(4).any(|w| w == b"\r\n\r\n") {
                                let _ = stream
                                    .write_all(
                                        b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                                    )
                                    .await;
                                let _ = stream.shutdown().await;
                                break;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    fn url(port: u16) -> Url {
        crate::guard::parse_target_url(&format!("https://localhost:{port}/hooks/not-yet")).expect("url")
    }

    fn tls_message(result: Result<(), ProbeError>) -> String {
        match result {
            Err(err @ ProbeError::Tls(..)) => {
                assert_eq!(err.code(), "tls");
                err.message()
            }
            other => panic!("expected a TLS error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn probe_accepts_a_certificate_from_a_trusted_ca() {
        let ca = TestCa::new();
        let addr = tls_server(leaf("localhost", Some(ca.issuer()), Validity::Current)).await;
        probe(&url(addr.port()), ca.client_config(), true, TIMEOUT).await.expect("valid certificate");
    }

    #[tokio::test]
    async fn probe_refuses_a_self_signed_certificate() {
        let ca = TestCa::new();
        let addr = tls_server(leaf("localhost", None, Validity::Current)).await;
        let message = tls_message(probe(&url(addr.port()), ca.client_config(), true, TIMEOUT).await);
        assert!(message.contains("unknown issuer"), "{message}");
    }

    /// A self-signed server certificate as `openssl req -x509` makes one (a
    /// CA certificate), listed in TLS_EXTRA_ROOTS itself, as a developer
    /// first tries: refused, with why and what to do.
    #[tokio::test]
    async fn a_self_signed_ca_certificate_as_the_servers_is_refused_with_the_fix() {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "webhooks test self-signed");
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("certificate");
        let server = Leaf {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        };
        let pem = std::env::temp_dir().join(format!("shared-tls-self-signed-{}.pem", std::process::id()));
        std::fs::write(&pem, pem::encode(&pem::Pem::new("CERTIFICATE", server.chain[0].to_vec()))).unwrap();
        let roots = root_store(Some(&pem)).expect("roots");
        let config = Arc::new(client_config(roots).expect("client config"));
        let addr = tls_server(server).await;
        let message = tls_message(probe(&url(addr.port()), config, true, TIMEOUT).await);
        let _ = std::fs::remove_file(&pem);
        assert!(message.contains("self-signed") && message.contains("CA"), "{message}");
    }

    #[tokio::test]
    async fn probe_refuses_an_expired_certificate() {
        let ca = TestCa::new();
        let addr = tls_server(leaf("localhost", Some(ca.issuer()), Validity::Expired)).await;
        let message = tls_message(probe(&url(addr.port()), ca.client_config(), true, TIMEOUT).await);
        assert!(message.contains("certificate expired"), "{message}");
    }

    #[tokio::test]
    async fn probe_refuses_a_certificate_for_another_host() {
        let ca = TestCa::new();
        let addr = tls_server(leaf("other.example", Some(ca.issuer()), Validity::Current)).await;
        let message = tls_message(probe(&url(addr.port()), ca.client_config(), true, TIMEOUT).await);
        assert_eq!(message, "the certificate presented by localhost is not valid for that host");
    }

    #[tokio::test]
    async fn probe_refuses_private_targets_unless_allowed() {
        let ca = TestCa::new();
        let addr = tls_server(leaf("localhost", Some(ca.issuer()), Validity::Current)).await;
        let err = probe(&url(addr.port()), ca.client_config(), false, TIMEOUT).await.expect_err("blocked");
        assert!(matches!(err, ProbeError::Target(TargetError::BlockedAddress)), "{err:?}");
        assert_eq!(err.code(), "blocked_address");
    }

    #[tokio::test]
    async fn probe_times_out_on_a_silent_server() {
        let ca = TestCa::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp);
            }
        });
        let err = probe(&url(port), ca.client_config(), true, Duration::from_millis(300)).await.expect_err("times out");
        held.abort();
        assert!(matches!(err, ProbeError::Timeout), "{err:?}");
        assert_eq!(err.code(), "timeout");
    }

    #[tokio::test]
    async fn probe_reports_refused_connections() {
        let ca = TestCa::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = probe(&url(port), ca.client_config(), true, TIMEOUT).await.expect_err("refused");
        assert!(matches!(err, ProbeError::Connect(_)), "{err:?}");
        assert_eq!(err.code(), "connect");
    }

    #[test]
    fn root_store_requires_a_readable_extra_roots_file_with_certificates() {
        let missing = std::env::temp_dir().join("shared-tls-test-no-such-file.pem");
        assert!(root_store(Some(&missing)).is_err());

        let ca = TestCa::new();
        std::fs::write(&ca.pem_path, "not a certificate\n").expect("write");
        assert!(root_store(Some(&ca.pem_path)).is_err());

        let with_ca = TestCa::new();
        let without = root_store(None).expect("system roots").len();
        let with = root_store(Some(&with_ca.pem_path)).expect("roots").len();
        assert_eq!(with, without + 1);
    }

    #[tokio::test]
    async fn delivery_client_posts_and_classifies_failures() {
        let ca = TestCa::new();
        let client = |allow_private| {
            let config = Arc::unwrap_or_clone(ca.client_config());
            delivery_client(config, allow_private, TIMEOUT, TIMEOUT).expect("client")
        };

        let good = tls_server(leaf("localhost", Some(ca.issuer()), Validity::Current)).await;
        let response = client(true).post(url(good.port())).body("{}").send().await.expect("delivered");
        assert_eq!(response.status(), reqwest::StatusCode::NO_CONTENT);

        let err = client(false).post(url(good.port())).send().await.expect_err("resolver refuses localhost");
        assert_eq!(classify_reqwest_error(&err), "blocked_address", "{err:?}");

        let untrusted = tls_server(leaf("localhost", None, Validity::Current)).await;
        let err = client(true).post(url(untrusted.port())).send().await.expect_err("untrusted certificate");
        assert_eq!(classify_reqwest_error(&err), "tls", "{err:?}");

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let closed = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = client(true).post(url(closed)).send().await.expect_err("refused");
        assert_eq!(classify_reqwest_error(&err), "connect", "{err:?}");

        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let silent_port = silent.local_addr().expect("addr").port();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = silent.accept().await {
                held.push(tcp);
            }
        });
        let config = Arc::unwrap_or_clone(ca.client_config());
        let impatient = delivery_client(config, true, Duration::from_millis(300), TIMEOUT).expect("client");
        let err = impatient.post(url(silent_port)).send().await.expect_err("times out");
        held.abort();
        assert_eq!(classify_reqwest_error(&err), "timeout", "{err:?}");

        // reqwest skips the resolver for IP literals: only check_literal_host
        // stands between such a URL and the inside.
        let literal = crate::guard::parse_target_url(&format!("https://127.0.0.1:{}/", good.port())).expect("url");
        assert!(matches!(check_literal_host(&literal, false), Err(TargetError::BlockedAddress)));
    }
}
