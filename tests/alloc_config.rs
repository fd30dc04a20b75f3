//! `PYTORCH_CUDA_ALLOC_CONF` parsing (allocator.md §10) and `format_size` (§14).

use vramscope::alloc::{format_size, AllocConfig, Backend, TorchVersion};

const MIB: u64 = 1 << 20;

fn parse(conf: &str) -> AllocConfig {
    AllocConfig::parse(conf).unwrap_or_else(|e| panic!("{conf}: {e}"))
}

fn message(conf: &str, version: u32) -> String {
    AllocConfig::parse_for(conf, TorchVersion(version))
        .expect_err(conf)
        .message
}

#[test]
fn empty_config_is_pytorch_default() {
    let c = parse("");
    assert_eq!(c.max_split_size, u64::MAX);
    assert_eq!(c.max_split_size_stat(), -1);
    assert_eq!(c.max_non_split_rounding_size, 20 * MIB);
    assert_eq!(c.roundup_power2_divisions, [0; 16]);
    assert_eq!(c.garbage_collection_threshold, 0.0);
    assert!(!c.expandable_segments);
    assert_eq!(c.backend, Backend::Native);
}

#[test]
fn valid_forms() {
    let c =
        parse("max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:True");
    assert_eq!(c.max_split_size, 128 * MIB);
    assert_eq!(c.max_split_size_stat(), 134_217_728);
    assert_eq!(c.garbage_collection_threshold, 0.6);
    assert!(c.expandable_segments);
    assert_eq!(
        c.raw,
        "max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:True"
    );

    assert_eq!(
        parse("max_split_size_mb:128MB").max_split_size,
        128 * MIB,
        "numbers read like stoi"
    );
    assert_eq!(
        parse(" max_split_size_mb : 64 ").max_split_size,
        64 * MIB,
        "spaces are dropped"
    );
    // Spaces vanish before tokenizing, and stoi reads the leading digits of "128max…".
    assert_eq!(
        parse("max_split_size_mb:128 max_split_size_mb").max_split_size,
        128 * MIB
    );
    assert!(parse("release_lock_on_cudamalloc:True").release_lock_on_cudamalloc);
    assert!(parse("release_lock_on_hipmalloc:True").release_lock_on_cudamalloc);
    assert!(
        parse("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
            .pinned_use_cuda_host_register
    );
    assert_eq!(
        parse("backend:cudaMallocAsync,max_split_size_mb:40").backend,
        Backend::CudaMallocAsync
    );
    assert_eq!(
        parse("max_non_split_rounding_mb:40").max_non_split_rounding_size,
        40 * MIB
    );
    assert_eq!(
        parse("roundup_power2_divisions:4").roundup_power2_divisions,
        [4; 16]
    );
}

#[test]
fn roundup_list_form_per_era() {
    let conf = "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]";
    let classic = AllocConfig::parse_for(conf, TorchVersion(8))
        .expect("valid")
        .roundup_power2_divisions;
    let unified = AllocConfig::parse_for(conf, TorchVersion(10))
        .expect("valid")
        .roundup_power2_divisions;
    // Index i covers [2^i MiB, 2^(i+1) MiB): 32 MiB → index 5, 64 → 6, … 1024 → 10.
    assert_eq!(&classic[..10], &[8, 8, 8, 8, 8, 8, 8, 2, 4, 2]);
    assert_eq!(
        classic[10], 1,
        "2.4–2.9: '>' overwrites the last explicit entry"
    );
    assert_eq!(unified[10], 4, "2.10+: '>' starts after it");
    assert!(classic[11..].iter().chain(&unified[11..]).all(|&d| d == 1));

    let first = "roundup_power2_divisions:[>:8]";
    assert_eq!(
        AllocConfig::parse_for(first, TorchVersion(8))
            .expect("valid")
            .roundup_power2_divisions,
        [8; 16]
    );
    let unified_first = AllocConfig::parse_for(first, TorchVersion(10))
        .expect("valid")
        .roundup_power2_divisions;
    assert_eq!(unified_first[0], 0);
    assert!(unified_first[1..].iter().all(|&d| d == 8));
}

#[test]
fn invalid_forms_carry_pytorch_messages() {
    assert_eq!(
        message("max_split_size_mb:20", 8),
        "CachingAllocator option max_split_size_mb too small, must be > 20"
    );
    assert!(
        AllocConfig::parse_for("max_split_size_mb:20", TorchVersion(10)).is_ok(),
        "2.10 accepts 20"
    );
    assert_eq!(
        message("max_split_size_mb:19", 10),
        "CachingAllocator option max_split_size_mb too small, must be >= 20"
    );
    assert_eq!(
        message("max_non_split_rounding_mb:5", 8),
        "CachingAllocator option max_non_split_rounding_mb too small, must be > 20"
    );
    assert_eq!(
        message("garbage_collection_threshold:0", 8),
        "garbage_collect_threshold too small, set it 0.0~1.0"
    );
    assert_eq!(
        message("garbage_collection_threshold:1.5", 8),
        "garbage_collect_threshold too big, set it 0.0~1.0"
    );
    assert_eq!(
        message("garbage_collection_threshold:1.5", 10),
        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
    );
    assert_eq!(
        message("expandable_segments:true", 8),
        "Expected a single True/False argument for expandable_segments"
    );
    assert_eq!(
        message("expandable_segments:yes", 10),
        "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'"
    );
    assert_eq!(
        message("backend:magic", 8),
        "Unknown allocator backend, options are native and cudaMallocAsync"
    );
    assert_eq!(
        message("max_split_mb:128", 8),
        "Unrecognized CachingAllocator option: max_split_mb"
    );
    assert_eq!(
        message("max_split_mb:128", 10),
        "Unrecognized key 'max_split_mb' in CUDA allocator config."
    );
    assert_eq!(
        message("roundup_power2_divisions:3", 8),
        "For roundups, the divisions has to be power of 2 "
    );
    assert_eq!(
        message("roundup_power2_divisions:3", 6),
        "For roundups, the divisons has to be power of 2 "
    );
    assert_eq!(
        message("roundup_power2_divisions:0", 8),
        "For roundups, the divisions has to be power of 2 "
    );
    assert_eq!(
        message("roundup_power2_divisions:[256:3]", 8),
        "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
    );
    assert_eq!(
        message("roundup_power2_divisions:[300:2]", 8),
        "For roundups, the intervals have to be power of 2 "
    );
    assert_eq!(
        message("max_split_size_mb;128", 8),
        "Unrecognized CachingAllocator option: max_split_size_mb;128"
    );
    assert_eq!(
        message("expandable_segments:True;max_split_size_mb:128", 8),
        "Expected a single True/False argument for expandable_segments"
    );
    assert_eq!(
        message("max_split_size_mb=128", 8),
        "Unrecognized CachingAllocator option: max_split_size_mb=128"
    );
    assert_eq!(
        message("max_split_size_mb:128:", 8),
        "Error parsing CachingAllocator settings, expected ,"
    );
    assert_eq!(
        message("per_process_memory_fraction:1.5", 10),
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
    );
    assert_eq!(
        message("per_process_memory_fraction:0.5", 8),
        "Unrecognized CachingAllocator option: per_process_memory_fraction"
    );
    assert_eq!(
        message("large_segment_size_mb:8", 12),
        "CachingAllocator option large_segment_size_mb must be > 10 MB"
    );
}

#[test]
fn error_names_key_and_value() {
    // The classic parser (2.4–2.9) says "> 20"; the unified one (2.10+) ">= 20".
    for (version, says) in [
        (TorchVersion(8), "must be > 20"),
        (TorchVersion(11), "must be >= 20"),
    ] {
        let err = AllocConfig::parse_for("max_split_size_mb:5", version).expect_err("too small");
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            ("max_split_size_mb", "5")
        );
        let text = err.to_string();
        assert!(
            text.contains("max_split_size_mb:5") && text.contains(says),
            "{version}: {text}"
        );
    }
    // The default release is 2.11.
    let err = AllocConfig::parse("max_split_size_mb:5").expect_err("too small");
    assert!(err.to_string().contains("must be >= 20"), "{err}");
}

#[test]
fn newer_keys() {
    let c =
        AllocConfig::parse_for("per_process_memory_fraction:0.5", TorchVersion(10)).expect("valid");
    assert_eq!(c.per_process_memory_fraction, Some(0.5));
    let c = AllocConfig::parse_for("large_segment_size_mb:40", TorchVersion(12)).expect("valid");
    assert_eq!(
        (c.large_segment_size, c.max_non_split_rounding_size),
        (40 * MIB, 40 * MIB)
    );
    assert!(AllocConfig::parse_for("large_segment_size_mb:40", TorchVersion(10)).is_err());
}

#[test]
fn format_size_follows_glibc_rounding() {
    assert_eq!(format_size(0), "0 bytes");
    assert_eq!(format_size(1024), "1024 bytes");
    assert_eq!(format_size(1025), "1.00 KiB");
    assert_eq!(format_size(1152), "1.12 KiB");
    assert_eq!(format_size(2432), "2.38 KiB");
    assert_eq!(format_size(MIB), "1024.00 KiB");
    assert_eq!(format_size(1 << 30), "1024.00 MiB");
    assert_eq!(format_size(16 * MIB), "16.00 MiB");
    assert_eq!(format_size(3 << 30), "3.00 GiB");
}

#[test]
fn memory_stats_has_pytorchs_122_keys_sorted() {
    use vramscope::alloc::MemoryStats;
    let stats = MemoryStats::new(-1);
    let map = stats.to_map(false);
    assert_eq!(map.len(), 122, "allocator.md §11.1: 122 keys in 2.4–2.10");
    assert_eq!(
        stats.to_map(true).len(),
        123,
        "2.12+ adds num_oom_rejections"
    );
    assert_eq!(map["max_split_size"], -1);
    for key in [
        "allocated_bytes.all.peak",
        "active.large_pool.freed",
        "inactive_split_bytes.small_pool.current",
        "oversize_segments.allocated",
        "num_sync_all_streams",
        "requested_bytes.all.allocated",
    ] {
        assert!(map.contains_key(key), "{key}");
    }
    let keys: Vec<&String> = map.keys().collect();
    let position = |k: &str| keys.iter().position(|x| *x == k).expect("key");
    assert!(
        position("active.all.allocated") < position("active_bytes.all.allocated"),
        "plain code-point order"
    );
}

#[test]
fn oom_message_wording_follows_the_release() {
    use vramscope::alloc::{oom_message, OomError};
    let info = OomError {
        device: 0,
        requested: 16 << 20,
        rounded: 16 << 20,
        alloc_size: 16 << 20,
        device_free: 0,
        device_total: 100 << 20,
        allocated: 40 << 20,
        reserved: 100 << 20,
        allowed_max: None,
        message: String::new(),
    };
    let v8 = oom_message(&info, TorchVersion(8), None);
    let v10 = oom_message(&info, TorchVersion(10), None);
    let v12 = oom_message(&info, TorchVersion(12), None);
    assert!(
        v8.contains("setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
            && v8.ends_with(
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
            )
    );
    assert!(
        v10.contains("setting PYTORCH_ALLOC_CONF=expandable_segments:True"),
        "{v10}"
    );
    assert!(v12.contains("setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") && v12.ends_with("(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"));
    let with_proc = oom_message(&info, TorchVersion(8), Some(100 << 20));
    assert!(with_proc.contains("of which 0 bytes is free. Including non-PyTorch memory, this process has 100.00 MiB memory in use. Of the allocated memory"));
}
