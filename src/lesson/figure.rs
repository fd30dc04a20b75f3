//! The sizes a text states ("870.36 MiB", "4,000,000 B", "100 MB"): where
//! each is, how many bytes it says, and how precisely. A figure holds for a
//! byte count that rounds to it at its last written digit: "627 MiB" is
//! 626.5 to 627.5 MiB, so 628.38 MiB is not it; "4.3 GiB" is 4.25 to 4.35 GiB.

/// A size as a text states it.
#[derive(Debug, Clone, PartialEq)]
pub struct StatedFigure {
    /// As written, e.g. "870.36 MiB".
    pub text: String,
    /// Byte offset of the figure in the text it was found in.
    pub at: usize,
    /// What it says, in bytes.
    pub bytes: f64,
    /// Half its last written digit, in bytes: the figure holds for any
    /// count within this of `bytes`.
    pub tolerance: f64,
    /// Written in a decimal unit (kB, MB, GB, TB).
    pub decimal: bool,
}

impl StatedFigure {
    /// `bytes` rounds to this figure.
    pub fn holds_for(&self, bytes: u64) -> bool {
        // A hair over half a digit: 2.5 MiB written as "3 MiB" is not
        // treated as a miss by floating-point rounding.
        (bytes as f64 - self.bytes).abs() <= self.tolerance * (1.0 + 1e-9)
    }
}

/// Binary and decimal units, longest first so "MiB" is not read as "M".
const UNITS: [(&str, f64, bool); 10] = [
    ("KiB", 1024.0, false),
    ("MiB", 1_048_576.0, false),
    ("GiB", 1_073_741_824.0, false),
    ("TiB", 1_099_511_627_776.0, false),
    ("kB", 1e3, true),
    ("KB", 1e3, true),
    ("MB", 1e6, true),
    ("GB", 1e9, true),
    ("TB", 1e12, true),
    ("B", 1.0, false),
];

/// Every size `text` states: a number (digits, optional thousands commas
/// and decimals), an optional space, and a unit that ends a word.
pub fn figures_in(text: &str) -> Vec<StatedFigure> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_number = bytes[i].is_ascii_digit()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.'));
        if !starts_number {
            i += 1;
            continue;
        }
        let start = i;
        let mut digits = String::new();
        let mut decimals = 0u32;
        let mut seen_point = false;
        while i < bytes.len() {
            let c = bytes[i];
            if c.is_ascii_digit() {
                digits.push(c as char);
                if seen_point {
                    decimals += 1;
                }
                i += 1;
            } else if c == b','
                && !seen_point
                && bytes
                    .get(i + 1..i + 4)
                    .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
                && !bytes.get(i + 4).is_some_and(u8::is_ascii_digit)
            {
                i += 1;
            } else if c == b'.' && !seen_point && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                seen_point = true;
                i += 1;
            } else {
                break;
            }
        }
        let number_end = i;
        let rest = &text[number_end..];
        let gap = if rest.starts_with(' ') {
            1
        } else if rest.starts_with('\u{a0}') {
            '\u{a0}'.len_utf8()
        } else {
            0
        };
        let after = &rest[gap..];
        let unit = UNITS.iter().find(|(u, _, _)| {
            // A bare "B" glued to a number is a count ("a 0.5B model"), not bytes.
            (gap > 0 || *u != "B")
                && after.starts_with(u)
                && !after[u.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
        });
        if let (Some((u, scale, decimal)), Ok(n)) = (unit, digits.parse::<f64>()) {
            let value = n / 10f64.powi(decimals as i32);
            let end = number_end + gap + u.len();
            out.push(StatedFigure {
                text: text[start..end].to_string(),
                at: start,
                bytes: value * scale,
                tolerance: 0.5 * scale / 10f64.powi(decimals as i32),
                decimal: *decimal,
            });
            i = end;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn one(text: &str) -> StatedFigure {
        let f = figures_in(text);
        assert_eq!(f.len(), 1, "{text}: {f:?}");
        f.into_iter().next().expect("one")
    }

    #[test]
    fn a_figure_holds_to_its_last_digit() {
        let f = one("reserved drops to 627 MiB here");
        assert_eq!(f.text, "627 MiB");
        assert!(f.holds_for(627 * MIB));
        assert!(f.holds_for(627 * MIB + MIB / 2 - 1));
        // 628.38 MiB is not "627 MiB".
        assert!(!f.holds_for(628 * MIB + 398 * 1024));
        let f = one("at 870.36 MiB");
        assert!(f.holds_for((870.36 * MIB as f64) as u64));
        assert!(!f.holds_for((870.37 * MIB as f64) as u64));
        let f = one("about 4.3 GiB");
        assert!(f.holds_for((4.27 * (1u64 << 30) as f64) as u64));
        assert!(!f.holds_for((4.36 * (1u64 << 30) as f64) as u64));
    }

    #[test]
    fn units_commas_and_words() {
        let f = one("A hundred tensors of 4,000,000 B each");
        assert_eq!(f.bytes, 4e6);
        assert_eq!(f.tolerance, 0.5);
        let f = one("allocates one 100 MB tensor");
        assert!(f.decimal && f.holds_for(100_000_000));
        // 2.78 MiB is 2.9 MB: decimal units are read as decimal.
        assert!(one("2.9 MB every batch").holds_for(2_915_000));
        assert_eq!(one("a 512 B block").bytes, 512.0);
        // Not sizes: a batch, a version, a word that starts like a unit.
        assert!(figures_in("batch 8,192 with torch 2.11 and 3 Bytes of 4 Bees").is_empty());
        assert!(figures_in("layer4B and v2.5MiB").is_empty());
        assert!(figures_in("Qwen2.5-0.5B and a 7B model").is_empty());
        let two = figures_in("21 × 128 MiB = 2.6 GiB; (1.5KiB)");
        let texts: Vec<&str> = two.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(texts, ["128 MiB", "2.6 GiB", "1.5KiB"]);
    }
}
