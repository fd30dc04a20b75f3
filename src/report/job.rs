//! What `attach --headless`/`--json` prints: `open --json`'s report of the
//! job as it stands, with what only a live job tells.

use serde::Serialize;

use super::snapshot::{SnapshotReport, LIVE_LAYOUT};
use crate::job::{DeviceGrowth, LiveFacts, Session};

/// `open --json`'s report with a `live` section.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReport {
    #[serde(flatten)]
    pub report: SnapshotReport,
    pub live: LiveFacts,
}

impl LiveReport {
    /// The report of `session` as it stands.
    /// `step_marker`: take iterations from a frame name or `file:line`
    /// (as `open --step-marker` does) instead of the job's step markers.
    pub fn of(session: &mut Session, name: &str, step_marker: Option<&str>) -> LiveReport {
        session.snapshot();
        let session = &*session;
        let mut report = SnapshotReport::with_boundaries(name, session.snap(), &|d| {
            session.boundaries_by(d, step_marker)
        });
        report.layout = LIVE_LAYOUT.to_string();
        let growth = report.devices.iter().map(growth_of).collect();
        LiveReport {
            report,
            live: LiveFacts {
                growth,
                ..session.facts()
            },
        }
    }
}

/// Live bytes at each step boundary of one device's report, and the change
/// from one to the next.
fn growth_of(d: &super::snapshot::DeviceReport) -> DeviceGrowth {
    let live_at_step = d
        .leaks
        .as_ref()
        .map(|l| l.live_at_boundary.clone())
        .unwrap_or_default();
    let growth_per_step = live_at_step
        .windows(2)
        .map(|w| w[1] as i64 - w[0] as i64)
        .collect();
    DeviceGrowth {
        device: d.device,
        live_at_step,
        growth_per_step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::frame::FrameReader;
    use crate::job::synth::training_job;
    use crate::job::{decode, Session};

    fn session_of(bytes: &[u8]) -> Session {
        let mut frames = FrameReader::new(bytes, "job");
        let mut session = Session::new("job");
        while let Ok(Some((i, frame))) = frames.next_frame() {
            if let Ok(Some(m)) = decode("job", i, frame) {
                session.apply(i, m).expect("applies");
            }
        }
        session
    }

    #[test]
    fn a_leaking_job_grows_by_its_leak_at_every_step() {
        const LEAK: u64 = 2 << 20;
        let mut session = session_of(&training_job(20, LEAK, 3).bytes);
        let r = LiveReport::of(&mut session, "job", None);
        assert_eq!(r.report.layout, LIVE_LAYOUT);
        let growth = &r.live.growth[0];
        assert_eq!(growth.device, 0);
        // 20 step markers: 20 boundaries, 19 changes, each the leak.
        assert_eq!(growth.live_at_step.len(), 20);
        assert_eq!(growth.growth_per_step, vec![LEAK as i64; 19]);
        assert_eq!(r.live.steps_seen, 20);
        assert_eq!(r.live.address, "job");
        assert_eq!(r.live.ended.as_deref(), Some("the process is exiting"));
    }

    #[test]
    fn json_is_the_snapshot_report_with_a_live_section() {
        let mut session = session_of(&training_job(4, 1 << 20, 2).bytes);
        let json = serde_json::to_value(LiveReport::of(&mut session, "job", None)).expect("json");
        assert!(json["devices"].is_array(), "{json}");
        assert_eq!(json["live"]["steps_seen"], 4);
        assert_eq!(
            json["live"]["growth"][0]["growth_per_step"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );
    }
}
