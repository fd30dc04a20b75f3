//! Attribution of every allocator request (engine.md §11.1): op, module path,
//! tensor category, iteration, phase and the program step that made it.
//!
//! The allocator only carries an opaque `Tag(u64)`. To keep tagging free of
//! per-request heap work, the tag packs the category, phase and iteration and an
//! interned *site* (op, module, program step). A simulated run has no Python
//! stack: the step number is what leads back to the scenario's own line.

use std::sync::Arc;

use crate::alloc::Tag;
use crate::trace::Phase;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// What a block holds (engine.md §11.1, the brief's categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    /// An op output. Whether autograd currently saves it is a separate, live
    /// fact (`StorageInfo::saved_by`), so the leak view can re-label it.
    Activation,
    /// Kept by autograd from creation (e.g. layer-norm statistics, masks, reserve).
    AutogradSaved,
    /// Dies before the op that made it returns (engine.md §1.4.2).
    Temporary,
    Input,
    /// Module buffers (batch-norm running statistics and counters).
    Buffer,
    Workspace,
    AmpCache,
    /// GradScaler scalars (engine.md §6.3).
    Scaler,
    /// Activations rebuilt by checkpoint recomputation (engine.md §7.2).
    Recompute,
    /// Host-side bookkeeping: never reaches the GPU allocator.
    Cpu,
}

impl Category {
    pub const ALL: [Category; 13] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::AutogradSaved,
        Category::Temporary,
        Category::Input,
        Category::Buffer,
        Category::Workspace,
        Category::AmpCache,
        Category::Scaler,
        Category::Recompute,
        Category::Cpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::AutogradSaved => "autograd_saved",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Buffer => "buffer",
            Category::Workspace => "workspace",
            Category::AmpCache => "amp_cache",
            Category::Scaler => "scaler",
            Category::Recompute => "recompute",
            Category::Cpu => "cpu",
        }
    }

    fn index(self) -> u64 {
        Category::ALL.iter().position(|c| *c == self).unwrap_or(0) as u64
    }
}

/// Everything the engine knows about one request's origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocTag {
    pub op: &'static str,
    pub module: Arc<str>,
    pub category: Category,
    pub iteration: u32,
    pub phase: Phase,
    /// The program step that made the request ([`crate::engine::numbered`]),
    /// or [`NO_STEP`] while the model and optimizer are built.
    pub step: u32,
}

/// The step number of requests made before the first step runs.
pub const NO_STEP: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Site {
    op: &'static str,
    module: Arc<str>,
    step: u32,
}

// Bit layout of a packed tag: site (24 bits) | category (4) | phase (4) | iteration (32).
const SITE_BITS: u64 = 24;
const CAT_SHIFT: u64 = 24;
const PHASE_SHIFT: u64 = 28;
const ITER_SHIFT: u64 = 32;

/// Interns (op, module, step) sites and packs tags.
#[derive(Debug, Clone, Default)]
pub struct TagTable {
    sites: Vec<Site>,
    index: FxHashMap<(usize, u32, u32), u32>,
    modules: Vec<Arc<str>>,
    module_index: FxHashMap<Arc<str>, u32>,
}

impl TagTable {
    pub fn new() -> TagTable {
        let mut t = TagTable::default();
        t.module("");
        // Site 0 is reserved so that no packed tag equals Tag::NONE.
        t.sites.push(Site {
            op: "",
            module: Arc::from(""),
            step: NO_STEP,
        });
        t
    }

    /// Interned id of a module path ("transformer.h.3.attn").
    pub fn module(&mut self, path: &str) -> u32 {
        if let Some(id) = self.module_index.get(path) {
            return *id;
        }
        let arc: Arc<str> = Arc::from(path);
        let id = self.modules.len() as u32;
        self.modules.push(arc.clone());
        self.module_index.insert(arc, id);
        id
    }

    /// The id of a module path already interned.
    pub fn module_id(&self, path: &str) -> Option<u32> {
        self.module_index.get(path).copied()
    }

    pub fn module_path(&self, id: u32) -> Arc<str> {
        self.modules
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    /// The packed tag for a request made by `op` in `module` at program step `step`.
    pub fn tag(
        &mut self,
        op: &'static str,
        module: u32,
        step: u32,
        category: Category,
        phase: Phase,
        iteration: u32,
    ) -> Tag {
        let key = (op.as_ptr() as usize ^ (op.len() << 48), module, step);
        let site = match self.index.get(&key) {
            Some(s) => *s,
            None => {
                let id = self.sites.len() as u32;
                let module_path = self.module_path(module);
                self.sites.push(Site {
                    op,
                    module: module_path,
                    step,
                });
                self.index.insert(key, id);
                id
            }
        };
        Tag(u64::from(site) & ((1 << SITE_BITS) - 1)
            | category.index() << CAT_SHIFT
            | phase_index(phase) << PHASE_SHIFT
            | u64::from(iteration) << ITER_SHIFT)
    }

    /// The category a tag packs, without the table (`None` for an untagged
    /// request): cheap enough to read on every event of a run.
    pub fn category_of(tag: Tag) -> Option<Category> {
        if tag.0 & ((1 << SITE_BITS) - 1) == 0 {
            return None;
        }
        Category::ALL
            .get(((tag.0 >> CAT_SHIFT) & 0xf) as usize)
            .copied()
    }

    /// Decode a tag produced by [`TagTable::tag`].
    pub fn info(&self, tag: Tag) -> Option<AllocTag> {
        let site = (tag.0 & ((1 << SITE_BITS) - 1)) as usize;
        if site == 0 {
            return None;
        }
        let s = self.sites.get(site)?;
        let category = *Category::ALL.get(((tag.0 >> CAT_SHIFT) & 0xf) as usize)?;
        let phase = *Phase::ALL.get(((tag.0 >> PHASE_SHIFT) & 0xf) as usize)?;
        Some(AllocTag {
            op: s.op,
            module: s.module.clone(),
            category,
            iteration: (tag.0 >> ITER_SHIFT) as u32,
            phase,
            step: s.step,
        })
    }
}

fn phase_index(phase: Phase) -> u64 {
    Phase::ALL.iter().position(|p| *p == phase).unwrap_or(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        let mut t = TagTable::new();
        let m = t.module("transformer.h.0.attn");
        let tag = t.tag("addmm", m, 3, Category::Activation, Phase::Forward, 7);
        assert_ne!(tag, Tag::NONE);
        let info = t.info(tag).expect("known tag");
        assert_eq!(info.op, "addmm");
        assert_eq!(&*info.module, "transformer.h.0.attn");
        assert_eq!(info.category, Category::Activation);
        assert_eq!(info.phase, Phase::Forward);
        assert_eq!(info.iteration, 7);
        assert_eq!(info.step, 3);
        assert_eq!(
            t.tag("addmm", m, 3, Category::Gradient, Phase::Backward, 1)
                .0
                & 0xff_ffff,
            tag.0 & 0xff_ffff
        );
    }
}
