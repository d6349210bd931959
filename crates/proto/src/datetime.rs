//! XEP-0082 date and time profiles: the `DateTime` format used by delayed
//! delivery (XEP-0203), entity time (XEP-0202), archive queries (XEP-0313)
//! and stream management (XEP-0198).

/// XEP-0082 DateTime in UTC for milliseconds since the Unix epoch.
pub fn xep0082_datetime(unix_millis: u128) -> String {
    let secs = (unix_millis / 1000) as i64;
    let millis = unix_millis % 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Parses a XEP-0082 DateTime (`CCYY-MM-DDThh:mm:ss[.sss]TZD`, TZD `Z` or
/// `±hh:mm`) into microseconds since the Unix epoch.
pub fn parse_xep0082(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut micros = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut m = 0i64;
        for (i, c) in frac.bytes().take(digits).enumerate() {
            if i < 6 {
                m = m * 10 + i64::from(c - b'0');
            }
        }
        for _ in digits..6 {
            m *= 10;
        }
        micros = m;
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let h = num(s.len() - 5..s.len() - 3)?;
            let m = num(s.len() - 2..s.len())?;
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    // Days since 1970-01-01 from the civil date (H. Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_secs;
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_known_instants() {
        assert_eq!(xep0082_datetime(0), "1970-01-01T00:00:00.000Z");
        // XEP-0082 §3.2 example instant.
        assert_eq!(
            xep0082_datetime(1_070_114_434_000),
            "2003-11-29T14:00:34.000Z"
        );
        assert_eq!(
            xep0082_datetime(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
    }

    #[test]
    fn parse_round_trips_and_zones() {
        for ms in [0u128, 1_070_114_434_000, 951_782_400_123, 1_763_700_000_999] {
            let text = xep0082_datetime(ms);
            assert_eq!(parse_xep0082(&text), Some(ms as i64 * 1000), "{text}");
        }
        // XEP-0082 §3.2: 1969-07-21T02:56:15Z == 1969-07-20T21:56:15-05:00.
        assert_eq!(
            parse_xep0082("1969-07-21T02:56:15Z"),
            parse_xep0082("1969-07-20T21:56:15-05:00")
        );
        assert_eq!(
            parse_xep0082("2010-06-07T00:00:00.5Z"),
            Some(1_275_868_800_500_000)
        );
        for bad in [
            "",
            "2010-06-07",
            "2010-13-07T00:00:00Z",
            "2010-06-07T00:00:00",
            "2010-06-07T00:00:00.Z",
            "2010-06-07T25:00:00Z",
            "2010-06-07T00:00:00+0500",
            "x010-06-07T00:00:00Z",
        ] {
            assert_eq!(parse_xep0082(bad), None, "{bad}");
        }
    }
}
