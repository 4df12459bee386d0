//! `webhooks-dispatcher` built inside the test package, so `cargo test`
//! builds it for the tests that run the dispatcher as a process (and kill it)
//! and they find it at `CARGO_BIN_EXE_dispatcher-process`. It is the same
//! program: [`dispatcher::main`].

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    dispatcher::main().await
}
