//! Every connection the service makes to a developer's endpoint goes through
//! here: which addresses it may reach ([`guard`]), which certificates it
//! trusts, and the HTTPS client deliveries use ([`tls`]).

pub mod guard;
pub mod tls;
