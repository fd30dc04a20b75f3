//! The terminal UI (DESIGN.md `tui`): app state, input, layout, the views and
//! themes. It draws what the `producers` send, as `trace`, `alloc` and `leak`
//! computed it, and computes no memory facts itself.
//!
//! - `app`: the one state (runs, cursor, playback, selection) and `prepare`,
//!   which builds the per-frame data the views draw;
//! - `run_view`: one run as the UI holds it (its source, timeline, cursor);
//! - `input`: keys → actions, and the key table the help overlay shows;
//! - `layout`, `theme`, `marks`; `views/*`: one pure render function per panel;
//! - `screen`: the one terminal loop and the `Screen` trait every
//!   full-screen view implements (the run view's `App`, a lesson, a sweep's
//!   chart, `watch`); `run`: terminal setup/restore, panic hook, `run_tui`;
//! - `code`: the code pane (`C`) and the presenter layout (`L`);
//! - `gpu_panel`: the run view's NVML/simulated reconciliation panel (`v`);
//! - `by_line`: the "by Python line" pane (`u`); `popup` and `details`: the
//!   scrollable popups (a block's stack `b`, an event's details, a message `e`);
//! - `playback`: the play unit (`m`) and where a step lands; `narration` and
//!   `callout`: what was said at the cursor, its history (`E`), and the
//!   narration and error boxes above the timeline;
//! - `lesson`, `views::lesson`: a lesson's pages;
//! - `watch`, `views::watch`: `vramscope watch`'s live view;
//! - `sweep`, `views::sweep`: `vramscope sweep`'s chart.

pub mod app;
pub mod by_line;
pub mod callout;
pub mod code;
pub mod details;
pub mod gpu_panel;
mod gpu_panel_job;
pub mod input;
pub mod layout;
pub mod lesson;
pub mod marks;
pub mod narration;
pub mod playback;
pub mod popup;
pub mod run;
pub mod run_view;
pub mod screen;
pub mod sweep;
pub mod theme;
pub mod views;
pub mod watch;

#[cfg(test)]
mod tests;

pub use app::{App, ColorMode, RunView, SyncMode, TuiOptions};
pub use playback::PlayUnit;
pub use run::run_tui;
pub use screen::{run_on_terminal, run_screen, Screen};
