//! `lessons` and `lesson NAME|FILE`: the lesson screens in the terminal UI,
//! each part's scenario in the run view; without a terminal, the lesson as
//! text with each part's run and its checked figures.

use std::process::ExitCode;

use vramscope::lesson::{
    builtin_lessons, default_seed, progress_path, resolve_lesson, shuffled, state_dir, verify,
    verify_framing, LoadedLesson,
};
use vramscope::producers::{scenario_source, ITERATION_PACE};
use vramscope::tui::lesson::{LessonState, Store};
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

/// The lesson with its choices in the order `seed` (or the lesson's own
/// seed) shows them, and the seed.
fn load(name: &str, seed: Option<u64>) -> anyhow::Result<(LoadedLesson, u64)> {
    let mut loaded = resolve_lesson(name).map_err(|e| BadInput(e.to_string()))?;
    let seed = seed.unwrap_or_else(|| default_seed(&loaded.lesson.name));
    loaded.lesson = shuffled(&loaded.lesson, seed);
    Ok((loaded, seed))
}

/// The lesson as text or JSON; exit 1 when a part's run does not show its answer.
pub fn headless(name: &str, seed: Option<u64>, json: bool) -> anyhow::Result<ExitCode> {
    let (loaded, seed) = load(name, seed)?;
    let verdicts = verify(&loaded).map_err(|e| BadInput(e.to_string()))?;
    let framing = verify_framing(&loaded, &verdicts);
    if json {
        sayjson!(&vramscope::report::lesson::json(
            &loaded.lesson,
            seed,
            &verdicts,
            &framing
        ));
    } else {
        say!(
            "{}",
            vramscope::report::lesson::text(&loaded.lesson, seed, &verdicts, &framing)
        );
    }
    Ok(
        if verdicts.iter().all(|v| v.holds()) && framing.iter().all(|c| c.passed) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// The questions without answers (`answers` false) or the answer key, as
/// Markdown: nothing runs.
pub fn handout(name: &str, seed: Option<u64>, answers: bool) -> anyhow::Result<ExitCode> {
    let (loaded, seed) = load(name, seed)?;
    let md = if answers {
        vramscope::report::handout::answer_key(&loaded.lesson, seed)
    } else {
        vramscope::report::handout::questions(&loaded.lesson, seed)
    };
    say!("{md}");
    Ok(ExitCode::SUCCESS)
}

/// The lesson screens; Enter on an answered part opens its scenario in the
/// run view, and quitting that comes back to the part just watched. The
/// place is kept under the user's state directory as the lesson goes, and
/// offered again next time; `--poll` opens in poll mode.
pub fn open(
    name: &str,
    seed: Option<u64>,
    poll: bool,
    pace: &PaceArgs,
) -> anyhow::Result<ExitCode> {
    let (loaded, seed) = load(name, seed)?;
    let theme = Theme::builtin(ThemeName::from(pace.theme), no_color_from_env())?;
    // Each part's run, checked before the room sees it: a lesson whose
    // runs do not show what it states says so on its first screen.
    warn!(
        "checking the runs of {}'s {} parts…",
        loaded.lesson.name,
        loaded.lesson.parts.len()
    );
    let verdicts = verify(&loaded).map_err(|e| BadInput(e.to_string()))?;
    let framing = verify_framing(&loaded, &verdicts);
    let mut state = LessonState::new(loaded.lesson.clone(), theme).with_checks(&verdicts, &framing);
    drop(verdicts);
    match state_dir() {
        Some(dir) => {
            let path = progress_path(&dir, &loaded.lesson.name);
            state = state.with_store(Store { path, seed });
        }
        None => {
            state.notice =
                Some("no HOME or XDG_STATE_HOME: the place is not saved for next time".into())
        }
    }
    state.poll = poll;
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
        opts.context = Some(format!("lesson · part {}", i + 1));
        let started = std::time::Instant::now();
        run_tui(
            vec![(title, scenario_source(scenario, built, ITERATION_PACE))],
            opts,
        )?;
        state.add_time(started.elapsed());
        state.after_run();
    }
}
