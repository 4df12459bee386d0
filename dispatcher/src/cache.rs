//! Endpoints as the dispatcher needs them: status, URL and a ready signer.
//! Loaded from PostgreSQL on a miss, dropped on a lifecycle message, and
//! reloaded after a TTL as a safety net.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use shared::{keys::KeyCipher, model::EndpointStatus, signing::Signer, store::Store};
use url::Url;

/// A loaded endpoint.
#[derive(Debug)]
pub struct Endpoint {
    pub id: String,
    pub status: EndpointStatus,
    pub url: Url,
    pub signer: Signer,
    loaded_at: Instant,
}

/// The cache; cheap to share.
#[derive(Debug)]
pub struct EndpointCache {
    store: Store,
    cipher: Arc<KeyCipher>,
    ttl: Duration,
    entries: Mutex<HashMap<String, Arc<Endpoint>>>,
}

impl EndpointCache {
    /// An empty cache.
    pub fn new(store: Store, cipher: Arc<KeyCipher>, ttl: Duration) -> EndpointCache {
        EndpointCache { store, cipher, ttl, entries: Mutex::default() }
    }

    /// The endpoint, or `None` when it does not exist.
    pub async fn get(&self, id: &str) -> anyhow::Result<Option<Arc<Endpoint>>> {
        if let Some(hit) = self.lock().get(id).filter(|e| e.loaded_at.elapsed() < self.ttl).cloned() {
            return Ok(Some(hit));
        }
        let Some(record) = self.store.load_endpoint(id).await.context("load endpoint")? else {
            return Ok(None);
        };
        let der = self.cipher.open(&record.private_key, record.id.as_bytes()).context("open private key")?;
        let signer = Signer::from_pkcs8_der(&der).context("parse private key")?;
        let url = Url::parse(&record.url).context("stored url")?;
        let endpoint =
            Arc::new(Endpoint { id: record.id, status: record.status, url, signer, loaded_at: Instant::now() });
        self.lock().insert(endpoint.id.clone(), endpoint.clone());
        Ok(Some(endpoint))
    }

    /// The endpoint as the database has it now, bypassing (and refreshing) the
    /// cache: for decisions that cannot be taken back.
    pub async fn reload(&self, id: &str) -> anyhow::Result<Option<Arc<Endpoint>>> {
        self.invalidate(id);
        self.get(id).await
    }

    /// Forgets one endpoint: it changed.
    pub fn invalidate(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Forgets everything: lifecycle messages may have been missed.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Endpoint>>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
