//! Known values (docs/trace.md "Known values"): a small simulated-GPU
//! tensor whose values follow from values the program had carries them, so
//! the program's value checks, `.item()`s and data-dependent sizes are the
//! GPU's; what depends on an unknown value (random, weights, a write of
//! one) stays unknown and, for a size, assumed and listed.

use serde_json::Value;

use super::{seen, traced_json, Scratch};

const PROGRAM: &str = r#"
import json, torch
seen = {}
T = 512
# transformers' find_packed_sequence_indices on arange positions.
pos = torch.arange(T, device="cuda").unsqueeze(0).expand(4, -1)
diff = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
packed = (diff != 1).cumsum(-1)
if (packed[:, -1] == 0).all():
    seen["branch"] = "gpu"
else:
    mask = torch.ones(1 << 20, dtype=torch.bool, device="cuda")
    seen["branch"] = "zeros"
seen["peak"] = torch.cuda.max_memory_allocated()
x = torch.tensor([1.5, 2.0, 3.5], device="cuda")
seen["sum"] = (x * 2).sum().item()
ids = torch.tensor([[3, 1, 4, 1, 5]]).cuda()
seen["ids"] = ids.cpu().tolist()
m = torch.arange(1000, device="cuda") % 7 == 0
seen["rows"] = torch.nonzero(m).shape[0]
seen["picked"] = torch.arange(1000, device="cuda")[m][-1].item()
seen["unique"] = torch.unique(ids).tolist()
r = torch.randn(1000, device="cuda")
seen["assumed_rows"] = torch.nonzero(r > 0).shape[0]
y = torch.arange(4, device="cuda").float()
v = y[1:]
seen["before"] = v.tolist()
y.add_(r[:4])
seen["after"] = v.tolist()
seen["big"] = torch.arange(1 << 17, device="cuda")[-1].item()
print("SEEN " + json.dumps(seen))
"#;

fn line_of(needle: &str) -> usize {
    PROGRAM
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} in the program"))
}

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn known_values_decide_branches_items_and_sizes_as_on_a_gpu() {
    let s = Scratch::new("known");
    let prog = s.file("known.py", PROGRAM);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    let got = seen(&err);
    // The check reads True, as a GPU does: the 1 MiB mask is never made.
    assert_eq!(got["branch"], "gpu", "{err}");
    let peak = got["peak"].as_u64().expect("peak");
    assert!(peak < 1 << 20, "nothing of a MiB allocated: {peak}");
    assert_eq!(got["sum"], 14.0, "{got}");
    assert_eq!(got["ids"], serde_json::json!([[3, 1, 4, 1, 5]]));
    // 0, 7, …, 994: 143 multiples of 7 below 1,000.
    assert_eq!(got["rows"], 143, "{got}");
    assert_eq!(got["picked"], 994, "a boolean mask index of known values");
    assert_eq!(got["unique"], serde_json::json!([1, 3, 4, 5]));
    // Random values are unknown: the size is assumed (every element true).
    assert_eq!(got["assumed_rows"], 1000, "{got}");
    // A view's value, then a write of an unknown value into its base: the
    // view is unknown from then (zeros, as before this work).
    assert_eq!(got["before"], serde_json::json!([1.0, 2.0, 3.0]));
    assert_eq!(got["after"], serde_json::json!([0.0, 0.0, 0.0]));
    // Above the bound (2**16 elements) values are not kept.
    assert_eq!(got["big"], 0, "{got}");

    let at = |x: &Value| x["at"].as_str().unwrap_or("").to_string();
    let assumed = v["trace"]["assumed"].as_array().expect("assumed");
    assert_eq!(
        assumed.len(),
        1,
        "only the random mask is assumed: {assumed:?}"
    );
    assert!(
        at(&assumed[0]).contains(&format!("known.py:{}", line_of("assumed_rows") + 1)),
        "{assumed:?}"
    );
    let known = v["trace"]["known"].as_array().expect("known");
    let listed: Vec<(String, String)> = known
        .iter()
        .map(|k| (k["what"].as_str().unwrap_or("").to_string(), at(k)))
        .collect();
    for (what, needle) in [
        ("aten.nonzero", "seen[\"rows\"]"),
        ("aten.nonzero", "seen[\"picked\"]"),
        ("aten._unique2", "seen[\"unique\"]"),
    ] {
        let line = format!("known.py:{}", line_of(needle) + 1);
        assert!(
            listed.iter().any(|(w, a)| w == what && a.contains(&line)),
            "{what} at {line} in {listed:?}"
        );
    }
    assert!(
        v["trace"]["untraced"]
            .as_array()
            .is_some_and(|u| u.is_empty()),
        "{}",
        v["trace"]["untraced"]
    );
}
