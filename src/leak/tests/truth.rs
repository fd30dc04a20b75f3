//! What the leak panel says must be true for a newcomer: leaks first, no
//! "not a leak" beside the leak holding the same bytes, and every fix valid
//! Python for the root it is given to.

use super::super::detector::GroupKind;
use super::super::finding::{settle, Finding, FindingKind, Severity};
use super::super::fix::{self, fix_for};
use super::super::program::ProgramFacts;
use crate::engine::{GradContext, KeepWhat, Program, Step};

fn finding(root: &str, kind: FindingKind, severity: Severity, bytes: u64) -> Finding {
    let mut f = Finding::new(root, kind);
    f.severity = severity;
    f.bytes = bytes;
    f
}

#[test]
fn leaks_come_first_by_severity_then_bytes() {
    let mut v = vec![
        finding(
            "gradients",
            FindingKind::MissingZeroGrad,
            Severity::Warning,
            9 << 20,
        ),
        finding(
            "losses",
            FindingKind::RetainedGraphHost,
            Severity::Warning,
            512,
        ),
        finding(
            "preds",
            FindingKind::StoredTensors,
            Severity::Critical,
            8 << 20,
        ),
        finding(
            "val_total",
            FindingKind::RetainedGraphGpu,
            Severity::Critical,
            3 << 30,
        ),
    ];
    settle(&mut v);
    let roots: Vec<&str> = v.iter().map(|f| f.root.as_str()).collect();
    assert_eq!(roots, ["val_total", "preds", "losses", "gradients"]);
}

#[test]
fn a_one_off_peak_never_sits_beside_a_leak() {
    // The tour at its OOM: the failing iteration alone looks like a one-off
    // peak through `val_total`, which the complete iterations showed leaking.
    let mut peak = finding(
        "vout, vloss, val_total",
        FindingKind::OneOffPeak,
        Severity::Info,
        4 << 30,
    );
    peak.blocks = vec![0x7f00_0000];
    let mut leak = finding(
        "val_total",
        FindingKind::RetainedGraphGpu,
        Severity::Critical,
        3 << 30,
    );
    leak.blocks = vec![0x7f00_0000, 0x7f10_0000];
    leak.growth_per_iter = 196 << 20;
    let mut v = vec![peak, leak];
    settle(&mut v);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].root, "val_total");

    // Fragmentation says "no tensor is retained": not while one grows.
    let frag = finding(
        "allocator cache",
        FindingKind::CacheFragmentation,
        Severity::Info,
        1,
    );
    let mut grows = finding(
        "preds",
        FindingKind::StoredTensors,
        Severity::Critical,
        8 << 20,
    );
    grows.growth_per_iter = 8 << 20;
    let mut v = vec![frag.clone(), grows];
    settle(&mut v);
    assert!(v.iter().all(|f| f.kind.is_leak()));
    // Alone, it stays.
    let mut v = vec![frag];
    settle(&mut v);
    assert_eq!(v.len(), 1);
}

fn facts(steps: Vec<Step>) -> ProgramFacts {
    ProgramFacts::from_program(&Program {
        setup: Vec::new(),
        steps,
        iterations: 1,
        batch_sizes: Vec::new(),
        seq_lens: Vec::new(),
        epoch_len: 0,
    })
}

fn with(extra: Step) -> ProgramFacts {
    let mut steps = Program::forward_steps();
    steps.push(extra);
    facts(steps)
}

#[test]
fn each_fix_fits_its_root() {
    let acc = |from: &str, what| Step::AccumulateLoss {
        from: from.into(),
        into: "total".into(),
        what,
    };
    let append = |from: &str, what| Step::Append {
        from: from.into(),
        list: "kept".into(),
        what,
    };
    let keep = |from: &str| Step::Keep {
        from: from.into(),
        into: "last".into(),
        what: KeepWhat::Tensor,
    };
    use FindingKind::*;
    use GroupKind::*;
    let cases: Vec<(ProgramFacts, &str, GroupKind, FindingKind, &str)> = vec![
        // `.item()` only where the source is a loss (0-dim).
        (
            with(acc("loss", KeepWhat::Tensor)),
            "total",
            Variable,
            RetainedGraphHost,
            "total += loss.item()",
        ),
        (
            with(acc("out", KeepWhat::Tensor)),
            "total",
            Variable,
            RetainedGraphGpu,
            "total += out.detach()",
        ),
        (
            with(append("loss", KeepWhat::Tensor)),
            "kept",
            List,
            RetainedGraphHost,
            "kept.append(loss.item())",
        ),
        (
            with(append("out", KeepWhat::Tensor)),
            "kept",
            List,
            StoredTensors,
            "kept.append(out.detach().cpu())",
        ),
        (
            with(append("out", KeepWhat::Detach)),
            "kept",
            List,
            StoredTensors,
            "kept.append(out.detach().cpu())",
        ),
        (
            with(keep("loss")),
            "last",
            Variable,
            RetainedGraphHost,
            "last = loss.item()",
        ),
        (
            with(keep("out")),
            "last",
            Variable,
            RetainedGraphGpu,
            "last = out.detach()",
        ),
        // No binder the detector knows: the root's own name, never `loss`.
        (
            facts(Program::forward_steps()),
            "out",
            Variable,
            RetainedGraphHost,
            "out = out.detach()",
        ),
        (
            facts(Program::forward_steps()),
            "outs",
            List,
            RetainedGraphHost,
            "outs = [t.detach() for t in outs]",
        ),
        (
            facts(Program::forward_steps()),
            "hidden",
            Hidden,
            CarriedHiddenState,
            fix::DETACH_HIDDEN,
        ),
    ];
    for (facts, root, group, kind, want) in cases {
        let got = fix_for(&facts, root, group, kind);
        assert_eq!(got, want, "{root} ({group:?}, {kind:?})");
        if group == List {
            assert!(!got.contains(".backward()"), "{got}");
        }
    }
}

#[test]
fn eval_with_grad_fixes_name_the_programs_own_forward() {
    let mut steps = Program::forward_steps();
    steps.push(Step::Eval {
        grad: GradContext::Enabled,
    });
    steps.push(Step::Forward {
        input: "vx".into(),
        output: "vout".into(),
        model: None,
    });
    steps.push(Step::Loss {
        output: "vout".into(),
        target: "y".into(),
        into: "vloss".into(),
        divide_by: None,
    });
    steps.push(Step::AccumulateLoss {
        from: "vloss".into(),
        into: "val_total".into(),
        what: KeepWhat::Tensor,
    });
    let f = facts(steps);
    assert_eq!(
        fix::no_grad_eval(&f),
        "with torch.no_grad(): vout = model(vx)"
    );
    assert_eq!(
        fix_for(
            &f,
            "val_total",
            GroupKind::Variable,
            FindingKind::RetainedGraphGpu
        ),
        "with torch.no_grad(): val_total += vloss.item()"
    );
    assert!(f.rebound_each_iteration("vout") && f.rebound_each_iteration("vloss"));
    assert!(!f.rebound_each_iteration("val_total"));
}

/// Every fix above, and the fixed ones, parse as Python where a Python is
/// installed (the shapes are checked above either way).
#[test]
fn fixes_parse_as_python() {
    let mut fixes = vec![
        fix::DETACH_HIDDEN.to_string(),
        fix::ZERO_GRAD.to_string(),
        fix::EXPANDABLE.to_string(),
        fix::rebound_buffer("buf"),
        fix::no_grad_eval(&facts(Program::forward_steps())),
        "total += loss.item()".into(),
        "with torch.no_grad(): vout = model(vx)".into(),
        "outs = [t.detach() for t in outs]".into(),
    ];
    fixes.dedup();
    let program: String = fixes
        .iter()
        .map(|f| format!("compile({f:?}, 'fix', 'exec')\n"))
        .collect();
    let out = std::process::Command::new("python3")
        .args(["-c", &program])
        .output()
        .unwrap_or_else(|e| panic!("{e}: python3 is needed for this test (Debian/Ubuntu: sudo apt-get install python3)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
