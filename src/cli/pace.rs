//! The flags that set the UI's pace for a room: start paused, the speed,
//! what one step of playback covers, whether it stops at narration, and the
//! presenter layout for a projector.

use clap::{Args, ValueEnum};
use vramscope::tui::layout::LayoutMode;
use vramscope::tui::theme::ThemeName;
use vramscope::tui::{PlayUnit, TuiOptions};

/// The scenario whose narration is a lesson: auto-pause is on for it unless
/// `--no-auto-pause` says otherwise.
const TOUR: &str = "tour";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum PlayBy {
    #[default]
    Event,
    Op,
    Phase,
    Iteration,
}

impl From<PlayBy> for PlayUnit {
    fn from(p: PlayBy) -> PlayUnit {
        match p {
            PlayBy::Event => PlayUnit::Event,
            PlayBy::Op => PlayUnit::Op,
            PlayBy::Phase => PlayUnit::Phase,
            PlayBy::Iteration => PlayUnit::Iteration,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LayoutArg {
    #[default]
    Normal,
    Presenter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ThemeArg {
    #[default]
    Dark,
    Light,
    HighContrast,
}

impl From<ThemeArg> for ThemeName {
    fn from(t: ThemeArg) -> ThemeName {
        match t {
            ThemeArg::Dark => ThemeName::Dark,
            ThemeArg::Light => ThemeName::Light,
            ThemeArg::HighContrast => ThemeName::HighContrast,
        }
    }
}

impl From<LayoutArg> for LayoutMode {
    fn from(l: LayoutArg) -> LayoutMode {
        match l {
            LayoutArg::Normal => LayoutMode::Normal,
            LayoutArg::Presenter => LayoutMode::Presenter,
        }
    }
}

#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Pace (terminal UI)")]
pub struct PaceArgs {
    /// Open paused: nothing moves until space.
    #[arg(long)]
    pub paused: bool,
    /// Playback speed: events per second (1 to 1,000,000), or with --play-by
    /// op|phase|iteration, steps per second (0.125 to 64). `+` / `-` double
    /// or halve it.
    #[arg(long, value_name = "N", value_parser = parse_speed)]
    pub speed: Option<f64>,
    /// What one step of playback covers; `m` cycles it in the UI.
    #[arg(long, value_enum, value_name = "UNIT", default_value_t = PlayBy::Event)]
    pub play_by: PlayBy,
    /// Stop at every narration until space (the default for the tour); `a`
    /// toggles it in the UI.
    #[arg(long, overrides_with = "no_auto_pause")]
    pub auto_pause: bool,
    /// Play through narration without stopping (the default but for the tour).
    #[arg(long, overrides_with = "auto_pause")]
    pub no_auto_pause: bool,
    /// `presenter`: for a projector, the code, the map, a large narration and
    /// leak box and the timeline (no stats or event log); `L` toggles it.
    #[arg(long, value_enum, value_name = "LAYOUT", default_value_t = LayoutArg::Normal)]
    pub layout: LayoutArg,
    /// Colours: `light` for a light terminal or a bright projector (it sets
    /// its own background), `high-contrast`; `t` cycles them in the UI.
    /// NO_COLOR turns colour off whatever the theme.
    #[arg(long, value_enum, value_name = "THEME", default_value_t = ThemeArg::Dark)]
    pub theme: ThemeArg,
}

fn parse_speed(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

impl PaceArgs {
    /// `opts` with this pace; `titles` are the runs opened (auto-pause is
    /// on by default for the tour alone).
    pub fn apply(&self, mut opts: TuiOptions, titles: &[&str]) -> TuiOptions {
        let unit = PlayUnit::from(self.play_by);
        opts.start_paused = self.paused;
        opts.play_by = unit;
        opts.layout = LayoutMode::from(self.layout);
        opts.theme = ThemeName::from(self.theme);
        match (self.speed, unit) {
            (Some(s), PlayUnit::Event) => opts.speed = s,
            (Some(s), _) => opts.unit_rate = s,
            (None, _) => {}
        }
        opts.auto_pause = if self.auto_pause {
            true
        } else if self.no_auto_pause {
            false
        } else {
            titles == [TOUR]
        };
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        pace: PaceArgs,
    }

    fn opts(args: &[&str], titles: &[&str]) -> Result<TuiOptions, clap::Error> {
        let cmd = Cmd::try_parse_from(std::iter::once("x").chain(args.iter().copied()))?;
        Ok(cmd.pace.apply(TuiOptions::default(), titles))
    }

    #[test]
    fn flags_set_the_pace() {
        let o = opts(
            &["--paused", "--play-by", "phase", "--speed", "0.5"],
            &["x"],
        )
        .expect("ok");
        assert!(o.start_paused);
        assert_eq!(o.play_by, PlayUnit::Phase);
        assert_eq!(o.unit_rate, 0.5);
        assert_eq!(o.speed, TuiOptions::default().speed);
        let o = opts(&["--speed", "40"], &["x"]).expect("ok");
        assert_eq!((o.speed, o.play_by), (40.0, PlayUnit::Event));
        for bad in ["0", "-3", "nan", "inf", "fast"] {
            assert!(opts(&["--speed", bad], &["x"]).is_err(), "{bad}");
        }
        assert!(opts(&["--play-by", "epoch"], &["x"]).is_err());
    }

    #[test]
    fn theme_is_dark_unless_another_is_asked_for() {
        assert_eq!(opts(&[], &["x"]).expect("ok").theme, ThemeName::Dark);
        let o = opts(&["--theme", "light"], &["x"]).expect("ok");
        assert_eq!(o.theme, ThemeName::Light);
        let o = opts(&["--theme", "high-contrast"], &["x"]).expect("ok");
        assert_eq!(o.theme, ThemeName::HighContrast);
        assert!(opts(&["--theme", "solarized"], &["x"]).is_err());
    }

    #[test]
    fn layout_is_normal_unless_presenter_is_asked_for() {
        let o = opts(&["--layout", "presenter"], &["x"]).expect("ok");
        assert_eq!(o.layout, LayoutMode::Presenter);
        assert_eq!(opts(&[], &["x"]).expect("ok").layout, LayoutMode::Normal);
        assert!(opts(&["--layout", "huge"], &["x"]).is_err());
    }

    #[test]
    fn auto_pause_is_on_for_the_tour_alone_unless_told() {
        assert!(opts(&[], &["tour"]).expect("ok").auto_pause);
        assert!(!opts(&[], &["store-outputs-bug"]).expect("ok").auto_pause);
        assert!(!opts(&[], &["tour", "tour"]).expect("ok").auto_pause);
        assert!(
            !opts(&["--no-auto-pause"], &["tour"])
                .expect("ok")
                .auto_pause
        );
        assert!(opts(&["--auto-pause"], &["x"]).expect("ok").auto_pause);
        let last_wins = opts(&["--auto-pause", "--no-auto-pause"], &["x"]).expect("ok");
        assert!(!last_wins.auto_pause);
    }
}
