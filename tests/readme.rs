//! The README's commands are the tool's: every `vramscope …` line it shows
//! names a command that exists and only flags that command takes, so the
//! quick start cannot drift from the binary.

mod common;

use common::vramscope;

/// `vramscope SUB …` lines of the README (indented command lines and table
/// cells), as (subcommand, flags).
fn readme_commands() -> Vec<(String, Vec<String>)> {
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("README.md");
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        // a row of the command table: | `open SNAPSHOT…` | …
        if let Some(cell) = line.strip_prefix("| `") {
            let cell = cell.split("` |").next().unwrap_or_default();
            for part in cell.split("`, `").flat_map(|p| p.split("` / `")) {
                let words: Vec<&str> = part.split_whitespace().collect();
                let flags = words
                    .iter()
                    .filter(|w| w.starts_with("--"))
                    .map(|w| w.to_string());
                match words.first() {
                    Some(&"vramscope") | None => {}
                    // `replay SNAPSHOT --verify` / `--conf C`: more flags of the same command
                    Some(w) if w.starts_with("--") => {
                        if let Some((_, last)) = out.last_mut() {
                            last.extend(flags);
                        }
                    }
                    Some(sub) => out.push((sub.to_string(), flags.collect())),
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("vramscope ") else {
            continue;
        };
        let words: Vec<&str> = rest
            .split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .collect();
        let Some(sub) = words.first() else { continue };
        let flags = words
            .iter()
            .filter(|w| w.starts_with("--"))
            .map(|w| w.split(['=', '|']).next().unwrap_or(w).to_string())
            .collect();
        out.push((sub.to_string(), flags));
    }
    out
}

#[test]
fn every_readme_command_and_flag_exists() {
    let commands = readme_commands();
    assert!(commands.len() >= 8, "{commands:?}");
    for (sub, flags) in commands {
        let (code, help, err) = vramscope(&[&sub, "--help"]);
        assert_eq!(code, 0, "README: `vramscope {sub}` is not a command: {err}");
        for flag in flags {
            assert!(
                help.contains(&flag),
                "README: `vramscope {sub}` has no {flag}:\n{help}"
            );
        }
    }
}
