//! The lines a storage's stack carries: the program's own, as it made the
//! storage, however the helper's walk is cut short (a stack's frames keyed
//! by instruction, a frame's tag for the frames above it, generators never
//! tagged), and never a difference a tracer of the program could see.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{common, python, trace, traced_json, Scratch};

/// A storage's stack is the program's lines as it made the storage: the
/// helper keys a stack by its frames' instructions and reads their lines
/// once, so two calls on one line, a function called from two lines, and
/// a line run again in a loop must each still get their own lines.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn each_storage_carries_the_lines_that_made_it() {
    let s = Scratch::new("lines");
    let prog = s.file(
        "lines.py",
        "import torch\n\
         def make(n):\n\
         \x20   return torch.empty(n, device='cuda')\n\
         keep = []\n\
         for i in range(3):\n\
         \x20   keep.append(make(256)); keep.append(make(512))\n\
         \x20   keep.append(torch.empty(1024, device='cuda'))\n\
         keep.append(make(2048))\n",
    );
    let allocs = traced_frames(&s, &prog);
    let frames = |size: u64| frames_of(&allocs, size);
    let at = |lines: &[(u64, &str)]| at_lines("lines.py", lines);
    // 256 and 512 floats: make() on line 3, called from line 6 (one line,
    // two calls); 1024 floats: line 7; 2048: make() from line 8.
    assert_eq!(frames(1024), vec![at(&[(3, "make"), (6, "<module>")]); 3]);
    assert_eq!(frames(2048), vec![at(&[(3, "make"), (6, "<module>")]); 3]);
    assert_eq!(frames(4096), vec![at(&[(7, "<module>")]); 3]);
    assert_eq!(frames(8192), vec![at(&[(3, "make"), (8, "<module>")])]);
}

/// Each allocation's size and (file name, line, function) frames, read
/// from the export of `program` traced, with Python's own pickle.
fn traced_frames(s: &Scratch, program: &Path) -> Value {
    let pickle = s.0.join("run.pickle");
    let e = pickle.to_string_lossy().into_owned();
    traced_json(program, &["--steps", "0", "--export", &e]);
    let read = "import json, os, pickle, sys\n\
        snap = pickle.load(open(sys.argv[1], 'rb'))\n\
        print(json.dumps([[e['size'], [[os.path.basename(f['filename']), f['line'], f['name']]\n\
        \x20   for f in e['frames']]] for e in snap['device_traces'][0] if e['action'] == 'alloc']))\n";
    let out = Command::new(python())
        .args(["-c", read, &e])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::json(&String::from_utf8_lossy(&out.stdout))
}

/// The frames of every allocation of `size` bytes, in order.
fn frames_of(allocs: &Value, size: u64) -> Vec<Value> {
    allocs
        .as_array()
        .expect("a list")
        .iter()
        .filter(|a| a[0] == size)
        .map(|a| a[1].clone())
        .collect()
}

fn at_lines(file: &str, lines: &[(u64, &str)]) -> Value {
    lines
        .iter()
        .map(|(l, f)| serde_json::json!([file, l, f]))
        .collect()
}

/// The walk to a storage's lines stops at a frame an earlier walk passed
/// (the frames above a running function cannot change): a generator's
/// frame, whose caller is whoever resumes it, is never such a frame, and
/// a function called again from another line is a new frame.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_storage_made_in_a_generator_carries_the_line_that_resumed_it() {
    let s = Scratch::new("resumed");
    let prog = s.file(
        "resumed.py",
        "import torch\n\
         def make(n):\n\
         \x20   return torch.empty(n, device='cuda')\n\
         def gen():\n\
         \x20   while True:\n\
         \x20       yield torch.empty(64, device='cuda')\n\
         g = gen()\n\
         def first():\n\
         \x20   return next(g)\n\
         def second():\n\
         \x20   return next(g)\n\
         keep = []\n\
         def loop():\n\
         \x20   for i in range(4):\n\
         \x20       keep.append(first())\n\
         \x20       keep.append(second())\n\
         \x20       keep.append(make(128))\n\
         \x20   keep.append(make(256))\n\
         loop()\n",
    );
    let allocs = traced_frames(&s, &prog);
    let at = |lines: &[(u64, &str)]| at_lines("resumed.py", lines);
    let resumed: Vec<Value> = (0..4)
        .flat_map(|_| {
            [
                at(&[(6, "gen"), (9, "first"), (15, "loop"), (19, "<module>")]),
                at(&[(6, "gen"), (11, "second"), (16, "loop"), (19, "<module>")]),
            ]
        })
        .collect();
    assert_eq!(frames_of(&allocs, 256), resumed);
    assert_eq!(
        frames_of(&allocs, 512),
        vec![at(&[(3, "make"), (17, "loop"), (19, "<module>")]); 4]
    );
    assert_eq!(
        frames_of(&allocs, 1024),
        vec![at(&[(3, "make"), (18, "loop"), (19, "<module>")])]
    );
}

/// What the walk leaves in a frame's `f_trace` is invisible to a tracer
/// the program starts later: it sees the same line events as without the
/// trace (the program run on the CPU by plain Python).
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_tracer_started_mid_run_sees_the_lines_it_sees_untraced() {
    let s = Scratch::new("tracer");
    let prog = s.file(
        "tracer.py",
        "import sys, torch\n\
         dev = 'cuda' if torch.cuda.is_available() else 'cpu'\n\
         lines = []\n\
         def local(frame, event, arg):\n\
         \x20   if event == 'line':\n\
         \x20       lines.append((frame.f_code.co_name, frame.f_lineno))\n\
         \x20   return local\n\
         def tracer(frame, event, arg):\n\
         \x20   return local if frame.f_code.co_name in ('build_pair', 'loop_pairs') else None\n\
         def build_pair(n):\n\
         \x20   a = torch.empty(n, device=dev)\n\
         \x20   b = torch.empty(n, device=dev)\n\
         \x20   return a, b\n\
         def loop_pairs(k):\n\
         \x20   out = []\n\
         \x20   for i in range(k):\n\
         \x20       out.append(build_pair(16))\n\
         \x20   return out\n\
         def outer():\n\
         \x20   loop_pairs(3)\n\
         \x20   sys.settrace(tracer)\n\
         \x20   loop_pairs(2)\n\
         \x20   sys.settrace(None)\n\
         outer()\n\
         print('LINES', lines, file=sys.stderr)\n",
    );
    let lines_of = |stderr: &str| -> String {
        stderr
            .lines()
            .find(|l| l.starts_with("LINES"))
            .unwrap_or_else(|| panic!("no LINES: {stderr}"))
            .to_string()
    };
    let plain = Command::new(python())
        .arg(&prog)
        .output()
        .expect("python runs");
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let untraced = lines_of(&String::from_utf8_lossy(&plain.stderr));
    // loop_pairs' own lines and build_pair's, twice each: the tracer saw something.
    assert!(
        untraced.contains("('build_pair', 11)") && untraced.contains("('loop_pairs', 16)"),
        "{untraced}"
    );
    let (code, _, err) = trace(&["--steps", "0", "--headless"], &prog, &[]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    assert_eq!(lines_of(&err), untraced);
}
