//! `vramscope open a.pickle b.pickle … --headless/--json`: each file's own
//! report, then the table across them. The table's figures are checked
//! against each file's single-file `open --json` report (and SOURCES.md),
//! not against the code that makes the table.

mod common;

use common::{json, real, temp_dir, vramscope};
use serde_json::Value;

const ADAM: &str = "adam-step_closed-trace_annotations.pickle";
const TINY: &str = "cs336-silmont_tiny-closed-trace_cpp-frames.pickle";
const OOM3: &str = "code-location_expandable_3gpu_oom.pickle";
const STATE_ONLY: &str = "text-to-sql_expandable_2gpu_state-only.pickle";

fn path(name: &str) -> String {
    real(name).display().to_string()
}

fn open_json(files: &[String]) -> (i32, Value) {
    let mut args = vec!["open"];
    args.extend(files.iter().map(String::as_str));
    args.push("--json");
    let (code, out, err) = vramscope(&args);
    assert!(!out.is_empty(), "no report: {err}");
    (code, json(&out))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a number: {v}"))
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn each_files_report_is_its_own_and_the_table_agrees_with_it() {
    let files = [path(OOM3), path(STATE_ONLY), path(ADAM)];
    let (code, many) = open_json(&files);
    assert_eq!(code, 0);
    let rows = many["table"]["rows"].as_array().expect("rows");
    let mut row = 0;
    for (i, f) in files.iter().enumerate() {
        let (code, single) = open_json(std::slice::from_ref(f));
        assert_eq!(code, 0);
        assert_eq!(many["files"][i], single, "{f}: the report open gives alone");
        let devices = single["devices"].as_array().expect("devices");
        for d in devices {
            let r = &rows[row];
            row += 1;
            assert_eq!(r["file"], f.as_str());
            assert_eq!(r["device"], d["device"]);
            assert_eq!(r["reserved"], d["reserved"], "{r}");
            assert_eq!(r["allocated"], d["allocated"], "{r}");
            assert_eq!(r["largest_free_block"], d["largest_free_block"], "{r}");
            let (reserved, free, largest) = (
                u(&d["reserved"]),
                u(&d["inactive"]["bytes"]),
                u(&d["largest_free_block"]),
            );
            assert_eq!(u(&r["cached_free"]), free, "{r}");
            let share = r["cached_free_share"].as_f64().expect("a share");
            assert!((share - free as f64 / reserved as f64).abs() < 1e-9, "{r}");
            let frag = r["fragmentation"].as_f64().expect("a share");
            assert!(
                (frag - (1.0 - largest as f64 / free as f64)).abs() < 1e-9,
                "{r}"
            );
            assert_eq!(r["oom_count"], d["oom_count"], "{r}");
            let first = d["ooms"].get(0).map(|o| o["entry"].clone());
            assert_eq!(r["first_oom_entry"], first.unwrap_or(Value::Null), "{r}");
            if u(&d["trace_entries"]) == 0 {
                assert!(
                    r["peak_allocated"].is_null() && r["peak_reserved"].is_null(),
                    "{r}"
                );
            } else {
                assert!(u(&r["peak_allocated"]) >= u(&d["allocated"]), "{r}");
                assert!(u(&r["peak_reserved"]) >= reserved, "{r}");
                assert!(u(&r["peak_allocated"]) <= u(&r["peak_reserved"]), "{r}");
            }
            // A file with several devices labels each row with it.
            let label = r["label"].as_str().unwrap_or_default();
            assert_eq!(devices.len() > 1, label.contains(" · cuda:"), "{label}");
        }
    }
    assert_eq!(row, rows.len(), "one row per file and device");
    // SOURCES.md: device 1 of the 3-GPU file records the only OOM, at entry 421.
    let oom: Vec<&Value> = rows.iter().filter(|r| u(&r["oom_count"]) > 0).collect();
    assert_eq!(oom.len(), 1);
    assert_eq!(
        (oom[0]["device"].as_i64(), u(&oom[0]["first_oom_entry"])),
        (Some(1), 421)
    );
    assert!(many["table"]["definitions"]["fragmentation"].is_string());
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn rank_files_come_in_rank_order_labelled_by_rank() {
    let dir = temp_dir("open-many-ranks");
    let mut given = Vec::new();
    for (rank, src) in [(10, ADAM), (2, TINY), (0, STATE_ONLY)] {
        let to = dir.join(format!("oom_rank-{rank}.pickle"));
        std::fs::copy(real(src), &to).expect("copy");
        given.push(to.display().to_string());
    }
    let (code, many) = open_json(&given);
    assert_eq!(code, 0);
    let labels: Vec<&str> = many["table"]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["label"].as_str())
        .collect();
    assert_eq!(
        labels,
        ["rank 0 · cuda:0", "rank 0 · cuda:1", "rank 2", "rank 10"],
        "rank 0 (the 2-GPU file) first, 10 last"
    );
    let files: Vec<&str> = many["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["file"].as_str())
        .collect();
    assert!(files[0].ends_with("oom_rank-0.pickle") && files[2].ends_with("oom_rank-10.pickle"));
    // The text report's table says the same.
    let mut args = vec!["open"];
    args.extend(given.iter().map(String::as_str));
    args.push("--headless");
    let (code, text, _) = vramscope(&args);
    assert_eq!(code, 0);
    let table = text.split("== across files ==").nth(1).expect("the table");
    let at = |s: &str| table.find(s).unwrap_or_else(|| panic!("{s} in\n{table}"));
    assert!(at("rank 0 · cuda:1") < at("rank 2 ") && at("rank 2 ") < at("rank 10"));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_file_that_does_not_open_is_said_in_its_place_and_the_others_reported() {
    let missing = "/nonexistent/oom_snapshot.pickle".to_string();
    let (code, many) = open_json(&[path(ADAM), missing.clone(), path(TINY)]);
    assert_eq!(code, 2, "bad input among the files");
    assert_eq!(many["files"][1]["file"], missing.as_str());
    let err = many["files"][1]["error"].as_str().expect("its error");
    assert!(err.contains(&missing), "{err}");
    let rows = many["table"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    assert!(rows[1]["reserved"].is_null() && rows[1]["error"].is_string());
    for r in [&rows[0], &rows[2]] {
        assert!(r["error"].is_null() && u(&r["reserved"]) > 0, "{r}");
    }
    assert!(
        many["files"][2]["devices"].is_array(),
        "the file after it is reported"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn one_file_is_reported_as_before() {
    let (code, single) = open_json(&[path(ADAM)]);
    assert_eq!(code, 0);
    assert!(single["devices"].is_array() && single.get("table").is_none());
}
