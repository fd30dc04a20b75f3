//! Subcommands. Each returns the process exit status: 0 success, 1 the run's
//! own expectations (or a verify) failed, 2 bad input, 3 no GPU driver.

mod attach;
mod compare;
mod demo;
mod lesson;
mod model;
mod open_many;
mod pace;
mod scenario;
mod snapshot;
mod sweep;
mod trace;
mod ui;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pace::PaceArgs;

pub const EXIT_BAD_INPUT: u8 = 2;
pub const EXIT_NO_GPU: u8 = 3;

/// Input the user gave us is wrong: exit status 2 with the message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

#[derive(Debug, Parser)]
#[command(
    name = "vramscope",
    version,
    about = "Where GPU memory goes in a PyTorch training loop, and who leaks it",
    args_conflicts_with_subcommands = true,
    after_help = "With no command, vramscope opens the guided tour in the terminal UI (a headless report without a terminal), paused at each narration until space (--no-auto-pause plays through).\n\nScenarios follow PyTorch 2.11's rules (the default release, verified against H100 captures) unless their `torch:` field names another (2.0 to 2.15)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The guided tour's pace, with no command.
    #[command(flatten)]
    pub pace: PaceArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Walk through PyTorch's caching allocator on a 100 MiB device: splits,
    /// merges, a fragmentation OOM and what empty_cache() releases.
    Demo {
        /// PYTORCH_CUDA_ALLOC_CONF for the walkthrough, e.g. "expandable_segments:True".
        #[arg(long, default_value = "")]
        conf: String,
    },
    /// List the built-in scenarios: name, then what each shows (the model
    /// presets: `vramscope model --list`).
    Scenarios,
    /// List the built-in lessons: name, what each teaches, how long.
    Lessons,
    /// A lesson (built-in name or lesson file): an introduction, a question
    /// before each scenario answered with a key (a–d), the answer and why,
    /// the scenario in the run view, and a summary.
    #[command(
        after_help = "Without a terminal (or with --headless) the lesson prints as text: each question, its answer and explanation, and the figures of the scenario's run that the answer is checked against (exit 1 if a run does not show its answer). --handout prints the questions without answers and --answers the key, both as Markdown, in the order the terminal UI, the text and the JSON show for the same --seed. In the run view each narration waits for space, as in the tour (--no-auto-pause plays through). Lesson files: scenarios/lessons/README.md."
    )]
    Lesson {
        lesson: String,
        /// Print the lesson as text instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print the lesson, each part's run figures and checks as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        /// Show each question's choices in the order this seed gives; without
        /// it, the lesson's own fixed order (the same on every run, so notes,
        /// a handout and its key agree).
        #[arg(long, value_name = "N")]
        seed: Option<u64>,
        /// Print the questions and their choices, without answers, as Markdown.
        #[arg(long, conflicts_with_all = ["json", "answers"])]
        handout: bool,
        /// Print the answer key, for the same --seed, as Markdown.
        #[arg(long, conflicts_with = "json")]
        answers: bool,
        /// Open in poll mode: the room answers by show of hands, `v` reveals
        /// each answer and no key is recorded as the room's (`P` toggles it).
        #[arg(long)]
        poll: bool,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// A model's parameters (total, trainable, per module), buffers, bytes
    /// per dtype, and the activation bytes autograd saves per sample.
    #[command(
        after_help = "SPEC is a preset (`--list` shows them, each marked \"verified on hardware\" when a scenario on it matches an H100 capture, else \"from source only\"), a built-in scenario or a scenario file (its model: a preset, a Gpt/Mlp/..., or a Modules tree). Saved bytes per sample come from one forward pass at batch 1 through the engine."
    )]
    Model {
        /// A preset name, a built-in scenario or a scenario file.
        #[arg(required_unless_present = "list")]
        spec: Option<String>,
        /// Print JSON (keys include `parameters` and `trainable_parameters`).
        #[arg(long)]
        json: bool,
        /// List the presets.
        #[arg(long)]
        list: bool,
    },
    /// Validate a built-in scenario (by name) or a scenario file without
    /// running it (exit 0 valid, 2 invalid).
    Check { scenario: String },
    /// Run a built-in scenario (by name) or a scenario file.
    #[command(
        after_help = "The run follows the release the scenario's `torch:` field names (2.0 to 2.15; default 2.11) on the GPU its `device.gpu` names; the report's first lines say which, and whether the test suite checks this scenario against a capture."
    )]
    Run {
        scenario: String,
        /// Print a report instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print the report as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        /// Run this many iterations instead of the scenario's own (1 to 100,000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(vramscope::scenario::MAX_ITERATIONS)))]
        iterations: Option<u32>,
        /// Where memory comes from: sim (default), or a real GPU: cuda, cuda:N
        /// (the UI's GPU panel, `v`, shows NVML's reading beside the model's).
        #[arg(long, default_value = "sim")]
        device: String,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// Two runs side by side with the cursor synchronised: scenarios (buggy
    /// vs fixed), snapshots, or one of each; or one of them under another
    /// allocator config (`--conf`).
    Compare {
        first: String,
        /// Leave out to compare FIRST with itself under `--conf`.
        second: Option<String>,
        /// With one input: as it is against this PYTORCH_CUDA_ALLOC_CONF (once), or
        /// one config against the other (twice). A snapshot is replayed under it.
        #[arg(long = "conf")]
        confs: Vec<String>,
        /// Print both reports and a table of their figures instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print both reports and their figures as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// Run a scenario (built-in name or file) at several batch sizes: peak
    /// allocated and reserved at each, a line fitted through them and
    /// explained, and the largest batch that fits.
    #[command(
        after_help = "Each point is the whole scenario run with data.batch (and data.seq) set, on a fresh simulated device; points run in parallel. With no --batch the scenario's own `sweep:` section gives the points."
    )]
    Sweep {
        scenario: String,
        /// Batch sizes, comma-separated, e.g. 1,2,4,8.
        #[arg(long)]
        batch: Option<String>,
        /// Sequence lengths (GPT, LSTM, token-input Modules models), e.g. 512,1024: every batch at each.
        #[arg(long)]
        seq: Option<String>,
        /// Search the largest batch that fits at each --seq: doubling from 1, then bisection.
        #[arg(long)]
        find_max_batch: bool,
        /// Print a report instead of opening the terminal UI's chart.
        #[arg(long)]
        headless: bool,
        /// Print the sweep as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// Open a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) and
    /// report what it holds; several (a series of dumps, one per rank) open
    /// one tab each, with a table across them (T) and a diff view (A).
    #[command(
        after_help = "With several files: the tabs (and the table's rows) follow the files' ranks where every name says one (oom_rank-0.pickle, snapshot_rank_3.pickle), else the order given. Headless, each file's report comes first, then the table across files (JSON: {\"files\": [...], \"table\": {...}}); a file that does not open is said in its place (exit 2 after the others)."
    )]
    Open {
        #[arg(required = true, value_name = "SNAPSHOT")]
        snapshots: Vec<PathBuf>,
        /// Iteration boundaries for the leak analysis: a substring of an
        /// annotation name or a frame (default: Optimizer.step annotations,
        /// numbered ones such as `record_function(f"iteration {i}")`,
        /// snapshot markers, or inferred training cycles).
        #[arg(long)]
        step_marker: Option<String>,
        /// Print the report instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// The CUDA device to show (default: the first the file holds; the
        /// report: every device). In the UI, d / D switch devices.
        #[arg(long)]
        device: Option<usize>,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// Replay a snapshot's trace through the allocator model: verify it
    /// decision by decision, or compare other PYTORCH_CUDA_ALLOC_CONF settings.
    Replay {
        snapshot: PathBuf,
        /// Compare every allocation address and segment event with the trace.
        #[arg(long)]
        verify: bool,
        /// Another allocator config to replay under (repeatable), e.g. "expandable_segments:True".
        #[arg(long = "conf")]
        confs: Vec<String>,
        /// Device size for what-if replays, e.g. 16GiB (default: what the snapshot tells, else its peak).
        #[arg(long)]
        capacity: Option<String>,
        /// Read --conf as this PyTorch release would (2.0 to 2.15; default 2.11).
        #[arg(long)]
        torch: Option<String>,
        /// The limit torch.cuda.set_per_process_memory_fraction set in the
        /// recorded run, e.g. 4.8GiB: snapshots do not record it, and
        /// garbage_collection_threshold acts only under one.
        #[arg(long = "allowed-memory")]
        allowed_memory: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Live GPU memory from NVML: every GPU's used/free, utilisation, processes, history.
    Watch {
        /// Print one reading and exit.
        #[arg(long)]
        once: bool,
        /// One JSON line per reading.
        #[arg(long)]
        json: bool,
    },
    /// Watch a running PyTorch job's allocator live (it imports
    /// vramscope_live and calls start(), or runs under `python -m vramscope_live`), or play a recording of one.
    #[command(
        after_help = "ADDRESS: a unix socket (`/path/x.sock`, `unix:/path`), or HOST:PORT (`tcp:HOST:PORT`) with the token the helper printed (--token or VRAMSCOPE_TOKEN). Several addresses, or one with {rank} in it (`/tmp/job-{rank}.sock`; --ranks N says how many, else every rank whose socket exists, from 0), open one tab per rank with a table across them (T) and a diff view (A). The helper `vramscope_live` (pip install vramscope; `python -m vramscope_live train.py` runs a script under it) serves it; `python/PROTOCOL.md` says what it sends. --headless/--json read until the job ends or Ctrl-C, then print `open --json`'s report with a `live` section (several ranks: {\"ranks\":[…],\"table\":{…}})."
    )]
    Attach {
        /// Where the job serves: a unix socket path, HOST:PORT, or a pattern with {rank}.
        #[arg(required_unless_present = "replay", conflicts_with = "replay")]
        address: Vec<String>,
        /// Play a recording (`vramscope_live.start(..., record_to=FILE)`).
        #[arg(long)]
        replay: Option<PathBuf>,
        /// The token the helper printed for a TCP address (else VRAMSCOPE_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// How many ranks a {rank} address names (0 to N-1).
        #[arg(long)]
        ranks: Option<u32>,
        /// Print the report when the job ends (or on Ctrl-C) instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print the report as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        /// Iterations for the leak analysis from a frame name or file:line instead of the job's own steps.
        #[arg(long)]
        step_marker: Option<String>,
        /// The CUDA device to show (default: the job's first).
        #[arg(long)]
        device: Option<usize>,
        /// Trace entries kept for the timeline and the leak analysis (about
        /// 110 bytes each); past it the view starts over from the job's map.
        #[arg(long, default_value_t = vramscope::job::ENTRY_CAP as u64, value_parser = clap::value_parser!(u64).range(10_000..))]
        keep_entries: u64,
        #[command(flatten)]
        pace: PaceArgs,
    },
    /// Run your own PyTorch program, unmodified, on a simulated GPU (no GPU
    /// needed): its exact allocator trace, in the same views as `attach`.
    #[command(
        after_help = "Example: vramscope trace --gpu H100-SXM-80GB --steps 3 -- python train.py --batch-size 8\n\nThe program runs on PyTorch's meta device relabelled as CUDA (torch.cuda.is_available() is true; .cuda(), .to(\"cuda\"), device=\"cuda\" land there; .item(), .cpu() and bool() answer from a small tensor's values where they follow from the program's own, zeros otherwise); every storage it makes is placed by vramscope's caching allocator model, and an OOM is raised in the program as torch.cuda.OutOfMemoryError with PyTorch's message. It stops after --steps optimizer steps (0: when the program ends). Needs PyTorch in the program's Python (docs/trace.md says which releases)."
    )]
    Trace {
        /// The GPU to simulate (default H100-SXM-80GB; with --from, the recorded one; known: H100-SXM-80GB, A100-SXM-80GB, …).
        #[arg(long)]
        gpu: Option<String>,
        /// Stop after this many optimizer steps; 0: run the program to its end.
        #[arg(long, default_value_t = 3)]
        steps: u32,
        /// PYTORCH_CUDA_ALLOC_CONF for the simulated allocator, over the program's own.
        #[arg(long)]
        conf: Option<String>,
        /// Print the report when the program ends instead of opening the terminal UI.
        #[arg(long)]
        headless: bool,
        /// Print the report as JSON (implies --headless).
        #[arg(long)]
        json: bool,
        /// Also write the stream as a recording (`attach --replay FILE`).
        #[arg(long)]
        record: Option<PathBuf>,
        /// Write the run as a snapshot pickle (pytorch.org/memory_viz).
        #[arg(long)]
        export: Option<PathBuf>,
        /// Save the program's requests, to replay them on another GPU or config with --from.
        #[arg(long, value_name = "FILE")]
        save_requests: Option<PathBuf>,
        /// Replay saved requests (--save-requests) under --gpu/--conf instead of running a program.
        #[arg(long, value_name = "FILE", conflicts_with = "steps")]
        from: Option<PathBuf>,
        /// Trace the program once per value: `BATCH=1,2,4,8` replaces `{BATCH}` in its arguments; a fit as `sweep` has.
        #[arg(long, value_name = "NAME=V1,V2,…")]
        sweep: Option<String>,
        /// With --sweep NAME=…: search the largest value that fits on the GPU (doubling, then bisection).
        #[arg(long)]
        find_max_batch: bool,
        /// What one walk for the variables that hold what grew may take, in ms (at a step where allocated grew, and at an OOM; 0: no walks).
        #[arg(long, value_name = "MS", default_value_t = vramscope::traced::HOLDERS_BUDGET_MS)]
        holders_budget: f64,
        #[command(flatten)]
        pace: PaceArgs,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required_unless_present = "from", value_name = "PROGRAM")]
        command: Vec<String>,
    },
    /// What is alive in snapshot B and was not in snapshot A (e.g. two dumps
    /// 100 steps apart), grouped by the first user frame that allocated it.
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a snapshot PyTorch's viewer loads (pytorch.org/memory_viz).
    Export {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Replay the input under this allocator config first.
        #[arg(long)]
        conf: Option<String>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => {
            if ui::have_terminal() {
                ui::open(&["tour"], &cli.pace)
            } else {
                warn!("vramscope: no terminal to draw on; printing the guided tour's headless report instead");
                scenario::run_headless(
                    "tour",
                    scenario::RunArgs {
                        json: false,
                        iterations: None,
                        cuda: None,
                    },
                )
            }
        }
        Some(Command::Compare {
            first,
            second,
            confs,
            headless,
            json,
            pace,
        }) => {
            let sides = compare::sides(first, second, confs)?;
            if headless || json || !ui::have_terminal() {
                compare::compare(&sides, json)
            } else {
                ui::open_compare(&sides, &pace)
            }
        }
        Some(Command::Demo { conf }) => demo::run(&conf),
        Some(Command::Scenarios) => scenario::list(),
        Some(Command::Lessons) => lesson::list(),
        Some(Command::Lesson {
            lesson,
            headless,
            json,
            seed,
            handout,
            answers,
            poll,
            pace,
        }) => {
            if handout || answers {
                lesson::handout(&lesson, seed, answers)
            } else if headless || json || !ui::have_terminal() {
                lesson::headless(&lesson, seed, json)
            } else {
                lesson::open(&lesson, seed, poll, &pace)
            }
        }
        Some(Command::Model { spec, json, list }) => match spec {
            Some(spec) if !list => model::show(&spec, json),
            _ => model::list(json),
        },
        Some(Command::Check { scenario }) => scenario::check_scenario(&scenario),
        Some(Command::Run {
            scenario,
            json,
            iterations,
            headless,
            device,
            pace,
        }) => {
            let cuda = scenario::parse_device(&device)?;
            if headless || json || !ui::have_terminal() {
                scenario::run_headless(
                    &scenario,
                    scenario::RunArgs {
                        json,
                        iterations,
                        cuda,
                    },
                )
            } else if let Some(n) = cuda {
                ui::open_cuda(&scenario, n, &pace)
            } else {
                ui::open(&[&scenario], &pace)
            }
        }
        Some(Command::Sweep {
            scenario,
            batch,
            seq,
            find_max_batch,
            headless,
            json,
            pace,
        }) => {
            let args = sweep::SweepArgs {
                batch,
                seq,
                find_max_batch,
            };
            if headless || json || !ui::have_terminal() {
                sweep::headless(&scenario, &args, json)
            } else {
                ui::open_sweep(&scenario, &args, &pace)
            }
        }
        Some(Command::Open {
            snapshots,
            json,
            headless,
            step_marker,
            device,
            pace,
        }) => {
            let snapshot = match <[PathBuf; 1]>::try_from(snapshots) {
                Ok([one]) => one,
                Err(many) => {
                    let many = open_many::ordered(many);
                    return if headless || json || !ui::have_terminal() {
                        open_many::headless(&many, json, step_marker.as_deref(), device)
                    } else {
                        open_many::open(&many, device, &pace)
                    };
                }
            };
            if headless || json || !ui::have_terminal() {
                snapshot::open(&snapshot, json, step_marker.as_deref(), device)
            } else {
                ui::open_snapshot(&snapshot, device, &pace)
            }
        }
        Some(Command::Replay {
            snapshot,
            verify,
            confs,
            capacity,
            torch,
            allowed_memory,
            json,
        }) => snapshot::replay(
            &snapshot,
            snapshot::ReplayArgs {
                verify,
                confs,
                capacity,
                json,
                torch,
                allowed_memory,
            },
        ),
        Some(Command::Watch { once, json }) => watch::run(once, json),
        Some(Command::Attach {
            address,
            replay,
            token,
            ranks,
            keep_entries,
            headless,
            json,
            step_marker,
            device,
            pace,
        }) => {
            let tui = !(headless || json || !ui::have_terminal());
            let args = attach::AttachArgs {
                addresses: address,
                ranks,
                replay,
                token,
                json,
                step_marker,
                device,
                keep_entries: usize::try_from(keep_entries).unwrap_or(usize::MAX),
            };
            attach::run(args, tui, &pace)
        }
        Some(Command::Trace {
            gpu,
            steps,
            conf,
            headless,
            json,
            record,
            export,
            save_requests,
            from,
            sweep,
            find_max_batch,
            holders_budget,
            pace,
            command,
        }) => {
            let tui = !(headless || json || !ui::have_terminal());
            let args = trace::TraceArgs {
                gpu,
                steps,
                conf,
                json,
                record,
                export,
                save_requests,
                from,
                sweep,
                find_max_batch,
                holders_budget_ms: holders_budget,
                command,
            };
            trace::run(args, tui, &pace)
        }
        Some(Command::Diff { a, b, json }) => snapshot::diff(&a, &b, json),
        Some(Command::Export {
            input,
            output,
            conf,
        }) => snapshot::export(&input, &output, conf.as_deref()),
    }
}
