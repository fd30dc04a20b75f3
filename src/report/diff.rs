//! `vramscope diff A B`: what is alive in snapshot B and was not in A,
//! grouped by first user frame: the leak hunter's question for a job that
//! cannot be re-run as a scenario.
//!
//! A block of B is "the same" as one of A when both sit on the same device
//! at the same address with the same size and the same recorded stack:
//! snapshots carry no tensor identity, so a tensor freed and allocated
//! again at that address by the same line is indistinguishable from one
//! that stayed, and the report says so.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;
use serde::Serialize;

use crate::alloc::{format_size, Action, BlockState};
use crate::trace::sites::NO_STACK;
use crate::trace::snapshot::{FramesId, Snapshot};

/// What identifies a live block across two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct BlockKey {
    device: i64,
    address: u64,
    size: u64,
    stack: u64,
}

/// One live (active or pending-free) block, as a diff needs it.
#[derive(Debug, Clone)]
struct LiveBlock {
    key: BlockKey,
    site: Arc<str>,
    /// The site with its file's directories dropped: how the site is matched
    /// across the two files (one job dumped from another directory, or its
    /// packages installed elsewhere, records other paths for the same lines).
    site_key: Arc<str>,
    /// The newest `alloc` of its address in the file's trace, if any.
    time_us: Option<i64>,
}

/// The live blocks of one snapshot, reduced to what a diff needs, so that
/// the snapshot itself can be dropped (two large files need not fit at
/// once, and a view that holds many files keeps only these).
#[derive(Debug, Clone, Default)]
pub struct LiveSet {
    blocks: Vec<LiveBlock>,
}

/// A file name without its directories (`/home/a/run2/train.py` →
/// `train.py`; Windows separators too).
fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// A stack's identity across files: each frame's file name (not its
/// directories), line and function.
fn stack_hash(snap: &Snapshot, frames: FramesId) -> u64 {
    let mut h = FxHasher::default();
    for f in snap.frames.resolve(frames) {
        file_name(&f.filename).hash(&mut h);
        f.line.hash(&mut h);
        f.name.hash(&mut h);
    }
    h.finish()
}

fn live_blocks(snap: &Snapshot) -> impl Iterator<Item = (i64, &crate::trace::snapshot::Block)> {
    snap.segments.iter().flat_map(|s| {
        s.blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(move |b| (s.device, b))
    })
}

impl LiveSet {
    pub fn of(snap: &Snapshot) -> LiveSet {
        let times = alloc_times(snap);
        // Blocks of one stack share its site and hash.
        let mut by_stack: HashMap<FramesId, (Arc<str>, Arc<str>, u64)> = HashMap::new();
        let blocks = live_blocks(snap)
            .map(|(device, b)| {
                let (site, site_key, stack) = by_stack
                    .entry(b.frames)
                    .or_insert_with(|| {
                        let user = snap.first_user_frame(b.frames);
                        let site = user.map_or_else(
                            || Arc::from(NO_STACK),
                            |f| Arc::from(format!("{}:{} in {}", f.filename, f.line, f.name)),
                        );
                        let key = user.map_or_else(
                            || Arc::from(NO_STACK),
                            |f| {
                                Arc::from(format!(
                                    "{}:{} in {}",
                                    file_name(&f.filename),
                                    f.line,
                                    f.name
                                ))
                            },
                        );
                        (site, key, stack_hash(snap, b.frames))
                    })
                    .clone();
                LiveBlock {
                    key: BlockKey {
                        device,
                        address: b.address,
                        size: b.size,
                        stack,
                    },
                    site,
                    site_key,
                    time_us: times.get(&(device, b.address)).copied(),
                }
            })
            .collect();
        LiveSet { blocks }
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    fn devices(&self) -> impl Iterator<Item = i64> + '_ {
        self.blocks.iter().map(|b| b.key.device)
    }

    fn on(&self, device: i64) -> impl Iterator<Item = &LiveBlock> {
        self.blocks.iter().filter(move |b| b.key.device == device)
    }
}

/// The change in live bytes of one first user frame from A to B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SiteChange {
    pub site: String,
    pub a_bytes: u64,
    pub b_bytes: u64,
    pub a_blocks: usize,
    pub b_blocks: usize,
}

impl SiteChange {
    pub fn change(&self) -> i128 {
        i128::from(self.b_bytes) - i128::from(self.a_bytes)
    }
}

/// New live bytes of one first user frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewSite {
    pub site: String,
    pub bytes: u64,
    pub blocks: usize,
    /// The trace time of the newest of these blocks' allocations, where B's
    /// trace still holds it.
    pub newest_time_us: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceDiff {
    pub device: i64,
    /// Live (active and pending-free) bytes and blocks in each snapshot.
    pub a_live_bytes: u64,
    pub a_live_blocks: usize,
    pub b_live_bytes: u64,
    pub b_live_blocks: usize,
    /// Alive in B and not in A.
    pub new_bytes: u64,
    pub new_blocks: usize,
    /// Alive in A and no longer in B.
    pub gone_bytes: u64,
    pub gone_blocks: usize,
    /// `new` by first user frame, newest first (largest first without times).
    pub sites: Vec<NewSite>,
    /// Every first user frame whose live bytes changed, most growth first:
    /// a block freed and allocated again elsewhere is new, but its line's
    /// live bytes do not grow; a leak's do.
    pub changes: Vec<SiteChange>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotDiff {
    pub a: String,
    pub b: String,
    pub identity: &'static str,
    pub devices: Vec<DeviceDiff>,
}

const IDENTITY: &str = "the same block: same device, address, size and stack, frames compared by file name, not directory (snapshots carry no tensor identity)";

/// The newest allocation time of each address in B's traces.
fn alloc_times(snap: &Snapshot) -> HashMap<(i64, u64), i64> {
    let mut times = HashMap::new();
    for (d, trace) in snap.device_traces.iter().enumerate() {
        let Ok(device) = i64::try_from(d) else {
            continue;
        };
        for e in trace.iter().filter(|e| e.action == Action::Alloc) {
            if let Some(t) = e.time_us() {
                times.insert((device, e.addr), t);
            }
        }
    }
    times
}

fn change(site: &Arc<str>) -> SiteChange {
    SiteChange {
        site: site.to_string(),
        a_bytes: 0,
        b_bytes: 0,
        a_blocks: 0,
        b_blocks: 0,
    }
}

pub fn diff(a_name: &str, a: &LiveSet, b_name: &str, b: &LiveSet) -> SnapshotDiff {
    let a_keys: HashSet<BlockKey> = a.blocks.iter().map(|x| x.key).collect();
    let mut devices: Vec<i64> = a.devices().chain(b.devices()).collect();
    devices.sort_unstable();
    devices.dedup();
    let devices = devices
        .into_iter()
        .map(|device| device_diff(device, a, &a_keys, b))
        .collect();
    SnapshotDiff {
        a: a_name.to_string(),
        b: b_name.to_string(),
        identity: IDENTITY,
        devices,
    }
}

fn device_diff(device: i64, a: &LiveSet, a_keys: &HashSet<BlockKey>, b: &LiveSet) -> DeviceDiff {
    let mut d = DeviceDiff {
        device,
        a_live_bytes: 0,
        a_live_blocks: 0,
        b_live_bytes: 0,
        b_live_blocks: 0,
        new_bytes: 0,
        new_blocks: 0,
        gone_bytes: 0,
        gone_blocks: 0,
        sites: Vec::new(),
        changes: Vec::new(),
    };
    // Sites are matched by `site_key`; a changed site is shown as B spells it.
    let mut by_site: HashMap<Arc<str>, SiteChange> = HashMap::new();
    for blk in a.on(device) {
        d.a_live_bytes = d.a_live_bytes.saturating_add(blk.key.size);
        d.a_live_blocks += 1;
        let c = by_site
            .entry(blk.site_key.clone())
            .or_insert_with(|| change(&blk.site));
        c.a_bytes = c.a_bytes.saturating_add(blk.key.size);
        c.a_blocks += 1;
    }
    let mut kept_bytes = 0u64;
    let mut kept_blocks = 0usize;
    let mut sites: HashMap<Arc<str>, NewSite> = HashMap::new();
    for blk in b.on(device) {
        d.b_live_bytes = d.b_live_bytes.saturating_add(blk.key.size);
        d.b_live_blocks += 1;
        let c = by_site
            .entry(blk.site_key.clone())
            .or_insert_with(|| change(&blk.site));
        c.site = blk.site.to_string();
        c.b_bytes = c.b_bytes.saturating_add(blk.key.size);
        c.b_blocks += 1;
        if a_keys.contains(&blk.key) {
            kept_bytes = kept_bytes.saturating_add(blk.key.size);
            kept_blocks += 1;
            continue;
        }
        d.new_bytes = d.new_bytes.saturating_add(blk.key.size);
        d.new_blocks += 1;
        let s = sites.entry(blk.site.clone()).or_insert_with(|| NewSite {
            site: blk.site.to_string(),
            bytes: 0,
            blocks: 0,
            newest_time_us: None,
        });
        s.bytes = s.bytes.saturating_add(blk.key.size);
        s.blocks += 1;
        s.newest_time_us = s.newest_time_us.max(blk.time_us);
    }
    d.gone_bytes = d.a_live_bytes.saturating_sub(kept_bytes);
    d.gone_blocks = d.a_live_blocks.saturating_sub(kept_blocks);
    let mut sites: Vec<NewSite> = sites.into_values().collect();
    sites.sort_by(|x, y| {
        y.newest_time_us
            .cmp(&x.newest_time_us)
            .then(y.bytes.cmp(&x.bytes))
            .then_with(|| x.site.cmp(&y.site))
    });
    d.sites = sites;
    let mut changes: Vec<SiteChange> = by_site
        .into_values()
        .filter(|c| c.a_bytes != c.b_bytes)
        .collect();
    changes.sort_by(|x, y| {
        y.change()
            .cmp(&x.change())
            .then_with(|| x.site.cmp(&y.site))
    });
    d.changes = changes;
    d
}

fn blocks(n: usize) -> String {
    format!("{n} block{}", if n == 1 { "" } else { "s" })
}

/// Sites listed per device in the text report.
const LISTED: usize = 20;

impl SnapshotDiff {
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "diff {} → {}", self.a, self.b);
        let _ = writeln!(out, "({})", self.identity);
        if self.devices.is_empty() {
            let _ = writeln!(out, "\nneither snapshot holds a live block");
        }
        for d in &self.devices {
            let _ = writeln!(
                out,
                "\ndevice {}: live {} in {} → {} in {}",
                d.device,
                format_size(d.a_live_bytes),
                blocks(d.a_live_blocks),
                format_size(d.b_live_bytes),
                blocks(d.b_live_blocks)
            );
            let _ = writeln!(
                out,
                "  alive in B and not in A: {} in {}; alive in A and gone from B: {} in {}",
                format_size(d.new_bytes),
                blocks(d.new_blocks),
                format_size(d.gone_bytes),
                blocks(d.gone_blocks)
            );
            let grew: Vec<&SiteChange> = d.changes.iter().filter(|c| c.change() > 0).collect();
            if grew.is_empty() {
                let _ = writeln!(
                    out,
                    "  no first user frame holds more live bytes in B than in A"
                );
            } else {
                let _ = writeln!(out, "  live bytes grew, by first user frame (most first):");
                for c in grew.iter().take(LISTED) {
                    let _ = writeln!(
                        out,
                        "  {:>12}  {} → {} blocks  {}",
                        format!("+{}", format_size(c.b_bytes.saturating_sub(c.a_bytes))),
                        c.a_blocks,
                        c.b_blocks,
                        c.site
                    );
                }
                if grew.len() > LISTED {
                    let _ = writeln!(out, "  … and {} more sites", grew.len() - LISTED);
                }
            }
            if d.sites.is_empty() {
                continue;
            }
            let timed = d.sites.iter().any(|s| s.newest_time_us.is_some());
            let _ = writeln!(
                out,
                "  blocks new in B (an address, size or stack A did not have) by first user frame, {}:",
                if timed {
                    "newest allocation first (B's trace times)"
                } else {
                    "largest first (B's trace holds no times for them)"
                }
            );
            for s in d.sites.iter().take(LISTED) {
                let _ = writeln!(
                    out,
                    "  {:>12}  {:>6} block{}  {}",
                    format!("+{}", format_size(s.bytes)),
                    s.blocks,
                    if s.blocks == 1 { " " } else { "s" },
                    s.site
                );
            }
            if d.sites.len() > LISTED {
                let _ = writeln!(out, "  … and {} more sites", d.sites.len() - LISTED);
            }
        }
        out
    }
}
