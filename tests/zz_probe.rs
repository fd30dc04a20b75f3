use std::io::Write;
use vramscope::engine::CublasLtWorkspace;
use vramscope::scenario::{resolve, run, RunOptions};
use vramscope::trace::Event;
#[test]
fn probe() {
    for name in ["var-batch-expandable-fixed", "amp-fp16"] {
        let (s, mut b) = resolve(name).unwrap();
        b.engine.torch_minor = Some(11);
        b.engine.cublaslt_workspace = CublasLtWorkspace::Cached;
        let r = run(
            &s,
            &b,
            &RunOptions {
                iterations: None,
                record_events: true,
            },
        );
        let mut f = std::fs::File::create(format!("/tmp/sim_{name}.txt")).unwrap();
        for e in &r.events {
            match e {
                Event::Alloc(a) => {
                    writeln!(f, "{:?} {} {:x}", a.action, a.size, a.addr).unwrap();
                }
                Event::Marker(m) => {
                    if let vramscope::trace::Marker::OpBegin { name, .. } = m {
                        writeln!(f, "# {name}").unwrap();
                    }
                }
            }
        }
    }
}
