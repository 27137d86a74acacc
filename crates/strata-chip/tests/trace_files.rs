//! Trace files under `output_prefix` never follow a symlink: a link planted under the
//! trace's name is replaced, its target untouched; a directory the runtime creates for
//! traces is private (0700).

use std::os::unix::fs::PermissionsExt;
use strata_chip::*;
use strata_types::CallConfig;

fn chip_with_swimlane() -> (ChipWorker, OrchHandle) {
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    })
    .unwrap();
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

fn swimlane_into(dir: &std::path::Path) -> CallConfig {
    CallConfig {
        swimlane: true,
        output_prefix: Some(dir.to_string_lossy().into_owned()),
        ..CallConfig::default()
    }
}

/// A fresh scratch directory, removed when dropped (also when the test fails).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("strata-chip-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_symlink_planted_under_the_trace_name_is_replaced_not_followed() {
    let scratch = Scratch::new("symlink");
    let victim = scratch.0.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let out = scratch.0.join("out");
    std::fs::create_dir(&out).unwrap();
    let trace = out.join("chip_swimlane.json");
    std::os::unix::fs::symlink(&victim, &trace).unwrap();
    let (mut chip, orch) = chip_with_swimlane();
    for _ in 0..2 {
        let r = chip
            .run(&orch, &mut RunArgs::new(), &swimlane_into(&out))
            .unwrap();
        let json = std::fs::read_to_string(&trace).unwrap();
        assert_eq!(json, r.swimlane.unwrap().to_chrome_json());
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(&trace).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the link was replaced by the trace"
    );
    // Nothing but the trace is left next to it (no temporary file).
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("chip_swimlane.json")]);
    // The public writer does the same.
    std::os::unix::fs::symlink(&victim, out.join("mine.json")).unwrap();
    let r = chip
        .run(&orch, &mut RunArgs::new(), &swimlane_into(&out))
        .unwrap();
    r.swimlane
        .unwrap()
        .write_chrome_json(&out.join("mine.json"))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

#[test]
fn a_trace_directory_the_runtime_creates_is_private() {
    let scratch = Scratch::new("tracedir");
    let out = scratch.0.join("a").join("b");
    let (mut chip, orch) = chip_with_swimlane();
    chip.run(&orch, &mut RunArgs::new(), &swimlane_into(&out))
        .unwrap();
    for d in [&scratch.0.join("a"), &out] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert!(out.join("chip_swimlane.json").is_file());
}
