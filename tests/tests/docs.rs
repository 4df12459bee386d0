//! The docs against the code, so they cannot go stale: the settings table
//! lists exactly the settings the programs read, with their defaults, and
//! the lifecycle message's list of change kinds is the code's.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;

/// Where the settings table is written.
const OPERATIONS: &str = include_str!("../../docs/operations.md");
/// Where the lifecycle message's change kinds are listed.
const ARCHITECTURE: &str = include_str!("../../docs/architecture.md");

/// Read by a library, not declared with clap, and documented beside them.
const LIBRARY_SETTINGS: [&str; 2] = ["RUST_LOG", "TOKIO_WORKER_THREADS"];

/// Every setting the programs declare for operators, with its default when
/// it has one.
fn declared() -> BTreeMap<String, Option<String>> {
    let commands = [
        api::Config::augment_args(clap::Command::new("serve")),
        api::config::StandaloneConfig::augment_args(clap::Command::new("standalone")),
        dispatcher::Config::augment_args(clap::Command::new("webhooks-dispatcher")),
    ];
    let mut settings = BTreeMap::new();
    for command in commands {
        // Hidden settings are a test's faults, not an operator's.
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            if let Some(env) = arg.get_env() {
                let default = arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned());
                settings.insert(env.to_string_lossy().into_owned(), default);
            }
        }
    }
    settings
}

/// The rows of the settings table: name -> default cell.
fn documented() -> BTreeMap<String, String> {
    let table = OPERATIONS.split("| setting | default | used by | meaning |").nth(1).expect("the settings table");
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

#[test]
fn the_settings_table_lists_every_setting_and_its_default() {
    let declared = declared();
    let documented = documented();
    let missing: Vec<&String> = declared.keys().filter(|name| !documented.contains_key(*name)).collect();
    assert!(missing.is_empty(), "settings the programs read that the table lacks: {missing:?}");
    let unknown: Vec<&String> = documented
        .keys()
        .filter(|name| !declared.contains_key(*name) && !LIBRARY_SETTINGS.contains(&name.as_str()))
        .collect();
    assert!(unknown.is_empty(), "settings in the table that no program reads: {unknown:?}");
    for (name, default) in &declared {
        if let Some(default) = default {
            let cell = &documented[name];
            assert!(
                cell.contains(default.as_str()),
                "{name}: the code's default is {default:?}, the table says {cell}"
            );
        }
    }
}

#[test]
fn the_docs_list_every_kind_of_endpoint_change() {
    let listed = ARCHITECTURE.split("with `change`\n  one of").nth(1).expect("the lifecycle message's change kinds");
    let listed = &listed[..listed.find('.').expect("the end of the list")];
    let listed: BTreeSet<&str> = listed.split('`').skip(1).step_by(2).collect();
    let kinds: BTreeSet<&str> =
        <webhooks_model::ChangeKind as strum::VariantArray>::VARIANTS.iter().map(|kind| kind.as_str()).collect();
    assert_eq!(listed, kinds, "the kinds of change the docs list, against the code's");
}
