//! `vramscope diff A B`: two snapshots of one job some iterations apart; the
//! line whose live bytes grow is the leak's.

mod common;

use std::path::Path;

use common::{json, scenarios_dir, temp_dir, vramscope};

/// `store-outputs-bug` run for `iterations`, exported as a snapshot. Both
/// runs are written to the same path (stacks name the scenario file), as
/// one job's two dumps would share their source files.
fn export_after(dir: &Path, iterations: u32) -> (std::path::PathBuf, serde_json::Value) {
    let src =
        std::fs::read_to_string(scenarios_dir().join("store-outputs-bug.ron")).expect("scenario");
    let at = src.find("iterations:").expect("an iterations field");
    let end = at + src[at..].find(',').expect("its comma");
    let text = format!("{}iterations: {iterations}{}", &src[..at], &src[end..]);
    let file = dir.join("store-outputs.ron");
    std::fs::write(&file, text).expect("write");
    let out = dir.join(format!("after{iterations}.pickle"));
    let (code, _, err) = vramscope(&[
        "export",
        &file.display().to_string(),
        "-o",
        &out.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, report, err) = vramscope(&["run", &file.display().to_string(), "--json"]);
    assert!(code == 0 || code == 1, "{err}");
    (out, json(&report))
}

#[test]
fn the_growing_line_is_the_leaks_and_grows_by_its_rate() {
    let dir = temp_dir("diff");
    let (a, _) = export_after(&dir, 2);
    let (b, run) = export_after(&dir, 5);
    let growth = run["leaks"]
        .as_array()
        .and_then(|l| l.iter().find(|f| f["root"] == "preds"))
        .and_then(|f| f["growth_per_iter"].as_u64())
        .expect("the preds leak and its growth per iteration");
    let (code, out, err) = vramscope(&[
        "diff",
        &a.display().to_string(),
        &b.display().to_string(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let d = &v["devices"][0];
    let top = &d["changes"][0];
    assert!(
        top["site"]
            .as_str()
            .is_some_and(|s| s.contains("out = model(x)")),
        "{top}"
    );
    let grew = top["b_bytes"].as_u64().unwrap_or(0) - top["a_bytes"].as_u64().unwrap_or(0);
    assert_eq!(grew, 3 * growth, "three more iterations of the leak");
    // The per-site changes add up to the change in live bytes.
    let net: i128 = d["changes"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    i128::from(c["b_bytes"].as_u64().unwrap_or(0))
                        - i128::from(c["a_bytes"].as_u64().unwrap_or(0))
                })
                .sum()
        })
        .unwrap_or(0);
    let live = |k: &str| i128::from(d[k].as_u64().unwrap_or(0));
    assert_eq!(net, live("b_live_bytes") - live("a_live_bytes"));
    // The text names the same line first under "grew".
    let (_, text, _) = vramscope(&["diff", &a.display().to_string(), &b.display().to_string()]);
    let after = text
        .split("live bytes grew")
        .nth(1)
        .expect("a grew section");
    assert!(
        after
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("out = model(x)")),
        "{text}"
    );
}

#[test]
fn a_snapshot_against_itself_has_nothing_new() {
    let file = common::capture("peak_inside_step");
    let f = file.display().to_string();
    let (code, out, err) = vramscope(&["diff", &f, &f, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    for d in v["devices"].as_array().expect("devices") {
        assert_eq!(d["new_bytes"], 0);
        assert_eq!(d["gone_bytes"], 0);
        assert!(d["changes"].as_array().is_some_and(|c| c.is_empty()));
        assert!(d["a_live_bytes"].as_u64().is_some_and(|b| b > 0));
    }
}

#[test]
fn a_missing_or_malformed_file_is_named() {
    let dir = temp_dir("diff-bad");
    let bad = dir.join("bad.pickle");
    std::fs::write(&bad, b"\x80\x04not a pickle").expect("write");
    let ok = common::capture("peak_inside_step");
    let (code, _, err) = vramscope(&[
        "diff",
        &ok.display().to_string(),
        &bad.display().to_string(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.pickle"), "{err}");
    let (code, _, err) = vramscope(&["diff", "/nonexistent/a.pickle", &ok.display().to_string()]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/a.pickle"), "{err}");
}

/// The same job's dump with every recorded path under another directory (a
/// second checkout, another environment): nothing is new and no line grew.
#[test]
fn the_same_job_dumped_from_another_directory_has_nothing_new() {
    let dir = temp_dir("diff-moved");
    let file = common::capture("peak_inside_step");
    let moved = dir.join("moved.pickle");
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
def move(frames):
    for f in frames or []:
        f["filename"] = "/elsewhere/checkout" + f["filename"]
for s in d["segments"]:
    for b in s["blocks"]:
        move(b.get("frames"))
for t in d["device_traces"]:
    for e in t:
        move(e.get("frames"))
pickle.dump(d, open(sys.argv[2], "wb"))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&file)
        .arg(&moved)
        .output()
        .expect("python3 is needed (Debian/Ubuntu: sudo apt-get install python3)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, out, err) = vramscope(&[
        "diff",
        &file.display().to_string(),
        &moved.display().to_string(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    for d in v["devices"].as_array().expect("devices") {
        assert!(d["a_live_bytes"].as_u64().is_some_and(|b| b > 0), "{d}");
        assert_eq!(d["new_bytes"], 0, "{d}");
        assert_eq!(d["gone_bytes"], 0, "{d}");
        assert!(d["changes"].as_array().is_some_and(|c| c.is_empty()), "{d}");
    }
}
