//! The history tables on PostgreSQL, partitioned by day (DESIGN.md,
//! "History"): `events` by its id, `deliveries` by its event's id, and
//! `delivery_attempts` by its own id. Every one of those ids is a UUIDv7,
//! whose first 48 bits are the time it was made on the service's one clock,
//! so a range of ids is a range of time: a day's partition holds the ids of
//! that day, and retention drops a day whole.
//!
//! The service keeps the partitions itself: every process makes sure, at
//! start, that the days from yesterday to [`AHEAD`] days ahead exist, and
//! the API's retention task keeps them coming and drops the expired ones.
//! A new installation gets the partitioned tables at its first start; an
//! existing one converts online (`webhooks-api migrate --partition-history`,
//! [`convert`]), its old tables becoming one partition, `legacy`, for
//! everything before the conversion, which retention empties row by row and
//! drops once it has expired.
//!
//! Statements on the delivery path address a delivery's partition by name
//! ([`Layout::deliveries_of`]): through the parent, PostgreSQL would open
//! and lock every partition of every table on each execution.

use std::{borrow::Cow, collections::BTreeSet, time::Duration};

use chrono::{DateTime, Days, NaiveDate, TimeZone, Utc};
use sqlx::{Executor, PgPool};

use crate::{StoreError, StoreResult};

/// Days of partitions made ahead of today.
pub(crate) const AHEAD: u64 = 3;

/// The advisory lock that lets one process at a time change partitions.
const PARTITIONS_LOCK: i64 = 0x7061_7274_6974_696f; // "partitio"

/// How long a change of partitions waits for a lock before it gives up
/// and tries again later: it must never queue the delivery path behind it.
const LOCK_TIMEOUT: &str = "2s";

/// One of the three history tables.
struct HistoryTable {
    name: &'static str,
    /// The column it is partitioned by.
    key: &'static str,
    /// The lower bound of the key for what was made at a time.
    bound: fn(DateTime<Utc>) -> String,
    /// Its indexes on the partitioned layout: (name, definition).
    indexes: &'static [(&'static str, &'static str)],
}

/// The delivery log entries a failure filter finds: anything but a 2xx
/// answer. Written the same way in the indexes and the statements, so the
/// planner matches them.
pub(crate) const FAILED: &str = "(error IS NOT NULL OR status IS NULL OR status < 200 OR status > 299)";

const TABLES: [HistoryTable; 3] = [
    HistoryTable {
        name: "events",
        key: "id",
        bound: event_id_bound,
        indexes: &[
            ("events_pkey", "PRIMARY KEY (id)"),
            ("events_by_sequence", "(developer_id, sequence)"),
            ("events_by_developer", "(developer_id, created_at DESC, id DESC)"),
            ("events_by_developer_category", "(developer_id, category, created_at DESC, id DESC)"),
        ],
    },
    HistoryTable {
        name: "deliveries",
        key: "event_id",
        bound: event_id_bound,
        indexes: &[
            ("deliveries_event_endpoint", "UNIQUE (event_id, endpoint_id)"),
            ("deliveries_by_id", "(id)"),
            (
                "deliveries_upcoming",
                "(endpoint_id, event_created_at, id) WHERE state IN ('held', 'pending', 'retrying', 'waiting')",
            ),
            (
                "deliveries_owed_by_lane",
                "(lane, next_attempt_at) WHERE state IN ('pending', 'retrying') AND NOT set_aside",
            ),
            ("deliveries_turn", "(endpoint_id, event_sequence) WHERE state IN ('pending', 'retrying', 'waiting')"),
            ("deliveries_set_aside", "(endpoint_id, event_sequence) WHERE set_aside"),
            ("deliveries_set_aside_due", "(next_attempt_at) WHERE set_aside"),
            ("deliveries_waiting", "(endpoint_id) WHERE state = 'waiting'"),
            ("deliveries_recoverable", "(endpoint_id, event_created_at) WHERE state IN ('failed', 'held')"),
            (
                "deliveries_swept",
                "(next_attempt_at) WHERE swept AND state IN ('pending', 'retrying') AND NOT set_aside",
            ),
        ],
    },
    HistoryTable {
        name: "delivery_attempts",
        key: "id",
        bound: uuid_bound,
        indexes: &[
            ("delivery_attempts_pkey", "PRIMARY KEY (id)"),
            ("delivery_attempts_by_endpoint", "(endpoint_id, created_at DESC, id DESC)"),
            ("delivery_attempts_by_delivery", "(delivery_id)"),
            ("delivery_attempts_by_type", "(endpoint_id, event_type, created_at DESC, id DESC)"),
            ("delivery_attempts_failed", "(endpoint_id, created_at DESC, id DESC) WHERE {FAILED}"),
            ("delivery_attempts_failed_by_type", "(endpoint_id, event_type, created_at DESC, id DESC) WHERE {FAILED}"),
        ],
    },
];

/// The smallest event id made at `at` or later.
pub(crate) fn event_id_bound(at: DateTime<Utc>) -> String {
    format!("wh_{:012x}{}", millis(at), "0".repeat(20))
}

/// The smallest UUIDv7 made at `at` or later.
pub(crate) fn uuid_bound(at: DateTime<Utc>) -> String {
    let ms = millis(at);
    format!("{:08x}-{:04x}-0000-0000-000000000000", ms >> 16, ms & 0xffff)
}

fn millis(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp_millis()).unwrap_or(0)
}

/// The day an event id was made, from the time in its first 48 bits.
pub(crate) fn day_of_event(event_id: &str) -> Option<NaiveDate> {
    let hex = event_id.strip_prefix("wh_")?.get(..12)?;
    let ms = i64::from_str_radix(hex, 16).ok()?;
    Some(DateTime::from_timestamp_millis(ms)?.date_naive())
}

fn start_of(day: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).unwrap_or_default())
}

fn partition_name(table: &str, day: NaiveDate) -> String {
    format!("{table}_p{}", day.format("%Y%m%d"))
}

fn legacy_name(table: &str) -> String {
    format!("{table}_legacy")
}

/// How the history tables are laid out now, as a process last read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The tables are partitioned by day.
    pub(crate) partitioned: bool,
    /// What was made before this is in the `legacy` partitions.
    pub(crate) legacy_before: Option<DateTime<Utc>>,
    /// The days that have partitions.
    pub(crate) days: BTreeSet<NaiveDate>,
}

impl Layout {
    /// The table that holds the deliveries of event `event_id`: its day's
    /// partition, the legacy partition, or the table itself (unpartitioned,
    /// or a day this process does not know of).
    pub(crate) fn deliveries_of(&self, event_id: &str) -> Cow<'static, str> {
        if !self.partitioned {
            return Cow::Borrowed("deliveries");
        }
        let Some(day) = day_of_event(event_id) else { return Cow::Borrowed("deliveries") };
        // The legacy partition ends at a day's start: a day before it is
        // wholly in it.
        if self.legacy_before.is_some_and(|before| start_of(day) < before) {
            return Cow::Borrowed("deliveries_legacy");
        }
        if self.days.contains(&day) {
            Cow::Owned(partition_name("deliveries", day))
        } else {
            Cow::Borrowed("deliveries")
        }
    }

    /// Reads the layout from the catalog.
    pub(crate) async fn read(pool: &PgPool) -> StoreResult<Layout> {
        let partitioned: bool = sqlx::query_scalar(
            "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('events')), false)",
        )
        .fetch_one(pool)
        .await?;
        if !partitioned {
            return Ok(Layout::default());
        }
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = to_regclass('deliveries')",
        )
        .fetch_all(pool)
        .await?;
        let days = names
            .iter()
            .filter_map(|name| name.strip_prefix("deliveries_p"))
            .filter_map(|day| NaiveDate::parse_from_str(day, "%Y%m%d").ok())
            .collect();
        let legacy_before: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT legacy_before FROM history_layout").fetch_optional(pool).await?.flatten();
        Ok(Layout { partitioned, legacy_before, days })
    }
}

/// Runs `statements` in one transaction, under the partitions lock and
/// [`LOCK_TIMEOUT`].
async fn locked(pool: &PgPool, statements: &[String]) -> StoreResult<()> {
    locked_on(&mut *pool.acquire().await?, statements).await
}

/// The statements that make the partitioned `table` from the table of the
/// same name, which becomes `old`: the parent, like `old` (columns,
/// defaults, checks), with no rows of its own.
fn parent(table: &HistoryTable, old: &str) -> Vec<String> {
    vec![
        format!("ALTER TABLE {name} RENAME TO {old}", name = table.name),
        format!(
            "CREATE TABLE {name} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)
             PARTITION BY RANGE ({key})",
            name = table.name,
            key = table.key
        ),
    ]
}

/// The statements that give the parent `table` its indexes; the
/// partitions attached by then take an index of theirs that matches.
fn parent_indexes(table: &HistoryTable) -> Vec<String> {
    table
        .indexes
        .iter()
        .map(|(name, definition)| {
            let definition = definition.replace("{FAILED}", FAILED);
            if let Some(columns) = definition.strip_prefix("PRIMARY KEY ") {
                format!("ALTER TABLE {table} ADD CONSTRAINT {name} PRIMARY KEY {columns}", table = table.name)
            } else if let Some(rest) = definition.strip_prefix("UNIQUE ") {
                format!("CREATE UNIQUE INDEX {name} ON {table} {rest}", table = table.name)
            } else {
                format!("CREATE INDEX {name} ON {table} {definition}", table = table.name)
            }
        })
        .collect()
}

/// The statements that make the partitions of `days` that do not exist yet
/// (of `existing`): each a table like the parent, given its indexes, then
/// attached (which locks the parent far more lightly than `PARTITION OF`).
fn day_partitions(days: &[NaiveDate], existing: &BTreeSet<NaiveDate>) -> Vec<String> {
    let mut statements = Vec::new();
    for day in days.iter().filter(|day| !existing.contains(day)) {
        let (from, to) = (start_of(*day), start_of(day.checked_add_days(Days::new(1)).unwrap_or(*day)));
        for table in &TABLES {
            let partition = partition_name(table.name, *day);
            statements.push(format!(
                "CREATE TABLE {partition} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)",
                parent = table.name
            ));
            statements.push(format!(
                "ALTER TABLE {parent} ATTACH PARTITION {partition} FOR VALUES FROM ('{from}') TO ('{to}')",
                parent = table.name,
                from = (table.bound)(from),
                to = (table.bound)(to),
            ));
        }
    }
    statements
}

/// The days from yesterday to [`AHEAD`] days after `today`.
fn days_around(today: NaiveDate) -> Vec<NaiveDate> {
    let first = today.checked_sub_days(Days::new(1)).unwrap_or(today);
    (0..=AHEAD + 1).filter_map(|n| first.checked_add_days(Days::new(n))).collect()
}

/// At a process's start: a new installation (the three tables empty and
/// not partitioned yet) gets its partitioned tables, and the days around
/// today get their partitions. An installation with history is left as it
/// is: `webhooks-api migrate --partition-history` converts it online.
pub(crate) async fn prepare(pool: &PgPool) -> StoreResult<Layout> {
    let layout = Layout::read(pool).await?;
    let today = webhooks_model::time::now().date_naive();
    if layout.partitioned {
        let missing = day_partitions(&days_around(today), &layout.days);
        if !missing.is_empty() {
            locked(pool, &missing).await?;
        }
        return Layout::read(pool).await;
    }
    let empty: bool = sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM events) AND NOT EXISTS (SELECT 1 FROM deliveries)
            AND NOT EXISTS (SELECT 1 FROM delivery_attempts)",
    )
    .fetch_one(pool)
    .await?;
    if !empty {
        tracing::warn!(
            "the history tables are not partitioned: retention deletes them row by row and searches \
             slow down as they grow; convert them online with `webhooks-api migrate --partition-history` \
             (docs/operations.md, \"Partitioned history\")"
        );
        return Ok(layout);
    }
    let mut statements = drop_history_keys();
    for table in &TABLES {
        statements.extend(parent(table, &format!("{}_unpartitioned", table.name)));
    }
    // Empty, they go before the partitioned tables take their indexes' names.
    for table in TABLES.iter().rev() {
        statements.push(format!("DROP TABLE {}_unpartitioned", table.name));
    }
    for table in &TABLES {
        statements.extend(parent_indexes(table));
    }
    statements.extend(day_partitions(&days_around(today), &BTreeSet::new()));
    let mut tx = pool.begin().await?;
    // The first start's, with nothing else running yet: as long as it takes.
    tx.execute("SET LOCAL statement_timeout = 0").await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(PARTITIONS_LOCK).execute(&mut *tx).await?;
    // Another process may have done it meanwhile.
    let still: bool = sqlx::query_scalar("SELECT relkind <> 'p' FROM pg_class WHERE oid = to_regclass('events')")
        .fetch_one(&mut *tx)
        .await?;
    if still {
        for statement in &statements {
            tx.execute(statement.as_str()).await?;
        }
        tracing::info!("history tables partitioned by day");
    }
    tx.commit().await?;
    Layout::read(pool).await
}

/// What ties the old tables together and cannot span partitions: the
/// foreign keys between them, and the sequence of delivery ids, which
/// must outlive the table it was made for.
fn drop_history_keys() -> Vec<String> {
    vec![
        "ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_delivery_id_fkey".to_owned(),
        "ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_event_id_fkey".to_owned(),
        "ALTER SEQUENCE deliveries_id_seq OWNED BY NONE".to_owned(),
    ]
}

/// Makes the partitions of the days from `first` to `last` that are
/// missing: for history the service did not make itself (a benchmark's, a
/// test's).
pub(crate) async fn make_days(pool: &PgPool, first: NaiveDate, last: NaiveDate) -> StoreResult<Layout> {
    let layout = Layout::read(pool).await?;
    let days: Vec<NaiveDate> = first.iter_days().take_while(|day| *day <= last).collect();
    let missing = day_partitions(&days, &layout.days);
    if layout.partitioned && !missing.is_empty() {
        locked(pool, &missing).await?;
    }
    Layout::read(pool).await
}

/// What one pass of partition maintenance did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Maintained {
    /// Days whose partitions were made.
    pub made: usize,
    /// Days whose partitions were dropped.
    pub dropped: usize,
}

/// Makes the partitions of the days around now that are missing, and drops
/// those of the days wholly before `cutoff` (a day of events goes only once
/// none of its deliveries is owed: an attempt may be under way).
pub(crate) async fn maintain(pool: &PgPool, cutoff: Option<DateTime<Utc>>) -> StoreResult<(Layout, Maintained)> {
    let layout = Layout::read(pool).await?;
    if !layout.partitioned {
        return Ok((layout, Maintained::default()));
    }
    let today = webhooks_model::time::now().date_naive();
    let days = days_around(today);
    let missing = day_partitions(&days, &layout.days);
    let made = missing.len() / (2 * TABLES.len());
    if !missing.is_empty() {
        locked(pool, &missing).await?;
    }
    let mut dropped = 0;
    if let Some(cutoff) = cutoff {
        for day in day_tables(pool).await?.iter().filter(|day| start_of(day.succ_opt().unwrap_or(**day)) <= cutoff) {
            if drop_slice(pool, &day_slice(*day)).await? {
                tracing::info!(%day, "a day of history dropped (retention)");
                dropped += 1;
            } else {
                tracing::info!(%day, "a day of history is kept past its retention: a delivery of it is still owed");
            }
        }
        if let Some(before) = layout.legacy_before
            && before <= cutoff
            && drop_slice(pool, &legacy_slice(before)).await?
        {
            sqlx::query("UPDATE history_layout SET legacy_before = NULL").execute(pool).await?;
            tracing::info!("the history from before partitioning is gone (retention)");
        }
    }
    Ok((Layout::read(pool).await?, Maintained { made, dropped }))
}

/// The days that have a table of any of the three, attached or not (a pass
/// interrupted between its steps leaves some).
async fn day_tables(pool: &PgPool) -> StoreResult<BTreeSet<NaiveDate>> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class
          WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace
            AND relname ~ '^(events|deliveries|delivery_attempts)_p[0-9]{8}$'",
    )
    .fetch_all(pool)
    .await?;
    Ok(names
        .iter()
        .filter_map(|name| name.rsplit_once("_p"))
        .filter_map(|(_, day)| NaiveDate::parse_from_str(day, "%Y%m%d").ok())
        .collect())
}

/// One partition of each history table, dropped together.
struct Slice {
    /// (parent, partition, its bounds as `FOR VALUES` says them).
    partitions: Vec<(&'static str, String, String)>,
    /// The partition of `deliveries`, where what is owed is looked for.
    deliveries: String,
}

fn day_slice(day: NaiveDate) -> Slice {
    let (from, to) = (start_of(day), start_of(day.succ_opt().unwrap_or(day)));
    Slice {
        partitions: TABLES
            .iter()
            .map(|table| {
                let bounds = format!("FROM ('{}') TO ('{}')", (table.bound)(from), (table.bound)(to));
                (table.name, partition_name(table.name, day), bounds)
            })
            .collect(),
        deliveries: partition_name("deliveries", day),
    }
}

fn legacy_slice(before: DateTime<Utc>) -> Slice {
    Slice {
        partitions: TABLES
            .iter()
            .map(|table| {
                (table.name, legacy_name(table.name), format!("FROM (MINVALUE) TO ('{}')", (table.bound)(before)))
            })
            .collect(),
        deliveries: legacy_name("deliveries"),
    }
}

/// Whether a delivery in `deliveries` (a partition) is still owed; not,
/// when the table is gone.
async fn owed(executor: impl sqlx::PgExecutor<'_>, deliveries: &str) -> StoreResult<bool> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT to_regclass('{deliveries}') IS NOT NULL
            AND EXISTS (SELECT 1 FROM {deliveries} WHERE state IN ('pending', 'retrying', 'waiting'))"
    ))
    .fetch_one(executor)
    .await
    .or_else(|error| match error.as_database_error().and_then(|e| e.code()).as_deref() {
        // Planned before it was known to be gone.
        Some("42P01") => Ok(false),
        _ => Err(error),
    })?)
}

/// Drops `slice` unless a delivery of it is owed: detached first without
/// blocking reads or writes of the parents (`CONCURRENTLY` waits for the
/// statements using them instead), looked at again once detached (a send or
/// a recovery may have armed a delivery of it again meanwhile; detached, it
/// is out of their reach) and attached back if so, else dropped: no row is
/// deleted, nothing is left to vacuum. Whether it was dropped.
async fn drop_slice(pool: &PgPool, slice: &Slice) -> StoreResult<bool> {
    if owed(pool, &slice.deliveries).await? {
        return Ok(false);
    }
    let mut connection = pool.acquire().await?;
    // A detach waits for every transaction that uses the partition: give it time.
    connection.execute("SET statement_timeout = 0").await?;
    let result = async {
        let mut detached = Vec::new();
        for (parent, partition, bounds) in &slice.partitions {
            if detach(&mut connection, parent, partition).await? {
                detached.push((parent, partition, bounds));
            }
        }
        if owed(&mut *connection, &slice.deliveries).await? {
            for (parent, partition, bounds) in detached {
                connection
                    .execute(format!("ALTER TABLE {parent} ATTACH PARTITION {partition} FOR VALUES {bounds}").as_str())
                    .await?;
            }
            return Ok(false);
        }
        for (_, partition, _) in slice.partitions.iter().rev() {
            connection.execute(format!("DROP TABLE IF EXISTS {partition}").as_str()).await?;
        }
        Ok::<bool, StoreError>(true)
    }
    .await;
    if connection.execute("RESET statement_timeout").await.is_err() {
        connection.detach();
    }
    result
}

/// Detaches `partition` from `parent` if it is attached, finishing a
/// detach an interruption left pending; whether it was attached.
async fn detach(connection: &mut sqlx::PgConnection, parent: &str, partition: &str) -> StoreResult<bool> {
    let pending: Option<bool> = sqlx::query_scalar(
        "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass($2)",
    )
    .bind(partition)
    .bind(parent)
    .fetch_optional(&mut *connection)
    .await?;
    let how = match pending {
        None => return Ok(false),
        Some(true) => "FINALIZE",
        Some(false) => "CONCURRENTLY",
    };
    connection.execute(format!("ALTER TABLE {parent} DETACH PARTITION {partition} {how}").as_str()).await?;
    Ok(true)
}

/// Converts an installation's unpartitioned history tables into
/// partitioned ones while the system runs (`webhooks-api migrate
/// --partition-history`); each step says what it does through `say`, and
/// every step may run again after an interruption.
///
/// 1. The foreign keys between the three tables go (they cannot span
///    partitions), and the sequence of delivery ids is freed from its table.
/// 2. The event type of each delivery log entry is filled in from its
///    event, in batches, where it is missing.
/// 3. Every index the partitioned tables have is built on the old tables
///    without blocking writes (`CREATE INDEX CONCURRENTLY`; one an
///    interruption left invalid is built again).
/// 4. A check that all their ids are before the cutover (the next day's
///    start, or the one after when that is less than an hour away) is
///    added and validated without blocking writes. Should the cutover have
///    come within [`SWAP_MARGIN`] by then, the check moves to the next day.
/// 5. In one short transaction: each old table is renamed `…_legacy` (its
///    indexes too), a partitioned table takes its name (without the check,
///    which only the legacy partition keeps), the old one is attached as
///    the partition of everything before the cutover (its check proves it,
///    so nothing is scanned), the partitioned indexes take the old table's
///    matching ones, and the days from the cutover on get their partitions.
///    Statements in flight wait for this transaction, which holds its locks
///    for milliseconds once it has them; it gives up after [`LOCK_TIMEOUT`]
///    rather than queue others behind it, and is tried again.
pub(crate) async fn convert(pool: &PgPool, say: &(dyn Fn(&str) + Sync)) -> StoreResult<()> {
    if Layout::read(pool).await?.partitioned {
        say("the history tables are partitioned already");
        return Ok(());
    }
    let mut connection = pool.acquire().await?;
    connection.execute("SET statement_timeout = 0").await?;
    say("dropping the foreign keys between the history tables");
    for statement in drop_history_keys() {
        connection.execute(statement.as_str()).await?;
    }
    say("filling in the event type of delivery log entries");
    fill_event_types(&mut connection).await?;
    say("copying the producers' idempotency keys of the last day to their own table");
    connection
        .execute(
            "INSERT INTO event_idempotency (developer_id, key, event_id, request_hash, created_at)
             SELECT developer_id, idempotency_key, id, coalesce(request_hash, ''::bytea), created_at FROM events
              WHERE idempotency_key IS NOT NULL AND created_at > now() - interval '1 day'
             ON CONFLICT DO NOTHING",
        )
        .await?;
    for table in &TABLES {
        build_old_indexes(&mut connection, table, say).await?;
    }
    let cutover = loop {
        let now = webhooks_model::time::now();
        let mut cutover = start_of(now.date_naive().succ_opt().unwrap_or(now.date_naive()));
        if cutover - now < chrono::Duration::hours(1) {
            cutover = start_of(cutover.date_naive().succ_opt().unwrap_or(cutover.date_naive()));
        }
        for table in &TABLES {
            let check = format!("{}_before_cutover", table.name);
            say(&format!("checking that every {} row is before the cutover, {cutover}", table.name));
            // The check (again, with this cutover, after an interruption)
            // takes a lock for a moment: never queued behind a long
            // transaction, with the delivery path behind it.
            let add = [
                format!("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {check}", table.name),
                format!(
                    "ALTER TABLE {name} ADD CONSTRAINT {check} CHECK ({key} < '{bound}') NOT VALID",
                    name = table.name,
                    key = table.key,
                    bound = (table.bound)(cutover),
                ),
            ];
            with_lock_retries(say, async || locked_on(&mut connection, &add).await).await?;
            connection.execute(format!("ALTER TABLE {} VALIDATE CONSTRAINT {check}", table.name).as_str()).await?;
        }
        if cutover - webhooks_model::time::now() >= SWAP_MARGIN {
            break cutover;
        }
        say("the cutover came too close meanwhile; moving it to the next day");
    };
    drop(connection);

    let mut swap = Vec::new();
    for table in &TABLES {
        let legacy = legacy_name(table.name);
        let indexes: Vec<String> =
            sqlx::query_scalar("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass($1)")
                .bind(table.name)
                .fetch_all(pool)
                .await?;
        for index in indexes {
            swap.push(format!("ALTER INDEX {index} RENAME TO {}", legacy_index_name(&index)));
        }
        swap.extend(parent(table, &legacy));
        // The parent copied the old table's check, which would refuse every
        // row from the cutover on: only the legacy partition keeps it.
        swap.push(format!("ALTER TABLE {} DROP CONSTRAINT {}_before_cutover", table.name, table.name));
        swap.push(format!(
            "ALTER TABLE {name} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ('{bound}')",
            name = table.name,
            bound = (table.bound)(cutover),
        ));
        swap.extend(parent_indexes(table));
    }
    let days: Vec<NaiveDate> =
        days_around(cutover.date_naive()).into_iter().filter(|day| start_of(*day) >= cutover).collect();
    swap.extend(day_partitions(&days, &BTreeSet::new()));
    swap.push(format!(
        "INSERT INTO history_layout (legacy_before) VALUES ('{}') ON CONFLICT (id) DO UPDATE SET legacy_before = excluded.legacy_before",
        cutover.to_rfc3339()
    ));
    say("swapping the old tables for partitioned ones");
    with_lock_retries(say, async || locked(pool, &swap).await).await?;
    say("the history tables are partitioned");
    Ok(())
}

/// How long before the cutover the swap must be able to start: the old
/// tables refuse rows from the cutover on until it is done.
const SWAP_MARGIN: chrono::Duration = chrono::Duration::minutes(10);

/// Runs `attempt` until it does not give up on a lock ([`LOCK_TIMEOUT`]),
/// a second apart, 30 times at most.
async fn with_lock_retries<F: AsyncFnMut() -> StoreResult<()>>(
    say: &(dyn Fn(&str) + Sync),
    mut attempt: F,
) -> StoreResult<()> {
    for round in 1.. {
        match attempt().await {
            Err(StoreError::Database(error)) if round < 30 && is_lock_timeout(error.as_ref()) => {
                say("waiting for a moment without long transactions");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
    Ok(())
}

/// [`locked`], on `connection`.
async fn locked_on(connection: &mut sqlx::PgConnection, statements: &[String]) -> StoreResult<()> {
    use sqlx::Connection;
    let mut tx = connection.begin().await?;
    // Bounded by the lock timeout instead: the statements themselves are quick.
    tx.execute(format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'").as_str()).await?;
    tx.execute("SET LOCAL statement_timeout = 0").await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(PARTITIONS_LOCK).execute(&mut *tx).await?;
    for statement in statements {
        tx.execute(statement.as_str()).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Fills in the event type of the delivery log entries that have none,
/// from their events (the type in the event's body, for events stored
/// before they had the column), walking the log by id in batches.
async fn fill_event_types(connection: &mut sqlx::PgConnection) -> StoreResult<()> {
    let mut after = uuid::Uuid::nil();
    loop {
        // PostgreSQL has no max() of uuids: the batch's last, by order.
        let last: Option<uuid::Uuid> = sqlx::query_scalar(
            "WITH batch AS (
                 SELECT id, event_id FROM delivery_attempts WHERE id > $1 ORDER BY id LIMIT 10000),
             filled AS (
                 UPDATE delivery_attempts a
                    SET event_type = coalesce(e.event_type, e.body::jsonb ->> 'event_type')
                   FROM batch b JOIN events e ON e.id = b.event_id
                  WHERE a.id = b.id AND a.event_type IS NULL
                    AND coalesce(e.event_type, e.body::jsonb ->> 'event_type') IS NOT NULL)
             SELECT id FROM batch ORDER BY id DESC LIMIT 1",
        )
        .bind(after)
        .fetch_optional(&mut *connection)
        .await?;
        match last {
            Some(last) => after = last,
            None => return Ok(()),
        }
    }
}

/// Builds on the old `table` each index the partitioned one has, without
/// blocking writes; one an interrupted build left invalid is built again.
async fn build_old_indexes(
    connection: &mut sqlx::PgConnection,
    table: &HistoryTable,
    say: &(dyn Fn(&str) + Sync),
) -> StoreResult<()> {
    for (name, definition) in table.indexes {
        // One of the old table's own (every name here that exists already
        // is one of this schema's, with this definition).
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(*name).fetch_one(&mut *connection).await?;
        if exists {
            continue;
        }
        let invalid: bool = sqlx::query_scalar(
            "SELECT coalesce((SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false)",
        )
        .bind(format!("{name}_pre"))
        .fetch_one(&mut *connection)
        .await?;
        if invalid {
            connection.execute(format!("DROP INDEX CONCURRENTLY {name}_pre").as_str()).await?;
        }
        let definition = definition.replace("{FAILED}", FAILED);
        let (unique, columns) = match (definition.strip_prefix("PRIMARY KEY "), definition.strip_prefix("UNIQUE ")) {
            (Some(columns), _) | (_, Some(columns)) => ("UNIQUE ", columns.to_owned()),
            _ => ("", definition.clone()),
        };
        say(&format!("building {name} on the old {} table", table.name));
        connection
            .execute(
                format!("CREATE {unique}INDEX CONCURRENTLY IF NOT EXISTS {name}_pre ON {} {columns}", table.name)
                    .as_str(),
            )
            .await?;
    }
    Ok(())
}

/// The name an index of an old table takes once the table is the legacy
/// partition, so the partitioned table's own can take its name.
fn legacy_index_name(index: &str) -> String {
    let base = index.strip_suffix("_pre").unwrap_or(index);
    // PostgreSQL's names are 63 bytes at most.
    let mut name = format!("{base}_legacy");
    name.truncate(63);
    name
}

fn is_lock_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    error
        .downcast_ref::<sqlx::Error>()
        .and_then(sqlx::Error::as_database_error)
        .is_some_and(|e| e.code().as_deref() == Some("55P03"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_days_bounds_take_the_ids_made_that_day() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let (from, to) = (start_of(day), start_of(day.succ_opt().unwrap()));
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        // Ids of one process never go back in time: the earlier one first.
        let before = webhooks_model::ids::new_event_id_at(at("2026-11-30T23:59:59.999Z"));
        assert!(before < event_id_bound(from));
        for made in ["2026-12-01T00:00:00Z", "2026-12-01T12:34:56.789Z", "2026-12-01T23:59:59.999Z"] {
            let event = webhooks_model::ids::new_event_id_at(at(made));
            assert!(event_id_bound(from) <= event && event < event_id_bound(to), "{event}");
            assert_eq!(day_of_event(&event), Some(day));
            let attempt = webhooks_model::ids::new_v7_at(at(made)).to_string();
            assert!(uuid_bound(from) <= attempt && attempt < uuid_bound(to), "{attempt}");
        }
    }

    #[test]
    fn the_log_search_for_failures_is_written_as_its_indexes_are() {
        assert_eq!(super::super::deliveries::FAILED_ATTEMPT.replace("a.", ""), FAILED);
    }

    #[test]
    fn deliveries_are_found_in_their_days_partition() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let event = webhooks_model::ids::new_event_id_at(start_of(day) + chrono::Duration::hours(5));
        let mut layout = Layout::default();
        assert_eq!(layout.deliveries_of(&event), "deliveries");
        layout.partitioned = true;
        assert_eq!(layout.deliveries_of(&event), "deliveries", "a day it does not know");
        layout.days.insert(day);
        assert_eq!(layout.deliveries_of(&event), "deliveries_p20261201");
        layout.legacy_before = Some(start_of(day.succ_opt().unwrap()));
        layout.days.clear();
        assert_eq!(layout.deliveries_of(&event), "deliveries_legacy");
        assert_eq!(layout.deliveries_of("wh_nothex"), "deliveries");
    }
}
