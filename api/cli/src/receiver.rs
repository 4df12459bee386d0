//! `webhooks-api receiver`: an HTTPS receiver for development and first runs.
//! It makes a throwaway CA (written to `<dir>/ca.pem`, for the service's
//! `TLS_EXTRA_ROOTS`) and a certificate for `localhost` and `127.0.0.1`,
//! answers every POST with 200, prints one line per delivery, and keeps the
//! last one's headers and raw body (`last-headers.json`, `last-body.json`) so
//! that `webhooks-api verify` can check it. Not for production: it verifies
//! nothing itself and keeps its CA key only in memory.

use std::{net::SocketAddr, path::Path, sync::Arc};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The largest body kept; a delivery is far smaller.
const MAX_BODY: usize = 1024 * 1024;

/// A CA and a server certificate for the loopback names, as a rustls config;
/// the CA's certificate is written to `ca_path`.
fn tls_config(ca_path: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "webhooks-api receiver (development CA)");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?).context("make the CA")?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    let mut leaf = CertificateParams::new(names)?;
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    leaf.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer).context("make the server certificate")?;
    std::fs::write(ca_path, issuer.pem()).with_context(|| format!("write {}", ca_path.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves on `listen` until `shutdown`, keeping files in `dir`.
pub async fn run(listen: SocketAddr, dir: &Path, shutdown: CancellationToken) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("listen on {listen}"))?;
    // The CA is written once the port is ours: a script may wait for the file.
    let acceptor = TlsAcceptor::from(tls_config(&dir.join("ca.pem"))?);
    let addr = listener.local_addr()?;
    eprintln!(
        "receiving on https://localhost:{}/ ; CA certificate in {} (give it to the service as TLS_EXTRA_ROOTS)",
        addr.port(),
        dir.join("ca.pem").display()
    );
    let dir: Arc<Path> = Arc::from(dir);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = shutdown.cancelled() => return Ok(()),
        };
        let (acceptor, dir) = (acceptor.clone(), dir.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else { return };
            let service = service_fn(move |request| answer(request, dir.clone()));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

async fn answer(request: Request<Incoming>, dir: Arc<Path>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (parts, body) = request.into_parts();
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await.map(|c| c.to_bytes()) else {
        return Ok(Response::builder().status(413).body(Full::new(Bytes::new())).unwrap_or_default());
    };
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.into())))
        .collect();
    let kept = std::fs::write(dir.join("last-headers.json"), serde_json::Value::Object(headers.clone()).to_string())
        .and_then(|()| std::fs::write(dir.join("last-body.json"), &body));
    if let Err(error) = kept {
        eprintln!("could not keep the request in {}: {error}", dir.display());
    }
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let id = headers.get("x-webhook-id").or_else(|| headers.get("webhook-id")).and_then(|v| v.as_str());
    let scheme = if headers.contains_key("x-webhook-signature") { "platform" } else { "standard" };
    // One line per delivery on stdout: what this command is asked to print.
    let line = format!(
        "{} {} {} ({} bytes, {scheme} signature)\n",
        parts.method,
        id.unwrap_or("-"),
        event["event_type"].as_str().unwrap_or("-"),
        body.len()
    );
    let mut out = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut out, line.as_bytes()).and_then(|()| std::io::Write::flush(&mut out));
    let reply = Bytes::from_static(b"{\"received\":true}");
    Ok(Response::builder().header("content-type", "application/json").body(Full::new(reply)).unwrap_or_default())
}
