//! The few `--name value` flags of the tool binaries (`webhooks-faults`,
//! `webhooks-soak`), without a command-line framework.

use std::{collections::BTreeMap, str::FromStr};

use anyhow::{Context, bail};

/// Parsed `--name value`, `--name=value` and bare `--switch` flags.
#[derive(Debug, Default)]
pub struct Flags {
    values: BTreeMap<String, String>,
    switches: Vec<String>,
}

impl Flags {
    /// Parses `args` (without the program name). `switches` are the flags
    /// that take no value; `known` the ones that take one.
    pub fn parse(args: impl IntoIterator<Item = String>, known: &[&str], switches: &[&str]) -> anyhow::Result<Flags> {
        let mut flags = Flags::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else { bail!("unexpected argument {arg:?}") };
            let (name, inline) = match name.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (name.to_owned(), None),
            };
            if switches.contains(&name.as_str()) && inline.is_none() {
                flags.switches.push(name);
            } else if known.contains(&name.as_str()) {
                let value = match inline {
                    Some(value) => value,
                    None => args.next().with_context(|| format!("--{name} needs a value"))?,
                };
                flags.values.insert(name, value);
            } else {
                bail!("unknown flag --{name}");
            }
        }
        Ok(flags)
    }

    /// The value of `--name`, parsed, or `default`.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.values.get(name) {
            Some(value) => value.parse().map_err(|e| anyhow::anyhow!("--{name} {value:?}: {e}")),
            None => Ok(default),
        }
    }

    /// Whether `--name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }
}

/// Writes a line on stdout (the tools' report; progress goes to stderr).
pub fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
    let _ = stdout.flush();
}
