//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds both migration directories at compile time, and cargo would not
//! otherwise notice a new file in them.

// A build script speaks to cargo on stdout.
#![allow(clippy::print_stdout)]

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=migrations-sqlite");
}
