//! One leak finding, as the report and the leak panel show it.

use serde::Serialize;

/// What kind of memory growth (or non-growth) was found (engine.md §9, §11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A live tensor with a grad_fn keeps autograd graphs, and their saved
    /// tensors, alive on the GPU across iterations.
    RetainedGraphGpu,
    /// Graphs grow host-side only: saved tensors were freed by backward, the
    /// nodes are not (GPU flat, CPU memory grows).
    RetainedGraphHost,
    /// Outputs or detached tensors appended to a list stay on the GPU.
    StoredTensors,
    /// A hidden state carried across iterations chains their graphs.
    CarriedHiddenState,
    /// Reserved grows while allocated stays flat: fragmentation, not a leak.
    CacheFragmentation,
    /// A one-off peak (e.g. eval without no_grad): not a leak.
    OneOffPeak,
    /// Gradients accumulate without zero_grad: values wrong, memory flat.
    MissingZeroGrad,
    /// Imported trace: allocations from one call site survive iteration
    /// boundaries and keep accumulating.
    SurvivingAllocations,
    /// `with torch.autocast(...)` kept open across iterations: its cache of
    /// low-precision weight casts is never cleared, and after each
    /// `optimizer.step()` it holds the weights of before the update.
    StaleAutocastCache,
    /// The optimizer holds the parameters of a model the program no longer
    /// has (re-created after the optimizer was built): they, their
    /// gradients and their state stay alive, and the optimizer steps them
    /// instead of the model that trains.
    StaleOptimizerParams,
    /// A second model's parameters (a teacher's) have gradients: a loss
    /// reached them, and no optimizer zeroes or steps them.
    StrayGradients,
    /// A live job: a Python name (a container, a variable, a hook's
    /// closure) whose tensors and their graphs grew since the helper's last
    /// look.
    GrowingHolder,
    /// A live job: a Python name holding tensors, as the helper found it
    /// when asked (not judged to grow).
    PythonHolder,
}

impl FindingKind {
    pub const ALL: [FindingKind; 13] = [
        FindingKind::RetainedGraphGpu,
        FindingKind::RetainedGraphHost,
        FindingKind::StoredTensors,
        FindingKind::CarriedHiddenState,
        FindingKind::CacheFragmentation,
        FindingKind::OneOffPeak,
        FindingKind::MissingZeroGrad,
        FindingKind::SurvivingAllocations,
        FindingKind::StaleAutocastCache,
        FindingKind::StaleOptimizerParams,
        FindingKind::StrayGradients,
        FindingKind::GrowingHolder,
        FindingKind::PythonHolder,
    ];

    /// The kind `as_str` names.
    pub fn from_name(name: &str) -> Option<FindingKind> {
        FindingKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// A kind's name (the scenario language's) in words, or the name
    /// itself where it names no kind.
    pub fn words_for(name: &str) -> &str {
        match FindingKind::from_name(name) {
            Some(kind) => kind.label(),
            None => name,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::RetainedGraphGpu => "retained_graph_gpu",
            FindingKind::RetainedGraphHost => "retained_graph_host",
            FindingKind::StoredTensors => "stored_tensors",
            FindingKind::CarriedHiddenState => "carried_hidden_state",
            FindingKind::CacheFragmentation => "cache_fragmentation",
            FindingKind::OneOffPeak => "one_off_peak",
            FindingKind::MissingZeroGrad => "missing_zero_grad",
            FindingKind::SurvivingAllocations => "surviving_allocations",
            FindingKind::StaleAutocastCache => "stale_autocast_cache",
            FindingKind::StaleOptimizerParams => "stale_optimizer_params",
            FindingKind::StrayGradients => "stray_gradients",
            FindingKind::GrowingHolder => "growing_holder",
            FindingKind::PythonHolder => "python_holder",
        }
    }

    /// The kind in words, for screens and text reports (`as_str` is the
    /// JSON's and the scenario language's name).
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::RetainedGraphGpu => "retained autograd graph",
            FindingKind::RetainedGraphHost => "graphs kept on the host",
            FindingKind::StoredTensors => "stored tensors",
            FindingKind::CarriedHiddenState => "carried hidden state",
            FindingKind::CacheFragmentation => "cache fragmentation",
            FindingKind::OneOffPeak => "one-off peak",
            FindingKind::MissingZeroGrad => "gradients never zeroed",
            FindingKind::SurvivingAllocations => "surviving allocations",
            FindingKind::StaleAutocastCache => "stale autocast weight cache",
            FindingKind::StaleOptimizerParams => "an old model kept by the optimizer",
            FindingKind::StrayGradients => "gradients no optimizer steps",
            FindingKind::GrowingHolder => "a Python name holds what grew",
            FindingKind::PythonHolder => "held by a Python name",
        }
    }

    /// [`FindingKind::label`] in at most 14 characters, for one-line lists.
    pub fn short_label(self) -> &'static str {
        match self {
            FindingKind::RetainedGraphGpu => "retained graph",
            FindingKind::RetainedGraphHost => "host graphs",
            FindingKind::StoredTensors => "stored tensors",
            FindingKind::CarriedHiddenState => "carried hidden",
            FindingKind::CacheFragmentation => "fragmentation",
            FindingKind::OneOffPeak => "one-off peak",
            FindingKind::MissingZeroGrad => "never zeroed",
            FindingKind::SurvivingAllocations => "survivors",
            FindingKind::StaleAutocastCache => "stale autocast",
            FindingKind::StaleOptimizerParams => "old model kept",
            FindingKind::StrayGradients => "stray grads",
            FindingKind::GrowingHolder => "growing holder",
            FindingKind::PythonHolder => "python holder",
        }
    }

    /// Whether the kind is a memory leak (the others are said plainly not to be).
    pub fn is_leak(self) -> bool {
        matches!(
            self,
            FindingKind::RetainedGraphGpu
                | FindingKind::RetainedGraphHost
                | FindingKind::StoredTensors
                | FindingKind::CarriedHiddenState
                | FindingKind::SurvivingAllocations
                | FindingKind::StaleOptimizerParams
                | FindingKind::StrayGradients
                | FindingKind::GrowingHolder
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// A root and what it holds (the report's `"leaks"` entries).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The variable or holder, e.g. `total_loss`, `losses[3]`, `hidden`.
    pub root: String,
    pub kind: FindingKind,
    /// Bytes kept alive exclusively by the root now.
    pub bytes: u64,
    /// Bytes added per iteration (measured).
    pub growth_per_iter: i64,
    /// Iterations the retained memory spans.
    pub iterations: u32,
    /// From the root to what it holds, e.g. `total_loss → AddBackward0 → … → saved mat1 [256×1024 fp32, 1.0 MiB]`.
    pub path: Vec<String>,
    /// One line in PyTorch terms, e.g. `total_loss += loss.item()`.
    pub fix: String,
    pub severity: Severity,
    /// What the evidence is, in words (and what cannot be concluded).
    pub evidence: String,
    /// "At this rate the device is full at iteration N", when growing and
    /// the run has not run out of memory (then the fact replaces it).
    pub full_at_iteration: Option<u64>,
    /// The iteration the run ran out of memory in, when it did.
    pub ran_out_at_iteration: Option<u64>,
    /// Bytes held, split by what they are (`autograd_saved`, `activation`,
    /// `gradient`, …), largest first.
    pub by_category: Vec<(&'static str, u64)>,
    /// Addresses of the blocks the finding holds, for highlighting on the map.
    #[serde(skip)]
    pub blocks: Vec<u64>,
}

impl Finding {
    /// An empty finding of `kind` for `root`, to be filled in.
    pub fn new(root: impl Into<String>, kind: FindingKind) -> Finding {
        Finding {
            root: root.into(),
            kind,
            bytes: 0,
            growth_per_iter: 0,
            iterations: 0,
            path: Vec::new(),
            fix: String::new(),
            severity: Severity::Info,
            evidence: String::new(),
            full_at_iteration: None,
            ran_out_at_iteration: None,
            by_category: Vec::new(),
            blocks: Vec::new(),
        }
    }
}

/// The findings as a reader should meet them: leaks first, the most severe
/// and largest first. A finding that is not a leak (a one-off peak, the
/// cache's growth) is dropped where a leak holds the same memory: "flat, not
/// a leak" must never sit beside the leak that holds those bytes.
pub fn settle(findings: &mut Vec<Finding>) {
    let leaks: Vec<&Finding> = findings.iter().filter(|f| f.kind.is_leak()).collect();
    if !leaks.is_empty() {
        let mut held: Vec<u64> = leaks
            .iter()
            .flat_map(|f| f.blocks.iter().copied())
            .collect();
        held.sort_unstable();
        let gpu_growth = leaks
            .iter()
            .any(|f| f.growth_per_iter > 0 && f.kind != FindingKind::RetainedGraphHost);
        let roots: Vec<String> = leaks.iter().map(|f| f.root.clone()).collect();
        findings.retain(|f| {
            f.kind.is_leak()
                || !(f.kind == FindingKind::OneOffPeak
                    || (f.kind == FindingKind::CacheFragmentation && gpu_growth)
                    || roots.contains(&f.root)
                    || f.blocks.iter().any(|b| held.binary_search(b).is_ok()))
        });
    }
    findings.sort_by(|a, b| {
        (b.kind.is_leak(), b.severity, b.bytes).cmp(&(a.kind.is_leak(), a.severity, a.bytes))
    });
}

#[cfg(test)]
mod label_tests {
    use super::FindingKind;

    #[test]
    fn every_kind_has_words_and_a_short_form_that_fits_a_list() {
        for k in FindingKind::ALL {
            assert!(!k.label().contains('_'), "{k:?}");
            assert!(k.short_label().chars().count() <= 14, "{k:?}");
            assert_eq!(FindingKind::from_name(k.as_str()), Some(k));
        }
    }
}
