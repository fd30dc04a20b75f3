//! Scenario files as a user writes them: what loads, and for what does not,
//! the error with its file, line and column, or the field or step at fault
//! (RON's positions plus our checks), from the library and from `vramscope check`.
//! The helpers are here, the tests by subject in tests/scenario_files/
//! (positions and fields, the model against its data, steps).

mod common;
#[path = "scenario_files/fields.rs"]
mod fields;
#[path = "scenario_files/shapes.rs"]
mod shapes;
#[path = "scenario_files/steps.rs"]
mod steps;

use vramscope::scenario::{builtins, load_str, run, LoadError, RunOptions};

use common::{scenarios_dir, temp_dir, vramscope, VALID};

fn at(text: &str) -> (usize, usize, String) {
    match load_str(text, "bad.ron") {
        Err(LoadError::At {
            file,
            line,
            column,
            message,
        }) => {
            assert_eq!(file, "bad.ron");
            (line, column, message)
        }
        Err(other) => panic!("not a positioned error: {other:?}"),
        Ok(_) => panic!("loaded a malformed file:\n{text}"),
    }
}

/// Each of `cases` (steps added after `step` in `VALID`, the line it must be
/// refused at, and what the message must say) refused at its step's line,
/// column 9.
fn refused_after(step: &str, cases: &[(&str, usize, &str)]) {
    for (added, line, said) in cases {
        let text = VALID.replace(step, &format!("{step}{added}"));
        let (l, column, message) = at(&text);
        assert_eq!((l, column), (*line, 9), "{added}: {message}");
        assert!(message.contains(said), "{added}: {message}");
    }
}
