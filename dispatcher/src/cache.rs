//! Endpoints as the dispatcher needs them: status, URL and a ready signer.
//! Loaded from the store on a miss, dropped on a lifecycle message, and
//! reloaded after a TTL as a safety net.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use url::Url;
use webhooks_keys::{KeyCipher, signer::EndpointSigner, signer::KeySigner};
use webhooks_model::EndpointStatus;
use webhooks_store::{EndpointRecord, Store};

/// A loaded endpoint.
#[derive(Debug)]
pub struct Endpoint {
    pub id: String,
    pub status: EndpointStatus,
    pub url: Url,
    pub signer: EndpointSigner,
    /// Its pace: at most this many attempts per second, across dispatchers.
    pub rate_limit_per_second: Option<u32>,
    loaded_at: Instant,
}

impl Endpoint {
    /// The endpoint of `record` ready to sign: its keys opened with `cipher`.
    /// Also what a test event (`POST /webhooks/{id}/test`) is sent with.
    pub fn load(record: EndpointRecord, cipher: &KeyCipher) -> anyhow::Result<Endpoint> {
        let open = |sealed: &[u8]| cipher.open(sealed, record.id.as_bytes()).context("open private key");
        let current =
            KeySigner::load(record.signature_scheme, &open(&record.private_key)?).context("parse private key")?;
        // The replaced key signs until its overlap ends; the signer checks the
        // time on every attempt, so a cached entry stops on time.
        let previous = match &record.previous_key {
            Some(key) => Some((
                KeySigner::load(key.scheme, &open(&key.private_key)?).context("parse previous private key")?,
                key.expires_at,
            )),
            None => None,
        };
        let signer = EndpointSigner::new(current, previous);
        let url = Url::parse(&record.url).context("stored url")?;
        Ok(Endpoint {
            id: record.id,
            status: record.status,
            url,
            signer,
            rate_limit_per_second: record.rate_limit_per_second,
            loaded_at: Instant::now(),
        })
    }
}

/// The cache; cheap to share.
#[derive(Debug)]
pub struct EndpointCache {
    store: Store,
    cipher: Arc<KeyCipher>,
    ttl: Duration,
    entries: Mutex<Entries>,
}

/// The cached endpoints, and how many invalidations there have been: a load
/// that an invalidation overtook (read from the database before the change,
/// inserted after its invalidation) must not be cached, or the old state
/// would stand until the TTL.
#[derive(Debug, Default)]
struct Entries {
    endpoints: HashMap<String, Arc<Endpoint>>,
    epoch: u64,
}

impl EndpointCache {
    /// An empty cache.
    pub fn new(store: Store, cipher: Arc<KeyCipher>, ttl: Duration) -> EndpointCache {
        EndpointCache { store, cipher, ttl, entries: Mutex::default() }
    }

    /// The endpoint, or `None` when it does not exist or is deleted (then its
    /// messages are cancelled).
    pub async fn get(&self, id: &str) -> anyhow::Result<Option<Arc<Endpoint>>> {
        let epoch = {
            let entries = self.lock();
            if let Some(hit) = entries.endpoints.get(id).filter(|e| e.loaded_at.elapsed() < self.ttl) {
                return Ok(Some(hit.clone()));
            }
            entries.epoch
        };
        let Some(record) = self.store.load_endpoint(id).await.context("load endpoint")? else {
            return Ok(None);
        };
        // A deleted endpoint has no private key left to open (deleting
        // overwrites it), and nothing is sent to it: gone, as if missing.
        if record.status == EndpointStatus::Deleted {
            return Ok(None);
        }
        let endpoint = Arc::new(Endpoint::load(record, &self.cipher)?);
        self.insert_unless_overtaken(epoch, endpoint.clone());
        Ok(Some(endpoint))
    }

    /// Caches `endpoint`, loaded when the cache was at `epoch`, unless an
    /// invalidation came since: then this load may predate the change, and the
    /// next `get` loads again.
    fn insert_unless_overtaken(&self, epoch: u64, endpoint: Arc<Endpoint>) {
        let mut entries = self.lock();
        if entries.epoch == epoch {
            entries.endpoints.insert(endpoint.id.clone(), endpoint);
        }
    }

    /// The endpoint as the database has it now, bypassing (and refreshing) the
    /// cache: for decisions that cannot be taken back.
    pub async fn reload(&self, id: &str) -> anyhow::Result<Option<Arc<Endpoint>>> {
        // Not an invalidation: nothing changed that other loads could miss,
        // so loads in flight elsewhere may still be cached.
        self.lock().endpoints.remove(id);
        self.get(id).await
    }

    /// Forgets one endpoint: it changed.
    pub fn invalidate(&self, id: &str) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.endpoints.remove(id);
    }

    /// Forgets everything: lifecycle messages may have been missed.
    pub fn clear(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.endpoints.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;
    use webhooks_model::EventEpoch;
    use webhooks_store::{EndpointChange, EndpointUpdate, NewEndpoint};

    use super::*;

    /// A store in a directory of its own with one active endpoint whose key
    /// is sealed by `cipher`: the store, the directory, the developer and
    /// the endpoint's id.
    async fn store_with_endpoint(cipher: &KeyCipher) -> (Store, std::path::PathBuf, Uuid, String) {
        let dir = std::env::temp_dir().join(format!("webhooks-cache-{}", Uuid::new_v4().simple()));
        let (store, _) = webhooks_store::open::standalone(&dir).await.unwrap();
        let pair = webhooks_keys::generate_rsa_2048().unwrap();
        let (developer_id, id) = (Uuid::new_v4(), format!("wep_{}", Uuid::new_v4().simple()));
        let new = NewEndpoint {
            signature_scheme: webhooks_model::SignatureScheme::Platform,
            rate_limit_per_second: None,
            ordering: webhooks_model::DeliveryOrder::None,
            id: id.clone(),
            developer_id,
            url: "https://receiver.example/hook".into(),
            event_epoch: EventEpoch::WebhookCreation,
            event_categories: Vec::new(),
            event_types: Vec::new(),
            public_key_pem: pair.public_key_pem,
            private_key: cipher.seal(&pair.private_pkcs8_der, id.as_bytes()).unwrap(),
        };
        store.create_endpoint(new, 5, BY).await.unwrap().unwrap();
        let activate = EndpointUpdate { status: Some(EndpointStatus::Active), ..EndpointUpdate::default() };
        store.update_endpoint(developer_id, &id, activate, BY).await.unwrap();
        (store, dir, developer_id, id)
    }

    const BY: EndpointChange = EndpointChange { api_key_id: Some(Uuid::nil()) };

    #[tokio::test]
    async fn a_load_overtaken_by_an_invalidation_is_not_cached() {
        let cipher = Arc::new(KeyCipher::new(None).unwrap());
        let (store, dir, developer_id, id) = store_with_endpoint(&cipher).await;
        let cache = EndpointCache::new(store.clone(), cipher, Duration::from_secs(3600));

        // A load that started before a change and ends after its invalidation.
        let loaded = cache.get(&id).await.unwrap().unwrap();
        let epoch_at_read = cache.lock().epoch;
        let disable = EndpointUpdate { status: Some(EndpointStatus::Disabled), ..EndpointUpdate::default() };
        store.update_endpoint(developer_id, &id, disable, BY).await.unwrap();
        cache.invalidate(&id);
        cache.insert_unless_overtaken(epoch_at_read, loaded);
        assert!(cache.lock().endpoints.is_empty(), "the stale load was cached");
        assert_eq!(cache.get(&id).await.unwrap().unwrap().status, EndpointStatus::Disabled);

        // A load nothing overtook stays cached.
        assert!(cache.lock().endpoints.contains_key(&id));
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_deleted_endpoint_is_gone_without_opening_its_key() {
        let cipher = Arc::new(KeyCipher::new(None).unwrap());
        let (store, dir, developer_id, id) = store_with_endpoint(&cipher).await;
        let cache = EndpointCache::new(store.clone(), cipher, Duration::from_secs(3600));
        assert!(cache.get(&id).await.unwrap().is_some());

        // Deleting overwrites the key; the endpoint is then gone (its
        // messages are cancelled), not unreadable (which would park them
        // for ever).
        store.delete_endpoint(developer_id, &id, BY).await.unwrap().unwrap();
        assert!(store.load_endpoint(&id).await.unwrap().unwrap().private_key.is_empty());
        assert!(cache.reload(&id).await.unwrap().is_none());
        assert!(cache.get(&id).await.unwrap().is_none());
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
