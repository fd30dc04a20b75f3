//! What the program's environment decides: the allocator config (a bad one
//! an error the program raises), the workspaces, and the SDPA backend the
//! dispatcher takes under the program's switches.

use super::*;

#[test]
fn the_programs_environment_sets_the_allocator_and_workspaces() {
    let (mut sim, sink) = simulator(None);
    let env = json!(["init", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                              "CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024"}]);
    assert_eq!(ask(&mut sim, &env)[0], "ok");
    let linear = |backward: bool| {
        json!(["op", "addmm", backward, [{"shape": [768], "dtype": "float32", "contiguous": true},
                                        {"shape": [8, 768], "dtype": "float32", "contiguous": true}], Value::Null])
    };
    assert_eq!(ask(&mut sim, &linear(false))[0], "ok");
    let one_thread = 8_519_680 + (1 << 20);
    assert_eq!(stat(&mut sim, "allocated_bytes.all.current"), one_thread);
    assert_eq!(ask(&mut sim, &linear(false))[0], "ok");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.current"),
        one_thread,
        "cached per thread"
    );
    assert_eq!(ask(&mut sim, &linear(true))[0], "ok");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.current"),
        2 * one_thread,
        "autograd's own"
    );
    assert_eq!(ask(&mut sim, &json!(["clear_workspaces"]))[0], "ok");
    assert_eq!(stat(&mut sim, "allocated_bytes.all.current"), 0);
    let (outcome, snap, _) = finish(sim, &sink);
    assert_eq!(outcome.alloc_conf, "expandable_segments:True");
    assert!(snap.segments.iter().all(|s| s.is_expandable));
}

#[test]
fn a_bad_allocator_config_is_an_error_the_program_raises() {
    let (mut sim, _) = simulator(Some("max_split_size_mb:banana"));
    let r = ask(&mut sim, &json!(["init", {}]));
    assert_eq!(r[0], "error");
    assert!(
        r[1].as_str()
            .is_some_and(|m| m.contains("max_split_size_mb")),
        "{r}"
    );
}

#[test]
fn sdpa_follows_the_dispatcher_and_the_programs_switches() {
    let (mut sim, _) = simulator(None);
    let call = |dtype: &str, enabled: Value| {
        json!(["sdpa", {"dtype": dtype, "mask": false, "dropout": 0.0, "head_dim": 64, "gqa": false,
                        "enabled": enabled}])
    };
    let all = json!({"flash": true, "efficient": true, "math": true, "cudnn": true});
    assert_eq!(ask(&mut sim, &call("float32", all.clone()))[1], "efficient");
    assert_eq!(
        ask(&mut sim, &call("bfloat16", all))[1],
        "cudnn",
        "2.11 on sm90"
    );
    let flash_only = json!({"flash": true, "efficient": false, "math": false, "cudnn": false});
    assert_eq!(ask(&mut sim, &call("float16", flash_only))[1], "flash");
}
