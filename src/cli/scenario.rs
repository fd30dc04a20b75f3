//! `scenarios`, `check` and `run` of scenario files.

use std::process::ExitCode;

use vramscope::scenario::{builtins, check, load_file, resolve, run as run_scenario, RunOptions};

use super::BadInput;

pub fn list() -> anyhow::Result<ExitCode> {
    for b in builtins() {
        let description = resolve(b.name)
            .map(|(s, _)| s.description)
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        println!("{:<34} {description}", b.name);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn check_file(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    match load_file(path) {
        Ok((s, built)) => {
            println!(
                "{}: valid scenario \"{}\" ({} steps, {} iterations)",
                path.display(),
                s.name,
                s.steps.len(),
                built.program.iterations
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(BadInput(e.to_string()).into()),
    }
}

pub struct RunArgs {
    pub json: bool,
    pub iterations: Option<u32>,
}

pub fn run_headless(name: &str, args: RunArgs) -> anyhow::Result<ExitCode> {
    let (scenario, built) = resolve(name).map_err(|e| BadInput(e.to_string()))?;
    let result = run_scenario(
        &scenario,
        &built,
        &RunOptions {
            iterations: args.iterations,
            record_events: false,
        },
    );
    let checks = check(&scenario.expect, &result);
    let ok = checks.iter().all(|c| c.passed);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&vramscope::report::run::json(&result, &checks))?
        );
    } else {
        print!(
            "{}",
            vramscope::report::run::text(&scenario, &result, &checks)
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
