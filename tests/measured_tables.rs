//! The measured cuDNN tables a traced program finds its sizes in
//! (`assets/measured/`, `vramscope::engine::measured`) hold what the
//! scenarios carry beside their captures, no more and no less: every
//! convolution shape a scenario on that GPU and release carries is in the
//! table with the same sizes, every RNN workspace, reserve and dropout state
//! a scenario carries is one the table has, and every entry of the table
//! comes from some scenario. So the two cannot drift apart.

use std::path::PathBuf;

use vramscope::alloc::TorchVersion;
use vramscope::engine::measured::{all_measured, measured_on};
use vramscope::scenario::{resolve, Built};

/// Every scenario file: the built-ins and the test scenarios beside the
/// captures.
fn scenarios() -> Vec<(String, Built)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["scenarios", "tests/fixtures/pytorch"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .expect("a scenario folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "ron"))
            .collect();
        files.sort();
        for f in files {
            let name = f.display().to_string();
            let (_, built) = resolve(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push((name, built));
        }
    }
    out
}

fn on(built: &Built, gpu: &str, torch: &str) -> bool {
    built.conditions.gpu.is_some_and(|g| g.name == gpu) && built.conditions.torch == torch
}

#[test]
fn every_measured_table_holds_what_its_scenarios_carry() {
    let all = scenarios();
    assert!(!all_measured().is_empty(), "the tables parse");
    for table in all_measured() {
        let version: TorchVersion = table.torch.parse().expect("a release");
        assert!(std::ptr::eq(
            measured_on(&table.gpu, version).expect("found by its GPU and release"),
            table
        ));
        let mine: Vec<&(String, Built)> = all
            .iter()
            .filter(|(_, b)| on(b, &table.gpu, &table.torch))
            .collect();
        // Convolutions: each carried entry is the table's, and each of the
        // table's is carried somewhere.
        let mut used = vec![false; table.conv_workspaces.len()];
        for (name, built) in &mine {
            for c in &built.engine.conv_workspaces {
                let at = table
                    .conv_workspaces
                    .iter()
                    .position(|t| t == c)
                    .unwrap_or_else(|| panic!("{name}: {c:?} is not in the {} table", table.gpu));
                used[at] = true;
            }
        }
        for (c, u) in table.conv_workspaces.iter().zip(&used) {
            assert!(u, "{c:?}: no scenario carries it");
        }
        // RNNs: a scenario that carries cuDNN's RNN sizes carries one of the
        // table's entries (its workspace, and in training its reserve), and
        // the table's dropout state.
        let entries: Vec<(u64, u64, bool)> = table
            .rnn_entries()
            .map(|(s, w, r)| (w, r, s.train))
            .collect();
        let mut rnn_used = vec![false; entries.len()];
        for (name, built) in &mine {
            let cfg = &built.engine;
            let Some(reserve) = cfg.rnn_reserve_bytes else {
                // An eval-only scenario carries its inference workspace.
                if let Some(i) = entries
                    .iter()
                    .position(|(w, _, train)| !train && *w == cfg.rnn_workspace_bytes)
                {
                    rnn_used[i] = true;
                }
                continue;
            };
            let at = entries
                .iter()
                .position(|(w, r, train)| *train && *w == cfg.rnn_workspace_bytes && *r == reserve)
                .unwrap_or_else(|| {
                    panic!(
                        "{name}: its RNN workspace and reserve are not in the {} table",
                        table.gpu
                    )
                });
            rnn_used[at] = true;
            assert_eq!(
                Some(cfg.cudnn_dropout_state_bytes),
                table.dropout_state,
                "{name}: the dropout state"
            );
        }
        for (e, u) in entries.iter().zip(&rnn_used) {
            assert!(u, "{e:?}: no scenario carries it");
        }
    }
}
