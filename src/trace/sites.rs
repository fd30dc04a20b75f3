//! Live bytes grouped by allocation site: for a snapshot, the first user
//! frame of each block's stack (`file:line in name`); for a simulated run,
//! the engine's op and module. One rule for the headless report's "biggest
//! live allocations by first user frame" and the UI's "by Python line" view.

use std::collections::HashMap;
use std::sync::Arc;

/// The site of blocks whose allocation recorded no stack.
pub const NO_STACK: &str = "(no stack recorded)";

/// The live blocks of one site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteBytes {
    pub site: Arc<str>,
    pub bytes: u64,
    /// Block addresses, ascending.
    pub blocks: Vec<u64>,
    /// Whether `site` stands for "no site recorded" rather than a site.
    pub unknown: bool,
}

/// `(address, size, site)` of live blocks grouped by site, the most bytes
/// first (ties by site). Blocks without a site are grouped under
/// `unknown` (e.g. [`NO_STACK`]).
pub fn group_by_site(
    blocks: impl IntoIterator<Item = (u64, u64, Option<Arc<str>>)>,
    unknown: &str,
) -> Vec<SiteBytes> {
    let mut index: HashMap<Option<Arc<str>>, usize> = HashMap::new();
    let mut out: Vec<SiteBytes> = Vec::new();
    for (addr, size, site) in blocks {
        let i = *index.entry(site.clone()).or_insert_with(|| {
            out.push(SiteBytes {
                unknown: site.is_none(),
                site: site.unwrap_or_else(|| Arc::from(unknown)),
                bytes: 0,
                blocks: Vec::new(),
            });
            out.len() - 1
        });
        let s = &mut out[i];
        // Saturating: sizes may come from a file.
        s.bytes = s.bytes.saturating_add(size);
        s.blocks.push(addr);
    }
    for s in &mut out {
        s.blocks.sort_unstable();
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_bytes_first_and_unknown_sites_together() {
        let a: Arc<str> = Arc::from("a.py:1 in f");
        let b: Arc<str> = Arc::from("b.py:2 in g");
        let groups = group_by_site(
            [
                (0x300, 10, Some(a.clone())),
                (0x100, 30, Some(b.clone())),
                (0x200, 15, Some(a.clone())),
                (0x400, 5, None),
                (0x500, 7, None),
            ],
            NO_STACK,
        );
        let got: Vec<(&str, u64, Vec<u64>, bool)> = groups
            .iter()
            .map(|g| (&*g.site, g.bytes, g.blocks.clone(), g.unknown))
            .collect();
        assert_eq!(
            got,
            vec![
                ("b.py:2 in g", 30, vec![0x100], false),
                ("a.py:1 in f", 25, vec![0x200, 0x300], false),
                (NO_STACK, 12, vec![0x400, 0x500], true),
            ]
        );
    }
}
