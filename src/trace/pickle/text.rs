//! Argument parsing for the text opcodes of protocols 0/1 and for LONG1/LONG4.
//! Snapshots never use the text forms; they are here so that any plain-data
//! pickle decodes.

/// `I123\n` / `L123L\n` / `g12\n`: optional sign, digits, optional `L`.
pub fn parse_int(line: &[u8]) -> Option<i64> {
    let line = line.strip_suffix(b"L").unwrap_or(line);
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// `F1.5\n`, also `inf`, `-inf`, `nan` as Python's repr writes them.
pub fn parse_float(line: &[u8]) -> Option<f64> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// Little-endian two's complement, as LONG1/LONG4 store it, into an i64.
/// Wider encodings are accepted when the extra bytes are only sign
/// extension. A value in [2^63, 2^64) is a C++ `uint64_t` that PyTorch
/// pickled as a Python int (a frame's `line` of -1 becomes 2^64 - 1,
/// pytorch/pytorch#115234): it keeps its 64 bits, as the C++ that wrote it
/// reads them. Anything else that does not fit returns `None`.
pub fn decode_long(bytes: &[u8]) -> Option<i64> {
    let Some(&last) = bytes.last() else {
        return Some(0);
    };
    let negative = last & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    let (low, high) = bytes.split_at(bytes.len().min(8));
    if high.iter().any(|&b| b != fill) {
        return None;
    }
    // Assembled in a register: a byte copy into a stack buffer read back as
    // one word stalls on store forwarding (every address in a trace is one).
    let raw = low
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    let unused = 64 - 8 * low.len() as u32;
    // Sign-extend from the top byte given (a full 8 bytes need nothing).
    let v = ((raw << unused) as i64) >> unused;
    // With extra bytes, the sign must already be right in the low 8, except
    // for the uint64 range above.
    if !high.is_empty() && negative && v >= 0 {
        return None;
    }
    Some(v)
}

/// `S'text'\n` (or double quotes) with Python string escapes.
pub fn unquote_string(line: &[u8]) -> Option<Vec<u8>> {
    let inner = match line {
        [b'\'', inner @ .., b'\''] | [b'"', inner @ .., b'"'] => inner,
        _ => return None,
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut it = inner.iter().copied();
    while let Some(b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next()? {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0' => out.push(0),
            b'x' => {
                let hi = hex(it.next()?)?;
                let lo = hex(it.next()?)?;
                out.push(hi << 4 | lo);
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// `V...\n`: latin-1 text with `\uXXXX` / `\UXXXXXXXX` escapes.
pub fn raw_unicode_escape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'\\' {
            let width = match line.get(i + 1) {
                Some(b'u') => 4,
                Some(b'U') => 8,
                _ => 0,
            };
            if width > 0 {
                let digits = line.get(i + 2..i + 2 + width);
                let code = digits
                    .and_then(|d| std::str::from_utf8(d).ok())
                    .and_then(|d| u32::from_str_radix(d, 16).ok());
                if let Some(code) = code {
                    out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                    i += 2 + width;
                    continue;
                }
            }
        }
        out.push(b as char);
        i += 1;
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs() {
        assert_eq!(decode_long(&[]), Some(0));
        assert_eq!(decode_long(&[0xff]), Some(-1));
        assert_eq!(decode_long(&[0x00, 0x80]), Some(-32768));
        assert_eq!(decode_long(&[0x00, 0x80, 0x00]), Some(32768));
        assert_eq!(
            decode_long(&[0x00, 0x00, 0x00, 0x00, 0x80]),
            Some(-(1 << 39))
        );
        assert_eq!(decode_long(&[0xff; 12]), Some(-1));
        // [2^63, 2^64) needs 9 bytes: a uint64, kept bit for bit.
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Some(i64::MIN));
        assert_eq!(
            decode_long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]),
            Some(-1)
        );
        // 2^64 + 1 and -2^63 - 1 fit in neither.
        assert_eq!(decode_long(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(
            decode_long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff]),
            None
        );
        assert_eq!(
            decode_long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00]),
            Some(i64::MAX)
        );
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80]), Some(i64::MIN));
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x7f, 0xff]), None);
    }

    /// Python's reading of 1 to 8 LONG1 bytes: little-endian two's
    /// complement, i.e. the unsigned value minus 2^(8n) when the top bit is set.
    fn python_long(bytes: &[u8]) -> i128 {
        let unsigned = bytes
            .iter()
            .enumerate()
            .fold(0i128, |acc, (i, &b)| acc | (i128::from(b) << (8 * i)));
        if bytes.last().is_some_and(|b| b & 0x80 != 0) {
            unsigned - (1i128 << (8 * bytes.len()))
        } else {
            unsigned
        }
    }

    proptest::proptest! {
        #[test]
        fn longs_of_up_to_8_bytes_read_as_python_reads_them(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 1..=8)
        ) {
            proptest::prop_assert_eq!(
                decode_long(&bytes).map(i128::from),
                Some(python_long(&bytes))
            );
        }
    }

    #[test]
    fn text_forms() {
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"12L"), Some(12));
        assert_eq!(parse_int(b"x"), None);
        assert_eq!(parse_float(b"1.5"), Some(1.5));
        assert_eq!(unquote_string(b"'a\\nb\\x41'"), Some(b"a\nbA".to_vec()));
        assert_eq!(unquote_string(b"'a"), None);
        assert_eq!(raw_unicode_escape(b"a\\u00e9\\"), "a\u{e9}\\");
    }
}
