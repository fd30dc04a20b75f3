//! Keys to actions. One table ([`KEYS`]) is the binding list the help
//! overlay shows; a test reads its key column against [`key_action`] both
//! ways (every bound key listed, every listed key bound), so the two cannot
//! drift apart.
//!
//! Scheme: lowercase moves forward, the same letter in uppercase moves back
//! (`o`/`O` op, `p`/`P` phase, `i`/`I` iteration, `n`/`N` narration,
//! `x`/`X` OOM or error, `f`/`F` leak); `l`/`h` and →/← step one event.
//! A popup (a stack, an event's details, a message) takes the keys while it
//! is open ([`popup_action`]).

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::layout::Focus;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Fwd,
    Back,
}

/// What one jump of the cursor goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jump {
    Event,
    Op,
    Phase,
    Iteration,
    Narration,
    /// An OOM entry or an error marker.
    Oom,
    /// A block a leak holds, selected on the map.
    Leak,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UiAction {
    Quit,
    ToggleHelp,
    /// Close the help overlay, or clear the selection.
    Escape,
    TogglePlay,
    Jump(Jump, Dir),
    Start,
    End,
    Faster,
    Slower,
    ToggleColor,
    CycleTheme,
    FocusNext,
    FocusPrev,
    Restart,
    ToggleGpu,
    ToggleSync,
    SwitchRun,
    Up,
    Down,
    PageUp,
    PageDown,
    Enter,
    ZoomIn,
    ZoomOut,
    PanLeft,
    PanRight,
    /// A snapshot's next / previous device.
    NextDevice,
    PrevDevice,
    /// The selected block's allocation stack, in a popup.
    ShowStack,
    /// The "by Python line" pane of the active run.
    ToggleByLine,
    /// That pane: what grew since the last step, or everything live.
    ToggleSinceStep,
    /// The error / OOM message or narration at the cursor, in full.
    ShowMessage,
    /// Every narration up to the cursor, in a popup.
    ShowNarrationHistory,
    /// A live job: ask its helper which Python names hold its tensors.
    FindHolders,
    /// Play by event, op, phase, iteration (the next one).
    CyclePlayUnit,
    /// Stop at each narration until space, or not.
    ToggleAutoPause,
    /// The code pane: the scenario's program, the statement at the cursor lit.
    ToggleCode,
    /// The presenter layout, or the normal one.
    ToggleLayout,
    /// The map to the segment of the latest allocator event at the cursor
    /// (the one a narration there is about).
    ShowEventSegment,
}

/// What a key does while a popup is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopupAction {
    Close,
    Quit,
    /// Scroll by lines (positive: down).
    Scroll(isize),
    /// Scroll by pages.
    Page(isize),
    Top,
    Bottom,
    /// Fold or unfold the C++/PyTorch frames of the stack shown.
    ToggleFold,
}

/// Every binding, as the help overlay lists it.
pub const KEYS: &[(&str, &str)] = &[
    (
        "space",
        "play / pause (the cursor advances at the pace the status line shows)",
    ),
    (
        "m",
        "play by event / op / phase / iteration (the status line shows which)",
    ),
    (
        "a",
        "auto-pause at each narration on / off (space goes on from one)",
    ),
    (
        ":",
        "open another scenario (name or .ron) or snapshot in this panel",
    ),
    (
        "+ = ]  /  - [",
        "faster / slower, x2 (events per second, or ops, phases, iterations)",
    ),
    ("l →  /  h ←", "step one event forward / back"),
    ("o / O", "next / previous op"),
    ("p / P", "next / previous phase"),
    ("i / I", "next / previous iteration"),
    ("n / N", "next / previous narration"),
    (
        "x / X",
        "next / previous OOM or error (a snapshot's other devices too)",
    ),
    ("d / D", "snapshot: next / previous device"),
    ("f / F", "next / previous block a leak holds, on the map"),
    (
        "g Home / G End",
        "jump to start / end (end follows live events)",
    ),
    (
        "j ↓ / k ↑",
        "select next / previous (block, finding, log line)",
    ),
    (
        "PgDn / PgUp",
        "next / previous segment (map), page (log), scroll (leaks)",
    ),
    (
        "Enter",
        "map: block's allocation event · leaks: highlight · log: event details",
    ),
    (
        "b",
        "the selected block's allocation stack, your first line highlighted",
    ),
    (
        "u",
        "live bytes by Python line at the cursor; j/k pick one, ▚ on the map",
    ),
    (
        "S",
        "that pane: only what was born since the last step and is still live",
    ),
    (
        "e",
        "the error / OOM message or narration at the cursor, in full",
    ),
    ("E", "every narration so far, newest last (j/k scroll)"),
    (
        "H",
        "live job: which names hold its tensors (at its next step)",
    ),
    (
        "in a popup",
        "j/k PgDn g/G scroll · Enter folds/unfolds C++/PyTorch frames · Esc closes",
    ),
    ("z / Z", "zoom in / out (map or timeline, by focus)"),
    ("> / <  (shift →/←)", "pan right / left"),
    ("Tab / shift-Tab", "next / previous panel"),
    (
        "C",
        "code pane: the scenario as PyTorch code, ▶ the statement at the cursor",
    ),
    (
        "L",
        "presenter layout (code, map, large narration, timeline) / normal",
    ),
    (
        "M",
        "map: to the segment of the event at the cursor (what its narration is about)",
    ),
    (
        "c / t",
        "colour blocks by state / category · next theme (dark, light, high contrast)",
    ),
    (
        "v",
        "GPU memory: NVML's reading vs the model (simulated terms for sim runs)",
    ),
    (
        "w / W  1–9",
        "compare: switch run · tabs (open a b …): next / previous tab, tab N",
    ),
    (
        "T / A / B",
        "tabs: table across files / alive here, not in baseline / baseline := this",
    ),
    (
        "s",
        "compare: sync by iteration (default) / by event fraction",
    ),
    (
        "r",
        "restart the run (replay from start if it cannot rerun)",
    ),
    (
        "Esc",
        "close help, the GPU panel or the by-line pane / clear selection",
    ),
    ("?", "this help"),
    ("q  ctrl-c", "quit"),
    (
        "mouse",
        "click: select block / seek; drag: scrub / pan; wheel: scroll / zoom",
    ),
];

/// The key that opens the `:` prompt (the app takes it before [`key_action`]).
pub const PROMPT_KEY: KeyCode = KeyCode::Char(':');

/// Keys across the tabs of several files (the app takes them before
/// [`key_action`]): the table, the diff, the baseline, the previous tab, a
/// tab by number (`w`, the next tab, is also the run view's switch).
pub fn is_tab_key(code: KeyCode) -> bool {
    matches!(code, KeyCode::Char('T' | 'A' | 'B' | 'W' | '1'..='9'))
}

/// The action for `key`, given the focused panel and whether help is open.
pub fn key_action(key: KeyEvent, focus: Focus, help: bool) -> Option<UiAction> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let shift = key.modifiers.contains(KeyModifiers::SHIFT);
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return matches!(key.code, KeyCode::Char('c')).then_some(UiAction::Quit);
    }
    if help {
        // The overlay swallows keys except those that close or scroll it
        // (q closes it, as it closes every other box; Ctrl-C still quits).
        return match key.code {
            KeyCode::Char('?' | 'q') | KeyCode::Esc => Some(UiAction::ToggleHelp),
            KeyCode::Char('j') | KeyCode::Down => Some(UiAction::Down),
            KeyCode::Char('k') | KeyCode::Up => Some(UiAction::Up),
            KeyCode::PageDown | KeyCode::Char(' ') => Some(UiAction::PageDown),
            KeyCode::PageUp => Some(UiAction::PageUp),
            KeyCode::Char('g') | KeyCode::Home => Some(UiAction::Start),
            KeyCode::Char('G') | KeyCode::End => Some(UiAction::End),
            _ => None,
        };
    }
    let fwd = |s| Some(UiAction::Jump(s, Dir::Fwd));
    let back = |s| Some(UiAction::Jump(s, Dir::Back));
    match key.code {
        KeyCode::Char('q') => Some(UiAction::Quit),
        KeyCode::Char('?') => Some(UiAction::ToggleHelp),
        KeyCode::Esc => Some(UiAction::Escape),
        KeyCode::Char(' ') => Some(UiAction::TogglePlay),
        KeyCode::Char('+' | '=' | ']') => Some(UiAction::Faster),
        KeyCode::Char('-' | '[') => Some(UiAction::Slower),
        KeyCode::Right if shift => Some(UiAction::PanRight),
        KeyCode::Left if shift => Some(UiAction::PanLeft),
        KeyCode::Char('l') | KeyCode::Right => fwd(Jump::Event),
        KeyCode::Char('h') | KeyCode::Left => back(Jump::Event),
        KeyCode::Char('o') => fwd(Jump::Op),
        KeyCode::Char('O') => back(Jump::Op),
        KeyCode::Char('p') => fwd(Jump::Phase),
        KeyCode::Char('P') => back(Jump::Phase),
        KeyCode::Char('i') => fwd(Jump::Iteration),
        KeyCode::Char('I') => back(Jump::Iteration),
        KeyCode::Char('n') => fwd(Jump::Narration),
        KeyCode::Char('N') => back(Jump::Narration),
        KeyCode::Char('x') => fwd(Jump::Oom),
        KeyCode::Char('X') => back(Jump::Oom),
        KeyCode::Char('f') => fwd(Jump::Leak),
        KeyCode::Char('F') => back(Jump::Leak),
        KeyCode::Char('g') | KeyCode::Home => Some(UiAction::Start),
        KeyCode::Char('G') | KeyCode::End => Some(UiAction::End),
        KeyCode::Char('j') | KeyCode::Down => Some(UiAction::Down),
        KeyCode::Char('k') | KeyCode::Up => Some(UiAction::Up),
        KeyCode::PageDown => Some(UiAction::PageDown),
        KeyCode::PageUp => Some(UiAction::PageUp),
        KeyCode::Enter => Some(UiAction::Enter),
        KeyCode::Char('z') => Some(UiAction::ZoomIn),
        KeyCode::Char('Z') => Some(UiAction::ZoomOut),
        KeyCode::Char('>') => Some(UiAction::PanRight),
        KeyCode::Char('<') => Some(UiAction::PanLeft),
        KeyCode::Tab => Some(UiAction::FocusNext),
        KeyCode::BackTab => Some(UiAction::FocusPrev),
        KeyCode::Char('c') => Some(UiAction::ToggleColor),
        KeyCode::Char('t') => Some(UiAction::CycleTheme),
        KeyCode::Char('w') => Some(UiAction::SwitchRun),
        KeyCode::Char('s') => Some(UiAction::ToggleSync),
        KeyCode::Char('r') => Some(UiAction::Restart),
        KeyCode::Char('v') => Some(UiAction::ToggleGpu),
        KeyCode::Char('d') => Some(UiAction::NextDevice),
        KeyCode::Char('D') => Some(UiAction::PrevDevice),
        KeyCode::Char('b') => Some(UiAction::ShowStack),
        KeyCode::Char('u') => Some(UiAction::ToggleByLine),
        KeyCode::Char('S') => Some(UiAction::ToggleSinceStep),
        KeyCode::Char('e') => Some(UiAction::ShowMessage),
        KeyCode::Char('E') => Some(UiAction::ShowNarrationHistory),
        KeyCode::Char('H') => Some(UiAction::FindHolders),
        KeyCode::Char('m') => Some(UiAction::CyclePlayUnit),
        KeyCode::Char('a') => Some(UiAction::ToggleAutoPause),
        KeyCode::Char('C') => Some(UiAction::ToggleCode),
        KeyCode::Char('L') => Some(UiAction::ToggleLayout),
        KeyCode::Char('M') => Some(UiAction::ShowEventSegment),
        _ => {
            let _ = focus;
            None
        }
    }
}

/// The action for `key` while a popup is open: it takes every key.
pub fn popup_action(key: KeyEvent) -> Option<PopupAction> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return matches!(key.code, KeyCode::Char('c')).then_some(PopupAction::Quit);
    }
    match key.code {
        KeyCode::Esc | KeyCode::Char('b' | 'e' | 'E') => Some(PopupAction::Close),
        KeyCode::Char('q') => Some(PopupAction::Quit),
        KeyCode::Char('j') | KeyCode::Down => Some(PopupAction::Scroll(1)),
        KeyCode::Char('k') | KeyCode::Up => Some(PopupAction::Scroll(-1)),
        KeyCode::PageDown | KeyCode::Char(' ') => Some(PopupAction::Page(1)),
        KeyCode::PageUp => Some(PopupAction::Page(-1)),
        KeyCode::Char('g') | KeyCode::Home => Some(PopupAction::Top),
        KeyCode::Char('G') | KeyCode::End => Some(PopupAction::Bottom),
        KeyCode::Enter => Some(PopupAction::ToggleFold),
        _ => None,
    }
}

/// Short hints for the bottom bar, by focus.
pub fn hints(focus: Focus) -> &'static str {
    match focus {
        Focus::Map => {
            "j/k block  b stack  u by line  Enter alloc event  PgDn/PgUp segment  z/Z zoom  c colour"
        }
        Focus::Timeline => "click/drag seek  z/Z zoom  </> pan  o/p/i step  x OOM  n narration",
        Focus::Leaks => "j/k finding  PgDn/PgUp scroll  Enter highlight  f/F leaked block",
        Focus::Stats => "Tab next panel",
        Focus::Log => "j/k line  Enter event details  PgDn/PgUp page",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys one entry of [`KEYS`]'s key column names.
    fn named(column: &str) -> Vec<KeyCode> {
        column
            .split(|c: char| c.is_whitespace() || c == '/')
            .map(|t| t.trim_matches(|c| c == '(' || c == ')'))
            .filter(|t| !t.is_empty() && !matches!(*t, "shift" | "ctrl-c"))
            .flat_map(|t| match t {
                "1–9" => ('1'..='9').map(KeyCode::Char).collect(),
                t => vec![key(t, column)],
            })
            .collect()
    }

    fn key(t: &str, column: &str) -> KeyCode {
        match t {
            "space" => KeyCode::Char(' '),
            "Home" => KeyCode::Home,
            "End" => KeyCode::End,
            "PgDn" => KeyCode::PageDown,
            "PgUp" => KeyCode::PageUp,
            "Enter" => KeyCode::Enter,
            "Tab" => KeyCode::Tab,
            "shift-Tab" => KeyCode::BackTab,
            "Esc" => KeyCode::Esc,
            "→" => KeyCode::Right,
            "←" => KeyCode::Left,
            "↓" => KeyCode::Down,
            "↑" => KeyCode::Up,
            t if t.chars().count() == 1 => KeyCode::Char(t.chars().next().unwrap_or(' ')),
            t => panic!("KEYS names a key this test cannot read: {t:?} (in {column:?})"),
        }
    }

    fn documented() -> Vec<KeyCode> {
        KEYS.iter()
            .filter(|(k, _)| !matches!(*k, "mouse" | "in a popup"))
            .flat_map(|(k, _)| named(k))
            .collect()
    }

    fn every_key() -> Vec<KeyCode> {
        let mut keys: Vec<KeyCode> = (' '..='~').map(KeyCode::Char).collect();
        keys.extend([
            KeyCode::Home,
            KeyCode::End,
            KeyCode::PageDown,
            KeyCode::PageUp,
            KeyCode::Enter,
            KeyCode::Tab,
            KeyCode::BackTab,
            KeyCode::Esc,
            KeyCode::Left,
            KeyCode::Right,
            KeyCode::Up,
            KeyCode::Down,
        ]);
        keys
    }

    /// Bound by the run view, or taken by the app before it (tabs, prompt).
    fn bound(code: KeyCode) -> bool {
        is_tab_key(code)
            || code == PROMPT_KEY
            || [
                Focus::Map,
                Focus::Timeline,
                Focus::Leaks,
                Focus::Stats,
                Focus::Log,
            ]
            .iter()
            .any(|&f| key_action(KeyEvent::new(code, KeyModifiers::NONE), f, false).is_some())
    }

    #[test]
    fn every_bound_key_is_in_the_help() {
        let documented = documented();
        let missing: Vec<KeyCode> = every_key()
            .into_iter()
            .filter(|&k| bound(k) && !documented.contains(&k))
            .collect();
        assert!(missing.is_empty(), "bound but not in KEYS: {missing:?}");
    }

    #[test]
    fn every_key_in_the_help_is_bound() {
        let unbound: Vec<KeyCode> = documented().into_iter().filter(|&k| !bound(k)).collect();
        assert!(
            unbound.is_empty(),
            "in KEYS but bound to nothing: {unbound:?}"
        );
    }
}
