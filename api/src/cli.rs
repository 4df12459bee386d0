//! `webhooks-api`: parses the command line, loads config, sets up tracing and
//! hands over to the library.

use std::io::Write;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use shared::{config::CommonConfig, model::ApiKeyType};
use tokio::net::TcpListener;
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(name = "webhooks-api", version, about = "The control plane of the webhook delivery service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the public API and the internal listener (applies migrations first).
    Serve(Box<api::Config>),
    /// Apply the database schema and exit.
    Migrate(Common),
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Print the OpenAPI document on stdout.
    Openapi,
}

#[derive(Debug, Args)]
struct Common {
    #[command(flatten)]
    common: CommonConfig,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key and print `{"key": …, "api_key": {…}}` on stdout.
    Create(CreateKey),
}

#[derive(Debug, Args)]
struct CreateKey {
    #[command(flatten)]
    common: CommonConfig,
    /// The developer who owns the key; a new developer id when absent.
    #[arg(long)]
    developer_id: Option<Uuid>,
    /// A name for the key, at most 100 characters.
    #[arg(long)]
    name: Option<String>,
    /// Comma-separated scopes; unrestricted when absent.
    #[arg(long, value_delimiter = ',')]
    scopes: Option<Vec<String>>,
}

fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            shared::telemetry::init(config.common.log_format);
            let shutdown = shared::shutdown::on_signal();
            let listeners = api::Listeners {
                public: TcpListener::bind(config.api_listen_addr).await.context("bind API_LISTEN_ADDR")?,
                internal: TcpListener::bind(config.internal_listen_addr).await.context("bind INTERNAL_LISTEN_ADDR")?,
            };
            api::run(*config, listeners, shutdown).await
        }
        Command::Migrate(Common { common }) => {
            shared::telemetry::init(common.log_format);
            api::connect_database(&common).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Keys { command: KeysCommand::Create(args) } => {
            shared::telemetry::init(args.common.log_format);
            let name = args.name.as_deref().map(str::trim).filter(|n| !n.is_empty());
            anyhow::ensure!(name.is_none_or(|n| n.chars().count() <= 100), "--name must be at most 100 characters");
            let scopes = api::keys::parse_scopes(args.scopes.as_deref()).map_err(anyhow::Error::msg)?;
            let store = api::connect_database(&args.common).await?;
            let developer_id = args.developer_id.unwrap_or_else(Uuid::new_v4);
            let issued = api::keys::issue(
                &store,
                args.common.platform_environment,
                developer_id,
                ApiKeyType::Public,
                &scopes,
                name,
            )
            .await?;
            let out = serde_json::json!({ "key": issued.key, "api_key": issued.api_key });
            print(&format!("{out}\n"))
        }
        Command::Openapi => print(&api::openapi::document()),
    }
}
