//! Who holds the GPU memory at an observation: every group of roots (the
//! program's names, and the model's parameters, gradients, optimizer state,
//! caches) with the bytes it alone keeps alive, and what no single name
//! holds. The OOM answer lists the largest of these.

use serde::Serialize;

use super::detector::{GroupKind, NONE, SHARED};
use super::program::ProgramFacts;
use super::reach::GroupAcc;
use crate::engine::{DeviceKind, HeldState};

/// One holder of GPU memory at an observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// The name (`preds`, `hidden`), or what it is (`parameters`).
    pub name: String,
    /// What kind of holder, in words (`list, 51 items`).
    pub what: String,
    /// Block bytes it alone keeps alive: its tensors and the saved tensors
    /// of graphs only it reaches.
    pub bytes: u64,
    /// Of those, bytes of storages made in the iteration observed.
    pub this_iteration: u64,
    /// Roots in it (a container's items; 0 for what no name holds).
    pub items: u32,
    /// A name the program binds (not the model's or PyTorch's own).
    pub named: bool,
}

/// The holders of one observation, largest first, with what no one name
/// holds.
pub(super) fn holders(
    ls: &HeldState,
    accs: &[GroupAcc],
    owner: &[u32],
    facts: &ProgramFacts,
) -> Vec<Holder> {
    let mut out: Vec<Holder> = accs
        .iter()
        .filter(|a| a.sample.gpu() > 0)
        .map(|a| {
            let s = &a.sample;
            let old = s.own_old + s.graph_old;
            Holder {
                name: a.name.to_string(),
                what: describe(a, facts),
                bytes: s.gpu(),
                this_iteration: s.gpu().saturating_sub(old),
                items: s.elements,
                named: a.kind != GroupKind::Other,
            }
        })
        .collect();
    let (mut shared, mut engine, mut shared_new, mut engine_new) = (0, 0, 0, 0);
    for (p, st) in ls.storages.iter().enumerate() {
        if st.device != DeviceKind::Cuda {
            continue;
        }
        let new = if st.iteration >= ls.iteration {
            st.block
        } else {
            0
        };
        match owner.get(p).copied().unwrap_or(NONE) {
            SHARED => {
                shared += st.block;
                shared_new += new;
            }
            NONE if st.engine_held => {
                engine += st.block;
                engine_new += new;
            }
            _ => {}
        }
    }
    if shared > 0 {
        out.push(Holder {
            name: "tensors several names share".into(),
            what: "held by more than one of the names".into(),
            bytes: shared,
            this_iteration: shared_new,
            items: 0,
            named: false,
        });
    }
    if engine > 0 {
        out.push(Holder {
            name: "library workspaces".into(),
            what: "cuBLAS/cuDNN workspaces and states PyTorch keeps".into(),
            bytes: engine,
            this_iteration: engine_new,
            items: 0,
            named: false,
        });
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    out
}

fn describe(a: &GroupAcc, facts: &ProgramFacts) -> String {
    let n = u64::from(a.sample.elements);
    match a.kind {
        GroupKind::List => {
            let noun = if facts.bounded.contains_key(a.name) {
                "deque"
            } else {
                facts.container_noun(a.name)
            };
            format!("{noun}, {}", crate::units::counted(n, "item"))
        }
        GroupKind::Hidden => "the carried hidden state".into(),
        GroupKind::Cycle => "objects in reference cycles".into(),
        GroupKind::Variable if a.sample.graph > 0 => "a variable and the graph it reaches".into(),
        GroupKind::Variable => "a variable".into(),
        GroupKind::Other => "the model's and PyTorch's own".into(),
    }
}
