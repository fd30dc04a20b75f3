//! What the reports say, read as a newcomer reads them: the facts of the
//! run before any projection, words instead of internal names, and counts
//! that agree with their nouns.

mod common;

use common::{json, vramscope};

/// A leak that ran the device out of memory: the report says when it did,
/// and projects no later "device is full" iteration.
#[test]
fn a_leak_that_ran_out_of_memory_says_when_not_when_it_would() {
    let (code, out, err) = vramscope(&["run", "accumulate-loss-eval-bug", "--json"]);
    assert!(code == 0 || code == 1, "{err}");
    let v = json(&out);
    let oom_at = v["oom"]["iteration"]
        .as_u64()
        .expect("the run runs out of memory");
    let leaks = v["leaks"].as_array().expect("leaks");
    assert!(!leaks.is_empty(), "{v}");
    for f in leaks {
        assert_eq!(f["ran_out_at_iteration"].as_u64(), Some(oom_at), "{f}");
        assert!(f["full_at_iteration"].is_null(), "{f}");
    }
    let (_, text, _) = vramscope(&["run", "accumulate-loss-eval-bug", "--headless"]);
    assert!(
        text.contains(&format!("the run ran out of memory at iteration {oom_at}")),
        "{text}"
    );
    assert!(!text.contains("device is full at iteration"), "{text}");
}

/// Finding kinds are said in words on the text report, never as the JSON's
/// identifiers; the JSON keeps its identifiers.
#[test]
fn finding_kinds_are_words_in_the_text_report() {
    let (_, text, _) = vramscope(&["run", "accumulate-loss-eval-bug", "--headless"]);
    assert!(text.contains("retained autograd graph"), "{text}");
    for internal in [
        "retained_graph_gpu",
        "stored_tensors",
        "[Warning]",
        "[Critical]",
    ] {
        assert!(!text.contains(internal), "{internal} in:\n{text}");
    }
    let (_, out, _) = vramscope(&["run", "accumulate-loss-eval-bug", "--json"]);
    assert_eq!(json(&out)["leaks"][0]["kind"], "retained_graph_gpu");
}

/// "1 iteration", "1 step": counts agree with their nouns.
#[test]
fn counts_agree_with_their_nouns() {
    let dir = common::temp_dir("one-iteration");
    let file = dir.join("one.ron");
    let one = common::VALID.replace("iterations: 3", "iterations: 1");
    std::fs::write(&file, one).expect("write");
    let (code, out, err) = vramscope(&["check", file.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(6 steps, 1 iteration)"), "{out}");
    assert!(!out.contains("1 iterations"), "{out}");
}
