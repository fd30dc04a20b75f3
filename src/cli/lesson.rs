//! `lessons` and `lesson NAME|FILE`: the lesson screens in the terminal UI,
//! each part's scenario in the run view; without a terminal, the lesson as
//! text with each part's run and its checked figures.

use std::process::ExitCode;

use vramscope::lesson::{builtin_lessons, resolve_lesson, verify, LoadedLesson};
use vramscope::producers::{scenario_source, ITERATION_PACE};
use vramscope::tui::lesson::LessonState;
use vramscope::tui::theme::{no_color_from_env, Theme, ThemeName};
use vramscope::tui::{run_on_terminal, run_tui, TuiOptions};
use vramscope::units::escape_line;

use super::pace::PaceArgs;
use super::BadInput;

/// Scenario playback speed in the run view, as `run` has it.
const SCENARIO_SPEED: f64 = 2000.0;

pub fn list() -> anyhow::Result<ExitCode> {
    for b in builtin_lessons() {
        let line = resolve_lesson(b.name)
            .map(|l| {
                let minutes = l
                    .lesson
                    .minutes
                    .map(|m| format!(" (~{m} min, {} questions)", l.lesson.parts.len()))
                    .unwrap_or_default();
                format!("{}{minutes}", l.lesson.description)
            })
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        sayln!("{:<20} {line}", b.name);
    }
    Ok(ExitCode::SUCCESS)
}

fn load(name: &str) -> anyhow::Result<LoadedLesson> {
    resolve_lesson(name).map_err(|e| BadInput(e.to_string()).into())
}

/// The lesson as text or JSON; exit 1 when a part's run does not show its answer.
pub fn headless(name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let loaded = load(name)?;
    let verdicts = verify(&loaded).map_err(|e| BadInput(e.to_string()))?;
    if json {
        sayjson!(&vramscope::report::lesson::json(&loaded.lesson, &verdicts));
    } else {
        say!(
            "{}",
            vramscope::report::lesson::text(&loaded.lesson, &verdicts)
        );
    }
    Ok(if verdicts.iter().all(|v| v.holds()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The lesson screens; Enter on an answered part opens its scenario in the
/// run view, and quitting that comes back to the lesson's next screen.
pub fn open(name: &str, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let loaded = load(name)?;
    let theme = Theme::builtin(ThemeName::from(pace.theme), no_color_from_env())?;
    let mut state = LessonState::new(loaded.lesson.clone(), theme);
    loop {
        run_on_terminal(&mut state)?;
        let Some(i) = state.open.take() else {
            return Ok(ExitCode::SUCCESS);
        };
        let part = &loaded.lesson.parts[i];
        let (scenario, built) = loaded
            .scenario(&part.scenario)
            .map_err(|e| BadInput(e.to_string()))?;
        let title = escape_line(&scenario.name).into_owned();
        let mut opts = pace.apply(
            TuiOptions {
                speed: SCENARIO_SPEED,
                ..TuiOptions::default()
            },
            &[title.as_str()],
        );
        // A lesson is taught like the tour: each narration waits for space.
        opts.auto_pause = !pace.no_auto_pause;
        run_tui(
            vec![(title, scenario_source(scenario, built, ITERATION_PACE))],
            opts,
        )?;
        state.after_run();
    }
}
