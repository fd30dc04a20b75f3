//! The code pane and the presenter layout: the tour's program as code, the
//! statement at the cursor lit as the cursor moves by phase (the `p` key and
//! `--play-by phase`), and the presenter's screens.

use std::time::Duration;

use super::helpers::*;
use crate::tui::app::{App, TuiOptions};
use crate::tui::layout::LayoutMode;
use crate::tui::PlayUnit;

/// The line the code pane marks `▶` on screen, without the mark (the
/// pane's left border comes right before it).
fn lit_line(s: &str) -> Option<String> {
    s.lines().find_map(|l| {
        let (_, rest) = l.split_once("│▶")?;
        let code: String = rest.chars().take_while(|c| *c != '│').collect();
        Some(code.trim().to_string())
    })
}

fn phase(app: &App) -> Option<&'static str> {
    app.runs[0].frame.phase
}

/// `p` until the cursor is in the backward phase.
fn to_backward(app: &mut App, w: u16, h: u16) -> String {
    for _ in 0..12 {
        keys(app, "p");
        let s = screen(app, w, h);
        if phase(app) == Some("backward") {
            return s;
        }
    }
    panic!("no backward phase within 12 phases");
}

#[test]
fn the_code_pane_shows_the_tour_as_code_beside_the_map() {
    let mut app = leaky_app();
    let s = to_backward(&mut app, 200, 60);
    assert!(s.contains("for it in range(40):"), "{s}");
    assert!(s.contains("code · scenarios/tour.ron:21:9"), "{s}");
    assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"), "{s}");
    insta::assert_snapshot!("code_pane_tour_200x60", s);
}

#[test]
fn stepping_by_phase_lights_each_phase_s_statement_forwards_and_back() {
    let mut app = leaky_app();
    let s = to_backward(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"));
    keys(&mut app, "p");
    let s = screen(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("optimizer.step()"), "{s}");
    keys(&mut app, "P");
    let s = screen(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"), "back");
    // The loss is computed in a forward phase of its own.
    keys(&mut app, "P");
    let s = screen(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("loss = criterion(out, y)"));
    keys(&mut app, "P");
    let s = screen(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("out = model(x)"), "{s}");
}

#[test]
fn playing_by_phase_reaches_loss_backward() {
    let mut app = leaky_app_with(&TuiOptions {
        start_paused: false,
        play_by: PlayUnit::Phase,
        unit_rate: 1.0,
        ..opts()
    });
    for _ in 0..12 {
        app.on_tick(Duration::from_secs(1));
        let s = screen(&mut app, 200, 60);
        if phase(&app) == Some("backward") {
            assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"), "{s}");
            return;
        }
    }
    panic!("playing by phase never reached the backward");
}

#[test]
fn the_code_pane_is_on_where_wide_and_toggles() {
    let mut app = leaky_app();
    assert!(!screen(&mut app, 140, 44).contains("┌ code"), "too narrow");
    assert!(screen(&mut app, 200, 60).contains("┌ code"));
    keys(&mut app, "C");
    assert!(!screen(&mut app, 200, 60).contains("┌ code"), "C hides it");
    keys(&mut app, "C");
    assert!(screen(&mut app, 140, 44).contains("┌ code"), "C shows it");
}

fn presenter_app() -> App {
    leaky_app_with(&TuiOptions {
        layout: LayoutMode::Presenter,
        ..opts()
    })
}

#[test]
fn the_presenter_layout_at_200x60() {
    let mut app = presenter_app();
    let s = to_backward(&mut app, 200, 60);
    assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"), "{s}");
    for gone in ["Stats ·", "Events ·"] {
        assert!(!s.contains(gone), "{gone} shown\n{s}");
    }
    for shown in ["┌ code", "Memory map", "narration", "Leaks", "Timeline"] {
        assert!(s.contains(shown), "{shown} missing\n{s}");
    }
    insta::assert_snapshot!("presenter_200x60", s);
}

#[test]
fn the_presenter_layout_at_80x24() {
    let mut app = presenter_app();
    let s = to_backward(&mut app, 80, 24);
    assert_eq!(lit_line(&s).as_deref(), Some("loss.backward()"), "{s}");
    // A narrow map shortens its title to keep the count of what it hides.
    assert!(s.contains("Map · tour") && s.contains("↓ 8 more"), "{s}");
    assert!(s.contains("narration"), "{s}");
    insta::assert_snapshot!("presenter_80x24", s);
}

#[test]
fn l_switches_to_the_presenter_layout_and_back() {
    let mut app = leaky_app();
    assert!(screen(&mut app, 200, 60).contains("Stats ·"));
    keys(&mut app, "L");
    assert!(!screen(&mut app, 200, 60).contains("Stats ·"));
    keys(&mut app, "L");
    assert!(screen(&mut app, 200, 60).contains("Stats ·"));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_recorded_trace_has_no_code_pane() {
    let p = crate::real_snapshots::real("adam-step_closed-trace_annotations.pickle");
    let src = crate::producers::snapshot::snapshot_source(&p, None);
    let mut app = app_finished(
        vec![("adam".into(), src)],
        &TuiOptions {
            layout: LayoutMode::Presenter,
            ..opts()
        },
    );
    assert!(!screen(&mut app, 200, 60).contains("┌ code"));
    keys(&mut app, "C");
    let notice = app.notice.clone().unwrap_or_default();
    assert!(notice.contains("no program"), "{notice}");
}
