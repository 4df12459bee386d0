//! The pace of endpoints on PostgreSQL: one `endpoint_pace` row per paced
//! endpoint, shared by every dispatcher, each change one statement under its
//! row lock. The rules are those of [`crate::pace`].

use chrono::{DateTime, Utc};

use super::PgStore;
use crate::{
    StoreResult,
    pace::{RECOVERY_STEP, SLOW_FACTOR, SLOW_GUARD, SLOWEST, Ticket},
};

impl PgStore {
    pub(crate) async fn take_pace(&self, endpoint_id: &str, limit: u32) -> StoreResult<Ticket> {
        let (number, start): (i64, DateTime<Utc>) = sqlx::query_as(
            "INSERT INTO endpoint_pace AS p (endpoint_id, tickets, anchor_ticket, anchor_at, rate)
             VALUES ($1, 1, 0, now(), $2)
             ON CONFLICT (endpoint_id) DO UPDATE
                SET anchor_ticket = p.tickets,
                    anchor_at = greatest(now(), p.anchor_at + make_interval(
                        secs => (p.tickets - p.anchor_ticket) / greatest($4, least(p.rate, $2)))),
                    tickets = p.tickets + 1,
                    rate = least($2, least(p.rate, $2) + $3)
             RETURNING tickets - 1, anchor_at",
        )
        .bind(endpoint_id)
        .bind(f64::from(limit))
        .bind(RECOVERY_STEP)
        .bind(SLOWEST)
        .fetch_one(&self.pool)
        .await?;
        Ok(Ticket { number, start })
    }

    pub(crate) async fn pace_start(&self, endpoint_id: &str, ticket: i64) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(sqlx::query_scalar(
            "SELECT anchor_at + make_interval(secs => ($2 - anchor_ticket) / greatest($3, rate))
               FROM endpoint_pace WHERE endpoint_id = $1 AND $2 < tickets",
        )
        .bind(endpoint_id)
        .bind(ticket as f64)
        .bind(SLOWEST)
        .fetch_optional(&self.pool)
        .await?)
    }

    pub(crate) async fn slow_pace(&self, endpoint_id: &str, paused_until: Option<DateTime<Utc>>) -> StoreResult<()> {
        sqlx::query(
            "WITH now AS (SELECT now() AS at)
             UPDATE endpoint_pace p
                -- The ticket due now (or at the end of a pause under way:
                -- nothing starts before it, so pauses never add up) becomes
                -- the anchor; later tickets follow the new rate.
                SET anchor_ticket = p.anchor_ticket + extract(epoch FROM greatest(now.at, p.paused_until) - p.anchor_at)
                                                      * greatest($4, p.rate),
                    anchor_at = greatest(now.at, p.paused_until, $5),
                    paused_until = greatest(p.paused_until, $5),
                    rate = CASE WHEN p.slowed_at IS NULL OR p.slowed_at <= now.at - make_interval(secs => $3)
                                THEN greatest($4, p.rate * $2) ELSE p.rate END,
                    slowed_at = CASE WHEN p.slowed_at IS NULL OR p.slowed_at <= now.at - make_interval(secs => $3)
                                     THEN now.at ELSE p.slowed_at END
               FROM now
              WHERE p.endpoint_id = $1
                AND (p.slowed_at IS NULL OR p.slowed_at <= now.at - make_interval(secs => $3) OR $5 > now.at)",
        )
        .bind(endpoint_id)
        .bind(SLOW_FACTOR)
        .bind(SLOW_GUARD.as_secs_f64())
        .bind(SLOWEST)
        .bind(paused_until)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
