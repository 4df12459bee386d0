//! What the webhooks API and dispatcher both need: domain types, configuration,
//! signing and verification, endpoint key pairs, network guards, the PostgreSQL
//! store and the RabbitMQ topology and messages.
//!
//! The dependency direction is the architecture: `api` and `dispatcher` depend on
//! this crate and never on each other.

pub mod batch;
pub mod broker;
pub mod config;
pub mod db;
pub mod endpoint_signer;
pub mod ids;
pub mod keys;
pub mod model;
pub mod net;
pub mod shutdown;
pub mod signing;
pub mod standard;
pub mod store;
pub mod telemetry;
pub mod time;
pub mod tls;
pub mod verify;
