//! A fresh PostgreSQL database per test, dropped when the test is done.

use anyhow::Context;
use sqlx::{Connection, Executor, PgConnection};

use crate::{block_on_aside, random_suffix};

/// Where databases are created and dropped from, unless `TEST_DATABASE_ADMIN_URL`
/// says otherwise.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The maintenance database URL tests create their databases through.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_ADMIN_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// A database made for one test (`wh_t_<random>`). Dropped, with whatever
/// connections remain, by [`TestDatabase::remove`] or else on `Drop`.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
    removed: bool,
}

impl TestDatabase {
    /// Creates an empty database.
    pub async fn create() -> anyhow::Result<TestDatabase> {
        let admin_url = admin_url();
        let name = format!("wh_t_{}", random_suffix());
        let mut admin = PgConnection::connect(&admin_url)
            .await
            .with_context(|| format!("connect to {admin_url} (set TEST_DATABASE_ADMIN_URL)"))?;
        admin.execute(format!("CREATE DATABASE {name}").as_str()).await.context("create test database")?;
        let _ = admin.close().await;
        let mut url = url::Url::parse(&admin_url).context("TEST_DATABASE_ADMIN_URL")?;
        url.set_path(&format!("/{name}"));
        Ok(TestDatabase { name, url: url.into(), admin_url, removed: false })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection string for the database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database now, ending any connection still open to it.
    pub async fn remove(mut self) {
        self.removed = true;
        drop_database(self.admin_url.clone(), self.name.clone()).await;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if !self.removed {
            block_on_aside(drop_database(self.admin_url.clone(), self.name.clone()));
        }
    }
}

async fn drop_database(admin_url: String, name: String) {
    let result = async {
        let mut admin = PgConnection::connect(&admin_url).await?;
        admin.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str()).await?;
        admin.close().await
    };
    match tokio::time::timeout(crate::WAIT, result).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, database = %name, "could not drop a test database"),
        Err(_) => tracing::warn!(database = %name, "dropping a test database timed out"),
    }
}
