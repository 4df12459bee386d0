//! Column types both dialects read, so that a stored row has one shape and one
//! mapping into the model (`endpoints.rs`, `api_keys.rs`, `recoveries.rs`,
//! `portal_sessions.rs`). Each is stored the way its dialect stores that kind
//! of value:
//!
//! | type | PostgreSQL | SQLite |
//! |---|---|---|
//! | [`Id`] | `uuid` | text, hyphenated |
//! | [`At`] | `timestamptz` | integer, microseconds since the epoch |
//! | [`Names`] | `text[]` | text, a JSON array of strings |
//! | [`Int`] | `int4` | integer |
//!
//! A value that does not read (a time out of range, a list that is not one)
//! is a decode error, which the store reports as [`crate::StoreError::Corrupt`]
//! naming the column.

use chrono::{DateTime, Utc};
use sqlx::{Decode, Postgres, Sqlite, Type, error::BoxDynError};
use uuid::{Uuid, fmt::Hyphenated};

/// A column type: the dialect's own type read from each, then turned into
/// the model's value.
macro_rules! column {
    ($(#[$doc:meta])* $name:ident($value:ty),
     postgres: $pg:ty => $from_pg:expr,
     sqlite: $lite:ty => $from_lite:expr $(,)?) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) struct $name(pub(crate) $value);

        impl Type<Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <$pg as Type<Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <$pg as Type<Postgres>>::compatible(ty)
            }
        }

        impl<'r> Decode<'r, Postgres> for $name {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, BoxDynError> {
                let read: fn($pg) -> Result<$value, BoxDynError> = $from_pg;
                read(<$pg as Decode<'r, Postgres>>::decode(value)?).map($name)
            }
        }

        impl Type<Sqlite> for $name {
            fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
                <$lite as Type<Sqlite>>::type_info()
            }
            fn compatible(ty: &sqlx::sqlite::SqliteTypeInfo) -> bool {
                <$lite as Type<Sqlite>>::compatible(ty)
            }
        }

        impl<'r> Decode<'r, Sqlite> for $name {
            fn decode(value: sqlx::sqlite::SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
                let read: fn($lite) -> Result<$value, BoxDynError> = $from_lite;
                read(<$lite as Decode<'r, Sqlite>>::decode(value)?).map($name)
            }
        }
    };
}

column!(
    /// An id: a developer's, an API key's, a recovery's, a session's.
    Id(Uuid),
    postgres: Uuid => Ok,
    sqlite: Hyphenated => |id| Ok(id.into_uuid()),
);

column!(
    /// A point in time.
    At(DateTime<Utc>),
    postgres: DateTime<Utc> => Ok,
    sqlite: i64 => |micros| {
        DateTime::from_timestamp_micros(micros).ok_or_else(|| format!("time {micros} out of range").into())
    },
);

column!(
    /// A list of names: categories, event types, scopes.
    Names(Vec<String>),
    postgres: Vec<String> => Ok,
    sqlite: String => |text| Ok(serde_json::from_str(&text)?),
);

column!(
    /// A small count that PostgreSQL keeps in four bytes.
    Int(i64),
    postgres: i32 => |n| Ok(i64::from(n)),
    sqlite: i64 => Ok,
);

/// `At` where the column may be NULL.
pub(crate) fn optional(at: Option<At>) -> Option<DateTime<Utc>> {
    at.map(|At(at)| at)
}
