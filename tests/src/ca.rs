//! A throwaway certificate authority, handed to the system under test through
//! `TLS_EXTRA_ROOTS`, and the server certificates receivers present: issued by
//! it, expired, for another host, or self-signed.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::random_suffix;

/// The names a receiver's certificate is valid for by default: the host of
/// [`crate::Receiver::url`] and the loopback literals.
pub const LOCAL_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// A CA whose certificate sits in a temporary PEM file, removed on drop.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pem_path: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("pem_path", &self.pem_path).finish_non_exhaustive()
    }
}

/// How a server certificate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid now.
    Current,
    /// Valid only in 2000.
    Expired,
}

impl TestCa {
    /// A fresh CA, its certificate written to a unique temporary file.
    pub fn new() -> anyhow::Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("webhooks test CA {}", random_suffix()));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?).context("make the test CA")?;
        let pem_path =
            std::env::temp_dir().join(format!("webhooks-test-ca-{}-{}.pem", std::process::id(), random_suffix()));
        std::fs::write(&pem_path, issuer.pem()).with_context(|| format!("write {}", pem_path.display()))?;
        Ok(TestCa { issuer, pem_path })
    }

    /// The PEM file to pass as `TLS_EXTRA_ROOTS`.
    pub fn pem_path(&self) -> &Path {
        &self.pem_path
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A current certificate for `names` (DNS names or IP literals), issued by this CA.
    pub fn issue(&self, names: &[&str]) -> ServerCert {
        leaf(names, Some(&self.issuer), Validity::Current)
    }

    /// A certificate for `names` issued by this CA that expired long ago.
    pub fn issue_expired(&self, names: &[&str]) -> ServerCert {
        leaf(names, Some(&self.issuer), Validity::Expired)
    }

    /// A certificate from this CA for a host other than the receiver's.
    pub fn issue_for_other_host(&self) -> ServerCert {
        self.issue(&["other.example"])
    }

    /// A current certificate for `names` that signs itself: no trusted root vouches for it.
    pub fn self_signed(names: &[&str]) -> ServerCert {
        leaf(names, None, Validity::Current)
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pem_path);
    }
}

/// A server certificate chain and its private key.
#[derive(Debug)]
pub struct ServerCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl ServerCert {
    /// A rustls server configuration presenting this certificate (HTTP/1.1 only).
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .context("server certificate")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn leaf(names: &[&str], issuer: Option<&CertifiedIssuer<'static, KeyPair>>, validity: Validity) -> ServerCert {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names.clone()).expect("certificate names");
    params.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    params.use_authority_key_identifier_extension = issuer.is_some();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // rcgen's default validity (1975 to 4096) is current.
    if validity == Validity::Expired {
        params.not_before = date_time_ymd(2000, 1, 1);
        params.not_after = date_time_ymd(2000, 12, 31);
    }
    let key = KeyPair::generate().expect("key pair");
    let cert = match issuer {
        Some(issuer) => params.signed_by(&key, issuer),
        None => params.self_signed(&key),
    }
    .expect("certificate");
    ServerCert {
        chain: vec![cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}
