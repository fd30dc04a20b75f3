//! Lessons: an ordered set of built-in (or teacher-written) scenarios with an
//! introduction, a multiple-choice question before each scenario, the answer
//! with its explanation, and a summary. `load` parses and validates a lesson
//! file (RON) and checks every scenario it names exists; `library` holds the
//! built-in lessons; `verify` runs each part's scenario and checks the
//! lesson's stated answer against the run, so a lesson never teaches what its
//! scenario does not show.

mod claims;
mod facts;
mod figure;
mod format;
mod library;
mod load;
mod progress;
mod shuffle;
mod verify;

pub use figure::{figures_in, StatedFigure};
pub use format::{Comparison, Figure, Lesson, Part, Quantity, Says};
pub use library::{builtin_lesson, builtin_lessons, lesson_scenario, BuiltInLesson};
pub use load::{load_lesson_file, load_lesson_str, resolve_lesson, LessonError, LoadedLesson};
pub use progress::{progress_path, state_dir, Answer, Place, Progress, ProgressError};
pub use shuffle::{choice_order, default_seed, shuffled};
pub use verify::{verify, verify_framing, verify_part, PartVerdict};

/// The letters a learner answers with, in order.
pub const LETTERS: [char; 4] = ['a', 'b', 'c', 'd'];
