//! `webhooks-dispatcher`: parses the command line, loads config, sets up
//! tracing and hands over to the library.

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(name = "webhooks-dispatcher", version, about = "The delivery worker of the webhook service")]
struct Cli {
    #[command(flatten)]
    config: dispatcher::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli { config } = Cli::parse();
    shared::telemetry::init(config.common.log_format);
    let shutdown = shared::shutdown::on_signal();
    let listener = TcpListener::bind(config.dispatcher_listen_addr).await.context("bind DISPATCHER_LISTEN_ADDR")?;
    dispatcher::run(config, listener, shutdown).await
}
