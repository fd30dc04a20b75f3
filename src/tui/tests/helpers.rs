//! Shared test fixtures: demo runs as finished sources, a renderer to
//! `TestBackend`, screen text with addresses masked, key helpers.

use std::sync::Arc;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::Terminal;

use crate::tui::app::{App, TuiOptions};
use crate::tui::demo::{self, DemoConfig, DemoTags};
use crate::tui::run;
use crate::tui::source::Source;

/// A small leaky demo run: OOMs after a dozen iterations on a 512 MiB device.
pub fn small_leaky() -> DemoConfig {
    DemoConfig {
        iterations: 40,
        layers: 4,
        weight_bytes: 8 << 20,
        activation_bytes: 4 << 20,
        leak_bytes: 24 << 20,
        device_total: 512 << 20,
        device_overhead: 64 << 20,
        batch_sleep: std::time::Duration::ZERO,
    }
}

pub fn small_fixed() -> DemoConfig {
    DemoConfig {
        leak_bytes: 0,
        iterations: 12,
        ..small_leaky()
    }
}

/// A demo run delivered at once, as a finished source.
pub fn demo_source(cfg: DemoConfig) -> Source {
    let cap = cfg.device_total;
    let (events, findings) = demo::generate(cfg);
    Source::from_events(events, findings)
        .with_capacity(cap)
        .with_tags(Arc::new(DemoTags))
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

pub fn leaky_app() -> App {
    app_with(vec![("leaky".into(), demo_source(small_leaky()))], &opts())
}

pub fn terminal(w: u16, h: u16) -> Terminal<TestBackend> {
    Terminal::new(TestBackend::new(w, h)).expect("test backend")
}

/// Prepare and draw one frame; the buffer drawn.
pub fn draw(app: &mut App, term: &mut Terminal<TestBackend>) -> Buffer {
    run::render(term, app).expect("draws");
    term.backend().buffer().clone()
}

pub fn screen(app: &mut App, w: u16, h: u16) -> String {
    let mut t = terminal(w, h);
    text(&draw(app, &mut t))
}

/// The buffer as lines of text, with hex addresses masked (they depend on
/// the simulated device's layout, not on what is being tested).
pub fn text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in 0..area.height {
        for x in 0..area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    mask_hex(&out)
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
