//! Shared test fixtures: built-in scenarios through the real producer, a
//! renderer to `TestBackend`, screen text with addresses masked, key helpers.

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::Terminal;

use crate::producers::{scenario_source, Source};
use crate::scenario::{resolve, run, RunOptions};
use crate::trace::Event;
use crate::tui::app::{App, TuiOptions};
use crate::tui::screen;

/// The guided tour: validation without no_grad keeps `val_total` graphs
/// alive until it runs out of memory (a leak, an OOM, narration).
pub const LEAKY: &str = "tour";
/// A buggy/fixed pair: validation that keeps every batch's graph in
/// `val_total` to an OOM, and the same loop done right.
pub const BUGGY: &str = "accumulate-loss-eval-bug";
pub const FIXED: &str = "accumulate-loss-eval-fixed";

/// A built-in scenario through the producer the UI runs it with, unpaced.
pub fn scenario(name: &str) -> Source {
    let (s, b) = resolve(name).expect("a built-in scenario");
    scenario_source(s, b, Duration::ZERO)
}

/// A built-in scenario's events, as the headless run records them.
pub fn recorded_events(name: &str) -> Vec<Event> {
    let (s, b) = resolve(name).expect("a built-in scenario");
    let opts = RunOptions {
        iterations: None,
        record_events: true,
    };
    run(&s, &b, &opts).events
}

pub fn opts() -> TuiOptions {
    TuiOptions {
        no_color: Some(false),
        start_paused: true,
        ..TuiOptions::default()
    }
}

pub fn app_with(sources: Vec<(String, Source)>, opts: &TuiOptions) -> App {
    let mut app = App::new(sources, opts).expect("built-in theme parses");
    app.drain_sources();
    app
}

/// [`app_with`] for sources that produce on a thread of their own (a
/// snapshot's rebuilt trace): drains until every run has finished.
pub fn app_finished(sources: Vec<(String, Source)>, opts: &TuiOptions) -> App {
    let mut app = App::new(sources, opts).expect("built-in theme parses");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app.runs.iter().any(|r| r.is_live()) {
        assert!(
            std::time::Instant::now() < deadline,
            "sources never finished"
        );
        if !app.drain_sources() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    app
}

/// [`LEAKY`] in the UI, all of its events received.
pub fn leaky_app() -> App {
    leaky_app_with(&opts())
}

pub fn leaky_app_with(opts: &TuiOptions) -> App {
    app_finished(vec![(LEAKY.into(), scenario(LEAKY))], opts)
}

pub fn terminal(w: u16, h: u16) -> Terminal<TestBackend> {
    Terminal::new(TestBackend::new(w, h)).expect("test backend")
}

/// Prepare and draw one frame; the buffer drawn.
pub fn draw(app: &mut App, term: &mut Terminal<TestBackend>) -> Buffer {
    screen::render(term, app).expect("draws");
    term.backend().buffer().clone()
}

pub fn screen(app: &mut App, w: u16, h: u16) -> String {
    let mut t = terminal(w, h);
    text(&draw(app, &mut t))
}

/// The buffer as lines of text, with hex addresses masked (they depend on
/// the simulated device's layout, not on what is being tested).
pub fn text(buf: &Buffer) -> String {
    mask_hex(&raw_text(buf))
}

/// The buffer as lines of text, addresses as drawn.
pub fn raw_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in 0..area.height {
        for x in 0..area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

pub fn mask_hex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'0'
            && b.get(i + 1) == Some(&b'x')
            && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
        {
            out.push_str("0xADDR");
            i += 2;
            while b.get(i).is_some_and(u8::is_ascii_hexdigit) {
                i += 1;
            }
        } else {
            let ch = s[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

pub fn key(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
}

pub fn code(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}

pub fn keys(app: &mut App, s: &str) {
    for c in s.chars() {
        app.handle_key(key(c));
    }
}
