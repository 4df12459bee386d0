//! `webhooks-dispatcher`: the whole program is [`dispatcher::main`].

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    dispatcher::main().await
}
