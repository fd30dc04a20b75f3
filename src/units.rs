//! Byte sizes as people write them: `16GiB`, `512 MiB`, `2e9`, `1024`.

/// Why a text is not a byte size (each names the text as written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("'{0}': expected a number of bytes, optionally with a unit such as GiB")]
    NotANumber(String),
    #[error("'{text}': unknown unit '{unit}' (use B, KiB, MiB, GiB or TiB)")]
    UnknownUnit { text: String, unit: String },
    #[error("'{0}': a size cannot be negative")]
    Negative(String),
    #[error("'{0}': too large")]
    TooLarge(String),
}

/// Parse a byte size. Units are binary (`KiB`, `MiB`, `GiB`, `TiB`, and
/// `KB`/`MB`/`GB`/`TB` or `K`/`M`/`G`/`T` meaning the same, as PyTorch's
/// "mb" does) or none for bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let b = t.as_bytes();
    // The unit starts at the first letter, except an exponent's `e` (`2e9`).
    let exponent = |i: usize| {
        matches!(b[i], b'e' | b'E')
            && i > 0
            && b[i - 1].is_ascii_digit()
            && b.get(i + 1)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'+' || *c == b'-')
    };
    let split = (0..b.len())
        .find(|&i| b[i].is_ascii_alphabetic() && !exponent(i))
        .unwrap_or(b.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let value: f64 = number
        .parse()
        .map_err(|_| SizeError::NotANumber(text.to_string()))?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(SizeError::UnknownUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    if !value.is_finite() || value < 0.0 {
        return Err(SizeError::Negative(text.to_string()));
    }
    let bytes = value * scale as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(SizeError::TooLarge(text.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// `text` with every control character but newline and tab written as an
/// escape (`\u{1b}`), so that bytes from an input file (a frame name, an
/// annotation) can never drive the terminal that shows them.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.contains(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if bad(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// JSON text with the control characters serde_json leaves raw (DEL and
/// the C1 range; it escapes C0 itself) written as `\u` escapes. They can
/// only stand inside strings, where the escape means the same character.
pub fn escape_json_controls(json: String) -> String {
    if !json.contains(char::is_control) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c.is_control() && c != '\n' {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// [`escape_controls`] for one line: a newline or tab is escaped too.
pub fn escape_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// `text` quoted for a message: escaped as Rust's `{:?}` does, and cut after
/// 60 characters with its length said, so a 64 MB string from a file costs
/// a line, not the terminal.
pub fn quote_excerpt(text: &str) -> String {
    const SHOWN: usize = 60;
    match text.char_indices().nth(SHOWN) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!(
            "{:?}… ({} bytes)",
            &text[..cut],
            format_count(text.len() as u64)
        ),
    }
}

/// [`quote_excerpt`] of raw bytes (shown as text where they are UTF-8),
/// their own length said.
pub fn quote_bytes_excerpt(bytes: &[u8]) -> String {
    const SHOWN: usize = 60;
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]);
    if bytes.len() <= SHOWN {
        format!("{shown:?}")
    } else {
        format!("{shown:?}… ({} bytes)", format_count(bytes.len() as u64))
    }
}

/// A count as people read it: `1,000,000`.
pub fn format_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A trace entry's `time_us` (µs since the Unix epoch) as a UTC date and
/// time: `2023-11-14 22:13:20.000000 UTC`.
pub fn format_epoch_us(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{micros:06} UTC",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Year, month, day of a day count from 1970-01-01 (proleptic Gregorian;
/// Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A byte change with its sign, e.g. `+2.10 MiB`, `-512 bytes`.
pub fn signed_size(bytes: i64) -> String {
    let size = crate::alloc::format_size(bytes.unsigned_abs());
    if bytes < 0 {
        format!("-{size}")
    } else {
        format!("+{size}")
    }
}

/// A size NVML (or any reader) may not have given: "unknown", never 0.
pub fn format_size_or_unknown(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".to_string(), crate::alloc::format_size)
}

/// A percentage that may be missing: "unknown", never 0.
pub fn format_percent_or_unknown(v: Option<u32>) -> String {
    v.map_or_else(|| "unknown".to_string(), |p| format!("{p}%"))
}

#[cfg(test)]
mod tests {
    use super::{
        escape_controls, escape_json_controls, escape_line, format_count, format_epoch_us,
        parse_size, quote_excerpt,
    };

    #[test]
    fn epoch_microseconds_read_as_utc() {
        assert_eq!(format_epoch_us(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(
            format_epoch_us(1_700_000_000_123_456),
            "2023-11-14 22:13:20.123456 UTC"
        );
        assert_eq!(format_epoch_us(-1), "1969-12-31 23:59:59.999999 UTC");
        assert_eq!(
            format_epoch_us(951_782_400_000_000),
            "2000-02-29 00:00:00.000000 UTC"
        );
        // Any i64 from a file formats without overflow.
        assert!(format_epoch_us(i64::MIN).ends_with("UTC"));
        assert!(format_epoch_us(i64::MAX).ends_with("UTC"));
    }

    #[test]
    fn long_text_in_a_message_is_cut() {
        assert_eq!(quote_excerpt("small"), "\"small\"");
        let long = "x".repeat(64 << 20);
        let q = quote_excerpt(&long);
        assert!(q.len() < 100, "{q}");
        assert!(q.ends_with("… (67,108,864 bytes)"), "{q}");
        assert_eq!(quote_excerpt("\x1b[2J"), "\"\\u{1b}[2J\"");
    }

    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape_controls("\x1b]0;title\x07x\r\u{9b}2J"),
            "\\u{1b}]0;title\\u{7}x\\u{d}\\u{9b}2J"
        );
        assert_eq!(escape_line("a\nb\tc"), "a\\u{a}b\\u{9}c");
        assert!(!escape_controls("\x1b[2J").contains('\x1b'));
        let json = serde_json::to_string_pretty(&["\x1b[\u{9b}\u{7f}"]).expect("json");
        let safe = escape_json_controls(json);
        assert!(
            !safe.contains(|c: char| c.is_control() && c != '\n'),
            "{safe}"
        );
        let back: Vec<String> = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, ["\x1b[\u{9b}\u{7f}"]);
    }

    #[test]
    fn counts() {
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1000), "1,000");
        assert_eq!(format_count(1_000_000_000), "1,000,000,000");
        assert_eq!(format_count(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("2e9"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5e3 KiB"), Ok(1_536_000));
        assert!(parse_size("2e").is_err());
        assert!(parse_size("-1GiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }
}

/// `n` and the noun for it: `1 iteration`, `2 iterations` (the plural is the
/// noun with an `s`, which every noun counted on screen takes).
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", format_count(n))
    }
}

#[cfg(test)]
mod counted_tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::counted(1u32, "iteration"), "1 iteration");
        assert_eq!(super::counted(0u32, "block"), "0 blocks");
        assert_eq!(super::counted(36u64, "iteration"), "36 iterations");
    }
}
