//! `webhooks-api` built inside the test package, so `cargo test` builds it for
//! the tests that run standalone mode as a process (and kill it) and they find
//! it at `CARGO_BIN_EXE_api-process`. It is the same program: [`webhooks_api::main`].

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    webhooks_api::main().await
}
