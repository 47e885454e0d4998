//! Timestamp text to Unix microseconds, without a date-time dependency: RFC 3339
//! (`T` or a space between date and time, `Z` or `±HH:MM`, optional fraction), a
//! date alone (midnight UTC), or a number of Unix seconds, milliseconds or
//! microseconds (the [`TimestampUnit`] of the ingest; seconds by default).
use crate::config::TimestampUnit;
use crate::types::Micros;

/// Parses an event timestamp, reading a number as Unix seconds; see the module
/// docs for the accepted forms.
pub fn parse_timestamp(s: &str) -> Result<Micros, String> {
    parse_timestamp_in(s, TimestampUnit::Seconds)
}

/// Parses an event timestamp, reading a number in `unit`.
pub fn parse_timestamp_in(s: &str, unit: TimestampUnit) -> Result<Micros, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty timestamp".into());
    }
    // A date starts with four digits and a dash; anything else must be a number.
    if s.len() >= 10 && s.as_bytes().get(4) == Some(&b'-') && s.as_bytes()[0].is_ascii_digit() {
        return parse_rfc3339(s).ok_or_else(|| format!("{s:?} is not an RFC 3339 timestamp"));
    }
    number_to_micros(s, unit).ok_or_else(|| {
        let name = match unit {
            TimestampUnit::Seconds => "seconds",
            TimestampUnit::Millis => "milliseconds",
            TimestampUnit::Micros => "microseconds",
        };
        format!("{s:?} is neither RFC 3339 nor a number of Unix {name} (timestamp unit {unit})")
    })
}

// Decimal numbers are parsed exactly (no f64 rounding), so a timestamp written
// with microsecond digits reads back as the same microsecond; digits below a
// microsecond are dropped.
fn number_to_micros(s: &str, unit: TimestampUnit) -> Option<Micros> {
    let digits_below = match unit {
        TimestampUnit::Seconds => 6,
        TimestampUnit::Millis => 3,
        TimestampUnit::Micros => 0,
    };
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut frac_digits: String = frac.chars().take(digits_below).collect();
    while frac_digits.len() < digits_below {
        frac_digits.push('0');
    }
    let below = if frac_digits.is_empty() {
        0
    } else {
        frac_digits.parse::<i64>().ok()?
    };
    let micros = int
        .parse::<i64>()
        .ok()?
        .checked_mul(unit.micros_per_unit())?
        .checked_add(below)?;
    Some(if neg { -micros } else { micros })
}

/// RFC 3339 UTC text of a time in Unix microseconds (seconds precision), for
/// messages: `2024-05-01T12:00:00Z`.
pub fn format_micros(us: Micros) -> String {
    let secs = us.div_euclid(1_000_000);
    let (days, in_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        in_day / 3600,
        (in_day / 60) % 60,
        in_day % 60
    )
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn num(s: &str, range: std::ops::Range<usize>) -> Option<i64> {
    let part = s.get(range)?;
    if part.bytes().all(|b| b.is_ascii_digit()) {
        part.parse().ok()
    } else {
        None
    }
}

fn parse_rfc3339(s: &str) -> Option<Micros> {
    let b = s.as_bytes();
    let (y, mo, d) = (num(s, 0..4)?, num(s, 5..7)?, num(s, 8..10)?);
    if b.get(7) != Some(&b'-') || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    if s.len() == 10 {
        return days.checked_mul(86_400_000_000);
    }
    if !matches!(b.get(10), Some(b'T') | Some(b't') | Some(b' '))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return None;
    }
    let (h, mi, sec) = (num(s, 11..13)?, num(s, 14..16)?, num(s, 17..19)?);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut pos = 19;
    let mut frac_micros = 0i64;
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        let digits = s.get(start..pos)?;
        if digits.is_empty() {
            return None;
        }
        let mut padded: String = digits.chars().take(6).collect();
        while padded.len() < 6 {
            padded.push('0');
        }
        frac_micros = padded.parse().ok()?;
    }
    let offset_secs = match s.get(pos..)? {
        "Z" | "z" | "" => 0,
        tz if tz.len() == 6
            && (tz.starts_with('+') || tz.starts_with('-'))
            && tz.as_bytes()[3] == b':' =>
        {
            let oh = num(tz, 1..3)?;
            let om = num(tz, 4..6)?;
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_secs;
    secs.checked_mul(1_000_000)?.checked_add(frac_micros)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn formats_what_it_parses() {
        for t in [
            "1970-01-01T00:00:00Z",
            "2024-02-29T12:34:56Z",
            "1969-12-31T23:59:59Z",
            "2100-03-01T00:00:01Z",
        ] {
            assert_eq!(format_micros(parse_timestamp(t).unwrap()), t);
        }
    }

    #[test]
    fn parses_forms() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_timestamp("2024-05-01T12:00:00Z"),
            Ok(1_714_564_800_000_000)
        );
        assert_eq!(
            parse_timestamp("2024-05-01 14:00:00+02:00"),
            Ok(1_714_564_800_000_000)
        );
        assert_eq!(
            parse_timestamp("2024-05-01T12:00:00.25Z"),
            Ok(1_714_564_800_250_000)
        );
        assert_eq!(parse_timestamp("1714564800"), Ok(1_714_564_800_000_000));
        assert_eq!(parse_timestamp("1714564800.5"), Ok(1_714_564_800_500_000));
        assert_eq!(parse_timestamp("2024-05-01"), Ok(1_714_521_600_000_000));
        assert_eq!(
            parse_timestamp("1714564800.123456"),
            Ok(1_714_564_800_123_456)
        );
        assert_eq!(parse_timestamp("-1.5"), Ok(-1_500_000));
        assert!(parse_timestamp("1e9").is_err());
        assert!(parse_timestamp("yesterday").is_err());
        assert!(parse_timestamp("2024-13-01T00:00:00Z").is_err());
        assert!(parse_timestamp("").is_err());
    }

    #[test]
    fn numbers_take_a_unit() {
        use TimestampUnit::*;
        let t = 1_764_500_000_000_000; // 2025-11-30T10:53:20Z
        assert_eq!(parse_timestamp_in("1764500000", Seconds), Ok(t));
        assert_eq!(parse_timestamp_in("1764500000000", Millis), Ok(t));
        assert_eq!(parse_timestamp_in("1764500000000000", Micros), Ok(t));
        assert_eq!(parse_timestamp_in("1764500000000.5", Millis), Ok(t + 500));
        assert_eq!(parse_timestamp_in("1764500000000000.9", Micros), Ok(t));
        assert_eq!(format_micros(t), "2025-11-30T10:53:20Z");
        // Text carries its own unit.
        assert_eq!(parse_timestamp_in("2025-11-30T10:53:20Z", Millis), Ok(t));
        // Milliseconds read as seconds: far in the future, or out of range.
        assert_eq!(parse_timestamp_in("1764500000000", Seconds), Ok(t * 1000));
        let e = parse_timestamp_in("x1", Millis).unwrap_err();
        assert!(e.contains("milliseconds"), "{e}");
    }
}
