//! A leaked block as a teacher meets it: `f` / `F` select the blocks a leak
//! holds, and a simulated block says which scenario step made it (the file,
//! the line and column, the statement), never a made-up Python frame.

use super::helpers::*;

/// The tour at its OOM, where the detector holds `val_total`'s leak.
fn tour_at_the_end() -> crate::tui::app::App {
    let mut app = leaky_app();
    keys(&mut app, "G");
    screen(&mut app, 140, 44);
    app
}

fn leak_blocks(app: &crate::tui::app::App) -> Vec<u64> {
    app.runs[0]
        .findings
        .iter()
        .filter(|f| f.kind.is_leak())
        .flat_map(|f| f.blocks.iter().copied())
        .collect()
}

#[test]
fn f_and_shift_f_move_between_leaked_blocks() {
    let mut app = tour_at_the_end();
    let held = leak_blocks(&app);
    assert!(held.len() > 2, "the tour's leak holds blocks");
    keys(&mut app, "f");
    let first = app.runs[0].sel_block.expect("f selects a leaked block");
    assert!(held.contains(&first));
    assert!(app
        .notice
        .as_deref()
        .is_some_and(|n| n.starts_with("leaked block 1 of")));
    keys(&mut app, "f");
    let second = app.runs[0].sel_block.expect("still selected");
    assert_ne!(second, first, "f moves on");
    assert!(held.contains(&second));
    keys(&mut app, "F");
    assert_eq!(app.runs[0].sel_block, Some(first), "F moves back");
    // Nothing before the first: said, and the selection stays.
    keys(&mut app, "F");
    assert_eq!(app.runs[0].sel_block, Some(first));
    let notice = app.notice.clone().unwrap_or_default();
    assert!(notice.contains("the first of"), "{notice}");
}

#[test]
fn a_jump_that_finds_nothing_says_so() {
    let mut app = leaky_app();
    keys(&mut app, "g");
    screen(&mut app, 140, 44);
    keys(&mut app, "f");
    assert_eq!(app.runs[0].sel_block, None);
    let notice = app.notice.clone().unwrap_or_default();
    assert!(
        notice.contains("no leak found up to this moment"),
        "{notice}"
    );
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("no leak found up to this moment"), "drawn:\n{s}");
}

#[test]
fn a_simulated_block_names_its_scenario_step() {
    let mut app = tour_at_the_end();
    keys(&mut app, "f");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("step scenarios/tour.ron:"), "{s}");
    for invented in ["model.py", "train.py", "frames:"] {
        assert!(!s.contains(invented), "{invented} in\n{s}");
    }
    insta::assert_snapshot!("leaked_block_step_140x44", s);
}
