//! `STRATA_DEVICE_STRACE=0` (read when a chip is initialised) suppresses the device-domain
//! spans (`clk=dev`) of its runs while the host spans stay, as the reference's
//! `SIMPLER_DEVICE_STRACE_ENABLE=0` does; and a run's trace puts its device spans on the
//! host clock, inside the host span that waited for them. One test in this binary: it
//! changes the process environment.

use strata_chip::*;
use strata_types::CallConfig;

fn chip() -> (ChipWorker, OrchHandle) {
    let mut chip = ChipWorker::new(ChipConfig::default()).unwrap();
    let k = chip.register_kernel_fn("noop", |_| Ok(())).unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o, _| {
            o.submit_aiv(k, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    (chip, orch)
}

const HOST: [&str; 6] = [
    "chip.run",
    "chip.run.bind",
    "chip.run.bind.args",
    "chip.run.bind.prebuilt",
    "chip.run.runner_run",
    "chip.run.validate",
];

fn names(spans: &[Span]) -> Vec<&str> {
    let mut n: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    n.sort_unstable();
    n
}

#[test]
fn device_markers_follow_the_toggle_and_sit_inside_runner_run_on_the_host_clock() {
    std::env::set_var("STRATA_DEVICE_STRACE", "0");
    let (mut off, orch) = chip();
    let r = off
        .run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert_eq!(names(&r.spans()), HOST, "host spans only");
    assert!(r.spans().iter().all(|s| !s.is_device()));
    assert!(!r.strace().contains("clk=dev"));
    off.close().unwrap();

    for on in ["1", ""] {
        if on.is_empty() {
            std::env::remove_var("STRATA_DEVICE_STRACE");
        } else {
            std::env::set_var("STRATA_DEVICE_STRACE", on);
        }
        let (mut chip, orch) = chip();
        let r = chip
            .run(
                &orch,
                &mut RunArgs::new(),
                &CallConfig::default().with_swimlane(true),
            )
            .unwrap();
        let spans = r.spans();
        for h in HOST {
            assert!(spans.iter().any(|s| s.name == h && !s.is_device()), "{h}");
        }
        let dev: Vec<&Span> = spans.iter().filter(|s| s.is_device()).collect();
        for d in ["device_wall", "device_wall.orch", "device_wall.sched"] {
            let name = format!("chip.run.runner_run.{d}");
            assert!(
                dev.iter().any(|s| s.name == name),
                "{name} missing: {spans:?}"
            );
        }
        // [STRACE]: device spans relative to the device origin (the wall starts at 0).
        let wall = |spans: &[Span]| {
            spans
                .iter()
                .find(|s| s.name == "chip.run.runner_run.device_wall")
                .cloned()
                .unwrap()
        };
        assert_eq!(wall(&spans).ts, 0);
        // The trace: on the host clock, inside the host span that waited for them.
        let p = r.process_trace("chip 0");
        let runner = p
            .spans
            .iter()
            .find(|s| s.name == "chip.run.runner_run")
            .unwrap();
        let w = wall(&p.spans);
        assert!(
            runner.ts <= w.ts && w.end() <= runner.end(),
            "{runner:?} {w:?}"
        );
        for s in p.spans.iter().filter(|s| s.is_device()) {
            assert!(w.ts <= s.ts && s.end() <= w.end(), "{s:?} outside {w:?}");
        }
        assert_eq!(p.records.len(), 1);
        assert_eq!(p.cores.len(), 3, "1 AIC + 2 AIV");
        let rec = &p.records[0];
        assert!(
            w.ts <= rec.start_ns && rec.end_ns <= w.end(),
            "{rec:?} outside {w:?}"
        );
        chip.close().unwrap();
    }
}
