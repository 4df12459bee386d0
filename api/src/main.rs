//! `webhooks-api`: hands over to the library's command line.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    api::cli::main().await
}
