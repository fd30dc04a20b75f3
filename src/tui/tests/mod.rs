//! Tests of the terminal UI: every view on `TestBackend`, scripted sessions,
//! snapshot import, themes, and the real binary in tmux.

mod code;
mod gpu_live;
mod gpu_panel;
mod helpers;
mod import;
mod leak_blocks;
mod lesson;
mod lesson_teacher;
mod live;
mod pace;
mod presenter;
mod run_keys;
mod session;
mod stack;
mod sweep;
mod tabs;
mod theme;
mod views;
mod watch;
