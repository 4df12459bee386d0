//! A flight recorder for hung tests.
//!
//! Every test binary keeps its most recent log lines (the API's, the
//! dispatcher's and the harness's, at `info` and above, or as
//! `TEST_FLIGHT_LOG` says) in memory. libtest captures a test's output and
//! loses it when the binary is aborted, so when the watchdog of
//! [`crate::TestApi`] finds a test hanging, [`dump`] writes those lines and a
//! backtrace of every thread (by `gdb`, when the machine has it) straight to
//! the process's standard error before the abort.

use std::{
    collections::VecDeque,
    io::Write,
    sync::{Mutex, MutexGuard},
};

/// How many lines are kept.
const CAPACITY: usize = 4000;

static LINES: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

fn lines() -> MutexGuard<'static, VecDeque<String>> {
    LINES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The filter of the recorded lines.
pub(crate) fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("TEST_FLIGHT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lapin=warn,sqlx=warn,hyper=warn"))
}

/// A `MakeWriter` for `tracing_subscriber::fmt` that appends to the record.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Recorder;

impl Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let mut lines = lines();
        for line in text.lines().filter(|l| !l.is_empty()) {
            if lines.len() == CAPACITY {
                lines.pop_front();
            }
            lines.push_back(line.to_owned());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Recorder {
    type Writer = Recorder;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// The recorded lines so far (every test of the binary, the API's included):
/// for tests that check what was logged, such as that no secret was.
pub fn recorded_lines() -> Vec<String> {
    lines().iter().cloned().collect()
}

/// Writes `headline`, the recorded lines and every thread's backtrace to the
/// process's standard error, past libtest's capture. Only the first caller
/// dumps; any other waits here for the first one to abort the process.
pub(crate) fn dump(headline: &str) {
    static DUMPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DUMPING.swap(true, std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "\n=== {headline}\n=== the last log lines of this test binary:");
    for line in lines().iter() {
        let _ = writeln!(stderr, "{line}");
    }
    let _ = writeln!(stderr, "=== the threads of process {}:", std::process::id());
    let _ = stderr.flush();
    drop(stderr);
    let gdb = std::process::Command::new("gdb")
        .args(["-p", &std::process::id().to_string(), "-batch", "-nx", "-ex", "thread apply all bt 30"])
        .stdin(std::process::Stdio::null())
        .stdout(std::io::stderr())
        .stderr(std::io::stderr())
        .spawn();
    let mut gdb = match gdb {
        Ok(gdb) => gdb,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "(no backtraces: gdb did not run: {error})");
            return;
        }
    };
    // The abort must come even if gdb stalls.
    let deadline = std::time::Instant::now() + GDB_DEADLINE;
    while matches!(gdb.try_wait(), Ok(None)) {
        if std::time::Instant::now() > deadline {
            let _ = gdb.kill();
            let _ = writeln!(std::io::stderr(), "(gdb took over {GDB_DEADLINE:?}; stopped)");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// How long the backtraces may take.
const GDB_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);
