//! The retry schedule (API.md §5) and durations as the contract writes them.

use std::{str::FromStr, time::Duration};

/// Parses `500ms`, `10s`, `2m`, `1h` (and anything else humantime accepts).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let duration = humantime::parse_duration(value).map_err(|e| format!("invalid duration {value:?}: {e}"))?;
    if duration.is_zero() {
        return Err(format!("duration {value:?} must be greater than zero"));
    }
    Ok(duration)
}

/// The delay before each retry: entry `n` is the wait after failed attempt `n+1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(Vec<Duration>);

impl RetrySchedule {
    /// The delays, one per retry.
    pub fn delays(&self) -> &[Duration] {
        &self.0
    }

    /// The delay after failed attempt `attempt` (1-based), or `None` when that was
    /// the last attempt allowed.
    pub fn delay_after(&self, attempt: u32) -> Option<Duration> {
        self.0.get(usize::try_from(attempt).ok()?.checked_sub(1)?).copied()
    }

    /// The total number of attempts: the first one plus one per retry.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX).saturating_add(1)
    }
}

impl FromStr for RetrySchedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Ok(RetrySchedule(Vec::new()));
        }
        s.split(',').map(parse_duration).collect::<Result<_, _>>().map(RetrySchedule)
    }
}

/// Default `RETRY_SCHEDULE`: about two days in all (API.md §5).
pub const DEFAULT_RETRY_SCHEDULE: &str = "5s,30s,2m,10m,30m,1h,2h,4h,8h,12h,12h,12h";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_contract_spelling() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn default_schedule_is_about_two_days() {
        let schedule: RetrySchedule = DEFAULT_RETRY_SCHEDULE.parse().unwrap();
        assert_eq!(schedule.delays().len(), 12);
        assert_eq!(schedule.max_attempts(), 13);
        let total: Duration = schedule.delays().iter().sum();
        assert!(total > Duration::from_secs(44 * 3600) && total < Duration::from_secs(52 * 3600));
        assert_eq!(schedule.delay_after(1), Some(Duration::from_secs(5)));
        assert_eq!(schedule.delay_after(12), Some(Duration::from_secs(12 * 3600)));
        assert_eq!(schedule.delay_after(13), None);
        assert_eq!(schedule.delay_after(0), None);
    }

    #[test]
    fn schedule_rejects_bad_entries() {
        assert!("5s,,2m".parse::<RetrySchedule>().is_err());
        assert!("5s,later".parse::<RetrySchedule>().is_err());
        assert_eq!("".parse::<RetrySchedule>().unwrap().max_attempts(), 1);
    }
}
