use super::*;
use crate::device::nvml::ProcessMemory;

const MIB: u64 = 1 << 20;

fn bus(b: u32) -> PciAddress {
    PciAddress {
        domain: 0,
        bus: b,
        device: 0,
    }
}

fn gpu(index: u32, b: u32, uuid: &str, procs: &[(u32, Option<u64>)]) -> GpuReading {
    GpuReading {
        pci: Some(bus(b)),
        uuid: Some(uuid.to_string()),
        processes: procs
            .iter()
            .map(|(pid, used)| ProcessMemory {
                pid: *pid,
                name: None,
                used: *used,
            })
            .collect(),
        ..GpuReading::unknown(index)
    }
}

fn job(devices: Vec<JobDevice>) -> LiveJob {
    LiveJob {
        pid: Some(4242),
        hostname: Some("node7".into()),
        devices,
    }
}

fn dev(device: u8, pci: Option<u32>, uuid: Option<&str>) -> JobDevice {
    JobDevice {
        device,
        pci: pci.map(bus),
        uuid: uuid.map(str::to_string),
        reserved: Some(2048 * MIB),
        stats_reserved: Some(2048 * MIB),
        ..JobDevice::default()
    }
}

/// Two GPUs; under CUDA_VISIBLE_DEVICES=1 the job's cuda:0 is NVML's GPU 1.
fn two_gpus(used: Option<u64>) -> Vec<GpuReading> {
    vec![
        gpu(0, 0x1b, "GPU-aaaa", &[(1, Some(MIB))]),
        gpu(1, 0x3b, "GPU-bbbb", &[(7, Some(MIB)), (4242, used)]),
    ]
}

#[test]
fn a_device_is_found_by_uuid_then_bus_id_and_never_by_number_when_it_named_itself() {
    let gpus = two_gpus(Some(MIB));
    // torch writes the UUID bare, NVML with GPU-.
    let (g, by) = find_gpu(&dev(0, None, Some("BBBB")), &gpus).expect("by uuid");
    assert_eq!((g.index, by), (1, MatchedBy::Uuid));
    let (g, by) = find_gpu(&dev(0, Some(0x3b), None), &gpus).expect("by bus");
    assert_eq!((g.index, by), (1, MatchedBy::PciBusId));
    // A UUID NVML does not list (a MIG instance) falls back to the bus id.
    let (g, by) = find_gpu(&dev(0, Some(0x3b), Some("MIG-cccc")), &gpus).expect("bus");
    assert_eq!((g.index, by), (1, MatchedBy::PciBusId));
    assert_eq!(find_gpu(&dev(0, Some(0x5e), None), &gpus), None);
    // Only a device that named nothing is matched by ordinal, and says so.
    let (g, by) = find_gpu(&dev(0, None, None), &gpus).expect("by ordinal");
    assert_eq!((g.index, by), (0, MatchedBy::Ordinal));
    assert!(by.describe().contains("CUDA_VISIBLE_DEVICES"));
}

#[test]
fn the_difference_is_nvml_used_minus_the_streams_reserved() {
    let used = 2048 * MIB + 517 * MIB;
    let gpus = two_gpus(Some(used));
    let mut d = dev(0, Some(0x3b), None);
    d.stats_reserved = Some(2000 * MIB);
    let out = reconcile(&job(vec![d.clone()]), &JobPlace::Here, NvmlNow::Read(&gpus));
    let read = out[0].reading.as_ref().expect("read");
    assert_eq!((read.gpu, read.used_by_process), (1, used));
    assert_eq!(read.difference, Some(517 * MIB as i64));
    // A reading older than the allocator's growth: negative, not hidden.
    d.reserved = Some(used + MIB);
    let out = reconcile(&job(vec![d.clone()]), &JobPlace::Here, NvmlNow::Read(&gpus));
    assert_eq!(
        out[0].reading.as_ref().expect("read").difference,
        Some(-(MIB as i64))
    );
    // No state yet: against memory_stats()' reserved; neither: unknown.
    d.reserved = None;
    let out = reconcile(&job(vec![d.clone()]), &JobPlace::Here, NvmlNow::Read(&gpus));
    assert_eq!(
        out[0].reading.as_ref().expect("read").difference,
        Some(565 * MIB as i64)
    );
    d.stats_reserved = None;
    let out = reconcile(&job(vec![d]), &JobPlace::Here, NvmlNow::Read(&gpus));
    assert_eq!(out[0].reading.as_ref().expect("read").difference, None);
}

fn why(place: JobPlace, nvml: NvmlNow<'_>, d: JobDevice) -> String {
    let out = reconcile(&job(vec![d]), &place, nvml);
    out[0]
        .reading
        .as_ref()
        .expect_err("unavailable")
        .to_string()
}

#[test]
fn each_reason_for_no_reading_is_said() {
    let here = JobPlace::Here;
    let d = || dev(0, Some(0x3b), None);
    let gpus = two_gpus(Some(MIB));
    let w = why(JobPlace::Recording, NvmlNow::Read(&gpus), d());
    assert!(
        w.contains("a recording: the job is not running here"),
        "{w}"
    );
    let remote = JobPlace::Remote {
        host: "10.0.0.7".into(),
    };
    let w = why(remote, NvmlNow::Read(&gpus), d());
    assert!(
        w.contains("another host (node7, reached over TCP at 10.0.0.7"),
        "{w}"
    );
    let w = why(
        here.clone(),
        NvmlNow::Unavailable("no NVIDIA driver found"),
        d(),
    );
    assert_eq!(w, "NVML unavailable here: no NVIDIA driver found");
    assert!(why(here.clone(), NvmlNow::Waiting, d()).contains("waiting"));
    let w = why(
        here.clone(),
        NvmlNow::Read(&gpus),
        dev(0, Some(0x5e), Some("GPU-zz")),
    );
    assert!(
        w.contains(
            "no GPU with the job's UUID GPU-zz or PCI bus id 0000:5e:00 for cuda:0 (2 GPUs listed"
        ),
        "{w}"
    );
    let empty = vec![gpu(1, 0x3b, "GPU-bbbb", &[])];
    let w = why(here.clone(), NvmlNow::Read(&empty), d());
    assert!(
        w.contains("no process on GPU 1") && w.contains("container"),
        "{w}"
    );
    let other = vec![gpu(1, 0x3b, "GPU-bbbb", &[(7, Some(1))])];
    let w = why(here.clone(), NvmlNow::Read(&other), d());
    assert!(
        w.contains("pid 4242 is not among the 1 process NVML lists on GPU 1"),
        "{w}"
    );
    let w = why(here.clone(), NvmlNow::Read(&two_gpus(None)), d());
    assert!(w.contains("does not report its memory"), "{w}");
    let mut nameless = job(vec![d()]);
    nameless.pid = None;
    let out = reconcile(&nameless, &here, NvmlNow::Read(&gpus));
    assert_eq!(out[0].reading, Err(Unavailable::NoPid));
}

#[test]
fn a_tcp_job_is_here_only_on_loopback() {
    let tcp = |h: &str| Address::Tcp {
        host: h.into(),
        port: 7878,
    };
    for h in ["127.0.0.1", "localhost", "::1", "127.3.2.1"] {
        assert_eq!(JobPlace::of(&tcp(h)), JobPlace::Here, "{h}");
    }
    assert_eq!(
        JobPlace::of(&tcp("10.0.0.7")),
        JobPlace::Remote {
            host: "10.0.0.7".into()
        }
    );
    assert_eq!(
        JobPlace::of(&Address::Unix("/tmp/s".into())),
        JobPlace::Here
    );
}

#[test]
fn the_json_entry_has_the_reading_or_why_not() {
    let gpus = two_gpus(Some(3000 * MIB));
    let out = reconcile(
        &job(vec![dev(0, Some(0x3b), None), dev(1, Some(0x99), None)]),
        &JobPlace::Here,
        NvmlNow::Read(&gpus),
    );
    let v =
        serde_json::to_value(out.iter().map(NvmlEntry::from).collect::<Vec<_>>()).expect("json");
    assert_eq!(v[0]["used_by_process"], 3000 * MIB);
    assert_eq!(v[0]["reserved"], 2048 * MIB);
    assert_eq!(v[0]["difference"], 952 * MIB);
    assert_eq!(v[0]["matched_by"], "pci_bus_id");
    assert!(v[0].get("unavailable").is_none());
    assert!(v[1].get("used_by_process").is_none() && v[1].get("difference").is_none());
    let why = v[1]["unavailable"].as_str().expect("why");
    assert!(why.contains("PCI bus id 0000:99:00"), "{why}");
}
