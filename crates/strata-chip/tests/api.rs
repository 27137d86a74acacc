//! The chip's API contracts: lifecycle, registry identities, device-memory misuse, run
//! staging, kernel failures and timeouts, argument aliasing, STRACE and swimlane output.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_chip::*;
use strata_types::{
    ArgTag, CallConfig, CallableDescriptor, CallableKind, CallbackResult, DataType, ParamDirection,
};

fn cfg() -> ChipConfig {
    ChipConfig {
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    }
}

fn copy_kernel(ctx: &mut KernelCtx) -> CallbackResult {
    let a = ctx.input::<f32>(0)?;
    let mut o = ctx.output::<f32>(1)?;
    o.as_mut_slice()
        .ok_or("contiguous")?
        .copy_from_slice(a.as_slice().ok_or("contiguous")?);
    Ok(())
}

#[test]
fn registry_identity_is_the_descriptor_digest() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let d = CallableDescriptor::new(CallableKind::Kernel, "k");
    let a = chip.register_kernel(d.clone(), copy_kernel).unwrap();
    let b = chip.register_kernel(d.clone(), copy_kernel).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.id(), d.digest());
    let other = chip.register_kernel_fn("k2", copy_kernel).unwrap();
    assert_ne!(other.id(), a.id());
    assert_ne!(other.func_id(), a.func_id());
    // Wrong kind.
    let bad = chip.register_kernel(
        CallableDescriptor::new(CallableKind::SubWorker, "s"),
        copy_kernel,
    );
    assert!(matches!(bad, Err(ChipError::WrongKind { .. })));
    // Unregister, then the id is unknown.
    chip.unregister(&a.id()).unwrap();
    assert!(matches!(
        chip.unregister(&a.id()),
        Err(ChipError::UnknownCallable { .. })
    ));
    // A clone of the registry finds callables by digest.
    let o = chip.register_orchestration_fn("o", |_, _| Ok(())).unwrap();
    let reg = chip.registry().clone();
    assert!(reg.orchestration(&o.id()).is_some());
    assert_eq!(reg.digest(), chip.registry().digest());
    chip.init().unwrap();
    assert!(matches!(
        chip.register_kernel_fn("late", copy_kernel),
        Err(ChipError::RegisterAfterInit { .. })
    ));
    assert!(matches!(chip.init(), Err(ChipError::AlreadyInitialized)));
    chip.close().unwrap();
    assert!(matches!(chip.malloc(16), Err(ChipError::Closed { .. })));
    chip.close().unwrap(); // idempotent
}

/// What the device-memory misuse cases act on: a chip that was never initialised, and an
/// initialised chip with a live allocation, a freed one, a stale handle (freed, its address
/// reused), a freed tensor, an i32 tensor, and a tensor of another chip.
struct Misuse {
    uninit: ChipWorker,
    chip: ChipWorker,
    other: ChipWorker,
    live: DevicePtr,
    freed: DevicePtr,
    stale: DevicePtr,
    freed_tensor: DeviceTensor,
    i32_tensor: DeviceTensor,
    foreign_tensor: DeviceTensor,
    host: Vec<u8>,
}

impl Misuse {
    fn new() -> Self {
        let uninit = ChipWorker::new(cfg()).unwrap();
        let mut chip = ChipWorker::new(cfg()).unwrap();
        chip.init().unwrap();
        let live = chip.malloc(4096).unwrap();
        assert_eq!(live.addr() % DEVICE_ALIGN, 0);
        let host = vec![0u8; 8192];
        // Interior pointers copy fine (but cannot be freed: a case below).
        chip.copy_to(live.offset(1024), &host, 1024, CopyOffsets::default())
            .unwrap();
        // The address of a freed allocation is reused by the next: the old handle is stale.
        let stale = chip.malloc(4096).unwrap();
        chip.free(stale).unwrap();
        let reused = chip.malloc(4096).unwrap();
        assert_eq!(reused.addr(), stale.addr());
        let i32_tensor = chip
            .alloc_tensor(&[2, 3], DataType::I32, TensorInit::value(7i32))
            .unwrap();
        assert_eq!(chip.read_tensor::<i32>(&i32_tensor).unwrap(), vec![7; 6]);
        // Freed last, so no later allocation reuses their addresses.
        let freed_tensor = chip
            .alloc_tensor(&[4], DataType::F32, TensorInit::Zeros)
            .unwrap();
        let freed = chip.malloc(4096).unwrap();
        chip.free_tensor(freed_tensor).unwrap();
        chip.free(freed).unwrap();
        let mut other = ChipWorker::new(cfg()).unwrap();
        other.init().unwrap();
        let foreign_tensor = other
            .alloc_tensor(&[4], DataType::F32, TensorInit::Zeros)
            .unwrap();
        Misuse {
            uninit,
            chip,
            other,
            live,
            freed,
            stale,
            freed_tensor,
            i32_tensor,
            foreign_tensor,
            host,
        }
    }
}

/// One misuse of device memory: what is called, and the typed error it must return.
struct MisuseCase {
    name: &'static str,
    call: fn(&mut Misuse) -> Result<(), ChipError>,
    expect: fn(&ChipError) -> bool,
}

const MISUSE_CASES: &[MisuseCase] = &[
    MisuseCase {
        name: "malloc before init",
        call: |m| m.uninit.malloc(16).map(drop),
        expect: |e| matches!(e, ChipError::NotInitialized { .. }),
    },
    MisuseCase {
        name: "copy longer than the allocation",
        call: |m| {
            m.chip
                .copy_to(m.live, &m.host, 5000, CopyOffsets::default())
        },
        expect: |e| matches!(e, ChipError::OutOfRange { .. }),
    },
    MisuseCase {
        name: "copy past the end from a device offset",
        call: |m| {
            let at = CopyOffsets {
                device: 4000,
                host: 0,
            };
            m.chip.copy_to(m.live, &m.host, 100, at)
        },
        expect: |e| matches!(e, ChipError::OutOfRange { .. }),
    },
    MisuseCase {
        name: "copy to a device offset at the allocation's end (the next allocation starts there)",
        call: |m| {
            let at = CopyOffsets {
                device: 4096,
                host: 0,
            };
            m.chip.copy_to(m.live, &m.host, 16, at)
        },
        expect: |e| matches!(e, ChipError::OutOfRange { size: 4096, .. }),
    },
    MisuseCase {
        name: "copy from a device offset past the allocation's end",
        call: |m| {
            let at = CopyOffsets {
                device: 8192,
                host: 0,
            };
            let mut buf = vec![0u8; 16];
            m.chip.copy_from(&mut buf, m.live, 16, at)
        },
        expect: |e| matches!(e, ChipError::OutOfRange { size: 4096, .. }),
    },
    MisuseCase {
        name: "copy with a saturating device offset",
        call: |m| {
            let at = CopyOffsets {
                device: u64::MAX,
                host: 0,
            };
            let mut buf = vec![0u8; 16];
            m.chip.copy_from(&mut buf, m.live, 16, at)?;
            m.chip.copy_to(m.live, &m.host, 16, at)
        },
        expect: |e| matches!(e, ChipError::OutOfRange { size: 4096, .. }),
    },
    MisuseCase {
        name: "host slice shorter than the copy",
        call: |m| {
            m.chip
                .copy_to(m.live, &m.host[..10], 100, CopyOffsets::default())
        },
        expect: |e| matches!(e, ChipError::HostRange { .. }),
    },
    MisuseCase {
        name: "free of an interior pointer",
        call: |m| m.chip.free(m.live.offset(8)),
        expect: |e| matches!(e, ChipError::InteriorFree { offset: 8, .. }),
    },
    MisuseCase {
        name: "double free",
        call: |m| m.chip.free(m.freed),
        expect: |e| matches!(e, ChipError::DoubleFree { .. }),
    },
    MisuseCase {
        name: "copy through a stale handle",
        call: |m| m.chip.copy_to(m.stale, &m.host, 16, CopyOffsets::default()),
        expect: |e| matches!(e, ChipError::StaleHandle { .. }),
    },
    MisuseCase {
        name: "free of a stale handle",
        call: |m| m.chip.free(m.stale),
        expect: |e| matches!(e, ChipError::StaleHandle { .. }),
    },
    MisuseCase {
        name: "free of another chip's tensor",
        call: |m| m.chip.free_tensor(m.foreign_tensor),
        expect: |e| matches!(e, ChipError::ForeignHandle { .. }),
    },
    MisuseCase {
        name: "read of another chip's tensor",
        call: |m| m.chip.read_tensor::<f32>(&m.foreign_tensor).map(drop),
        expect: |e| matches!(e, ChipError::ForeignHandle { .. }),
    },
    MisuseCase {
        name: "zero-sized malloc",
        call: |m| m.chip.malloc(0).map(drop),
        expect: |e| matches!(e, ChipError::ZeroSizedAlloc),
    },
    MisuseCase {
        name: "malloc beyond the device memory",
        call: |m| m.chip.malloc(1 << 40).map(drop),
        expect: |e| matches!(e, ChipError::OutOfDeviceMemory { .. }),
    },
    MisuseCase {
        name: "read of an i32 tensor as f32",
        call: |m| m.chip.read_tensor::<f32>(&m.i32_tensor).map(drop),
        expect: |e| matches!(e, ChipError::DtypeMismatch { .. }),
    },
    MisuseCase {
        name: "an i32 initial value for an f32 tensor",
        call: |m| {
            m.chip
                .alloc_tensor(&[2], DataType::F32, TensorInit::value(1i32))
                .map(drop)
        },
        expect: |e| matches!(e, ChipError::DtypeMismatch { .. }),
    },
    MisuseCase {
        name: "double free of a tensor",
        call: |m| m.chip.free_tensor(m.freed_tensor),
        expect: |e| matches!(e, ChipError::DoubleFree { .. }),
    },
];

#[test]
fn memory_misuse_is_typed() {
    let mut m = Misuse::new();
    for case in MISUSE_CASES {
        match (case.call)(&mut m) {
            Err(e) if (case.expect)(&e) => {}
            Err(e) => panic!("{}: unexpected error {e:?}", case.name),
            Ok(()) => panic!("{}: succeeded", case.name),
        }
    }
    // The failed calls changed nothing: the live handles still work.
    m.chip.free_tensor(m.i32_tensor).unwrap();
    m.chip.free(m.live).unwrap();
    m.other.close().unwrap();
}

#[test]
fn committed_memory_tracks_allocations() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    chip.init().unwrap();
    let c0 = chip.committed_device_memory().unwrap();
    let p = chip.malloc(100_000).unwrap();
    let c1 = chip.committed_device_memory().unwrap();
    assert!(c1 >= c0 + 100_000);
    chip.free(p).unwrap();
    assert_eq!(chip.committed_device_memory().unwrap(), c0);
}

#[test]
fn device_memory_info_models_the_cards_capacity() {
    // A 512 MiB card (room for the default ring heaps); its first 64 KiB are a guard.
    let mut chip = ChipWorker::new(ChipConfig {
        device_memory_bytes: 1 << 29,
        ..cfg()
    })
    .unwrap();
    chip.init().unwrap();
    let (free0, total) = chip.device_memory_info().unwrap();
    assert_eq!(total, 1 << 29);
    assert_eq!(free0, (1 << 29) - 64 * 1024);
    // 1000 bytes take one 1024-byte block.
    let a = chip.malloc(1000).unwrap();
    assert_eq!(chip.device_memory_info().unwrap(), (free0 - 1024, total));
    // What is left can be taken in one piece, and then nothing more.
    let rest = chip.malloc(free0 - 1024).unwrap();
    assert_eq!(chip.device_memory_info().unwrap(), (0, total));
    assert!(matches!(
        chip.malloc(1),
        Err(ChipError::OutOfDeviceMemory { capacity, .. }) if capacity == 1 << 29
    ));
    chip.free(a).unwrap();
    chip.free(rest).unwrap();
    assert_eq!(chip.device_memory_info().unwrap(), (free0, total));
}

#[test]
fn device_tensors_stay_resident_and_host_outputs_copy_back() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let inc = chip
        .register_kernel_fn("inc", |ctx| {
            let mut t = ctx.output::<f32>(0)?;
            for v in t.as_mut_slice().ok_or("contiguous")? {
                *v += 1.0;
            }
            Ok(())
        })
        .unwrap();
    let copy = chip.register_kernel_fn("copy", copy_kernel).unwrap();
    let orch = chip
        .register_orchestration(
            CallableDescriptor::new(CallableKind::ChipOrchestration, "inc_then_copy")
                .with_signature(&[ParamDirection::InOut, ParamDirection::Out]),
            move |o, args| {
                let (d, out) = (args.tensor(0)?, args.tensor(1)?);
                o.submit_aiv(inc, CoreArgs::new().inout(&d))?;
                o.submit_aiv(copy, CoreArgs::new().input(&d).output(&out))?;
                Ok(())
            },
        )
        .unwrap();
    chip.init().unwrap();
    let t = chip
        .alloc_tensor(&[256], DataType::F32, TensorInit::value(0.0f32))
        .unwrap();
    for round in 1..=3 {
        let mut out = vec![0f32; 256];
        let mut args = RunArgs::new();
        args.device(&t, ArgTag::InOut).output(&mut out, &[256]);
        chip.run(&orch, &mut args, &CallConfig::default()).unwrap();
        assert!(out.iter().all(|&v| v == round as f32), "round {round}");
    }
    assert_eq!(chip.read_tensor::<f32>(&t).unwrap(), vec![3.0; 256]);
    // Signature mismatch is caught before anything runs.
    let mut out = vec![0f32; 256];
    let mut args = RunArgs::new();
    args.device(&t, ArgTag::Input).output(&mut out, &[256]);
    assert!(matches!(
        chip.run(&orch, &mut args, &CallConfig::default()),
        Err(ChipError::InvalidRunArgs(_))
    ));
    // Bad host shapes are reported at run.
    let mut short = vec![0f32; 3];
    let mut args = RunArgs::new();
    args.inout(&mut short, &[4]);
    assert!(matches!(
        chip.run(&orch, &mut args, &CallConfig::default()),
        Err(ChipError::InvalidRunArgs(_))
    ));
    // A freed device tensor is rejected at bind.
    chip.free_tensor(t).unwrap();
    let mut args = RunArgs::new();
    args.device(&t, ArgTag::InOut).output(&mut out, &[256]);
    assert!(matches!(
        chip.run(&orch, &mut args, &CallConfig::default()),
        Err(ChipError::DoubleFree { .. })
    ));
}

#[test]
fn empty_run_completes_and_traces_nest() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let orch = chip
        .register_orchestration_fn("nothing", |_, _| Ok(()))
        .unwrap();
    chip.init().unwrap();
    let r = chip
        .run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert_eq!((r.tasks, r.dispatches), (0, 0));
    let spans = parse_strace(&r.strace());
    assert_eq!(spans, r.spans());
    let roots = span_tree(&spans);
    assert_eq!(roots.len(), 1);
    let root = &roots[0];
    assert_eq!(root.span.name, "chip.run");
    for name in [
        "chip.run.bind",
        "chip.run.runner_run",
        "chip.run.validate",
        "chip.run.runner_run.device_wall",
    ] {
        let s = root
            .find(name)
            .unwrap_or_else(|| panic!("{name} missing:\n{}", root.render()));
        assert!(s.span.dur > 0, "{name}");
    }
    // Host children lie inside their parent.
    for c in &root.children {
        assert!(
            c.span.ts >= root.span.ts && c.span.ts + c.span.dur <= root.span.ts + root.span.dur
        );
    }
}

#[test]
fn kernel_errors_and_panics_fail_the_run_with_the_kernel_name_and_poison_downstream() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r2 = ran.clone();
    let boom = chip
        .register_kernel_fn("boom", |_| panic!("index 9 out of range"))
        .unwrap();
    let after = chip
        .register_kernel_fn("after", move |_| {
            r2.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    let copy = chip.register_kernel_fn("copy", copy_kernel).unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o, args| {
            let x = args.tensor(0)?;
            o.submit_aiv(boom, CoreArgs::new().inout(&x))?;
            let _ = o.submit_aiv(after, CoreArgs::new().input(&x));
            Ok(())
        })
        .unwrap();
    let good = chip
        .register_orchestration_fn("good", move |o, args| {
            o.submit_aiv(
                copy,
                CoreArgs::new()
                    .input(&args.tensor(0)?)
                    .output(&args.tensor(1)?),
            )?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let mut x = vec![5f32; 8];
    let mut args = RunArgs::new();
    args.inout(&mut x, &[8]);
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
    match &e {
        ChipError::KernelFailed {
            kernel, message, ..
        } => {
            assert_eq!(kernel, "boom");
            assert!(message.contains("index 9 out of range"), "{message}");
        }
        e => panic!("unexpected {e}"),
    }
    assert_eq!(e.code(), Some(codes::KERNEL_FAILED));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "downstream of a failed task must not run"
    );
    // The chip stays usable.
    let a = vec![1f32; 8];
    let mut out = vec![0f32; 8];
    let mut args = RunArgs::new();
    args.input(&a, &[8]).output(&mut out, &[8]);
    chip.run(&good, &mut args, &CallConfig::default()).unwrap();
    assert_eq!(out, a);
}

#[test]
fn kernel_access_rules_are_enforced() {
    let mut chip = ChipWorker::new(ChipConfig {
        aiv_cores: 4,
        ..cfg()
    })
    .unwrap();
    let wrong_type = chip
        .register_kernel_fn("wrong_type", |ctx| {
            ctx.input::<i32>(0)?;
            Ok(())
        })
        .unwrap();
    let read_output = chip
        .register_kernel_fn("read_output", |ctx| {
            ctx.input::<f32>(1)?;
            Ok(())
        })
        .unwrap();
    let write_input = chip
        .register_kernel_fn("write_input", |ctx| {
            ctx.output::<f32>(0)?;
            Ok(())
        })
        .unwrap();
    let twice = chip
        .register_kernel_fn("twice", |ctx| {
            let _a = ctx.output::<f32>(1)?;
            ctx.output::<f32>(1)?;
            Ok(())
        })
        .unwrap();
    let blocks_exclusive = chip
        .register_kernel_fn("blocks_exclusive", |ctx| {
            let _o = ctx.output::<f32>(1)?;
            // Keep the claim while the sibling blocks try theirs.
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        })
        .unwrap();
    let nodep = chip
        .register_kernel_fn("nodep", |ctx| {
            ctx.shared::<f32>(0)?;
            Ok(())
        })
        .unwrap();
    let which =
        |o: &mut ChipOrch, k: KernelHandle, args: &ChipArgs, blocks: u32| -> CallbackResult {
            let (a, b) = (args.tensor(0)?, args.tensor(1)?);
            o.submit_aiv(k, CoreArgs::new().input(&a).output(&b).block_num(blocks))?;
            Ok(())
        };
    let mut orchs = vec![];
    for (k, blocks) in [
        (wrong_type, 1),
        (read_output, 1),
        (write_input, 1),
        (twice, 1),
        (blocks_exclusive, 3),
    ] {
        orchs.push(
            chip.register_orchestration_fn(&format!("o{}", k.func_id()), move |o, a| {
                which(o, k, a, blocks)
            })
            .unwrap(),
        );
    }
    let nodep_orch = chip
        .register_orchestration_fn("nodep", move |o, args| {
            o.submit_aiv(nodep, CoreArgs::new().no_dep(&args.tensor(0)?))?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let expect = [
        "not i32",
        "use ctx.output",
        "read-only",
        "already borrowed",
        "held exclusively",
    ];
    for (orch, want) in orchs.iter().zip(expect) {
        let a = vec![0f32; 8];
        let mut b = vec![0f32; 8];
        let mut args = RunArgs::new();
        args.input(&a, &[8]).output(&mut b, &[8]);
        let e = chip
            .run(orch, &mut args, &CallConfig::default())
            .unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    let a = vec![0f32; 8];
    let mut args = RunArgs::new();
    args.input(&a, &[8]);
    let e = chip
        .run(&nodep_orch, &mut args, &CallConfig::default())
        .unwrap_err();
    assert!(e.to_string().contains("untracked"), "{e}");
}

#[test]
fn aliasing_arguments_are_invalid_args() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let k = chip.register_kernel_fn("k", copy_kernel).unwrap();
    let orch = chip
        .register_orchestration_fn("alias", move |o, args| {
            let x = args.tensor(0)?;
            // Disjoint halves are fine.
            o.submit_aiv(
                k,
                CoreArgs::new()
                    .input(&x.slice(0, 0, 4)?)
                    .output(&x.slice(0, 4, 8)?),
            )?;
            // Overlapping views of one buffer, one written: rejected.
            o.submit_aiv(
                k,
                CoreArgs::new()
                    .input(&x.slice(0, 0, 6)?)
                    .output(&x.slice(0, 2, 8)?),
            )?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let mut x = vec![0f32; 8];
    let mut args = RunArgs::new();
    args.inout(&mut x, &[8]);
    let e = chip
        .run(&orch, &mut args, &CallConfig::default())
        .unwrap_err();
    assert_eq!(e.code(), Some(codes::INVALID_ARGS), "{e}");
    assert!(e.to_string().contains("overlap"), "{e}");
}

#[test]
fn builder_misuse_and_missing_cores_are_invalid_args() {
    let mut chip = ChipWorker::new(ChipConfig {
        aic_cores: 0,
        aiv_cores: 2,
        ..cfg()
    })
    .unwrap();
    let k = chip.register_kernel_fn("k", |_| Ok(())).unwrap();
    let scalar_first = chip
        .register_orchestration_fn("scalar_first", move |o, args| {
            o.submit_aiv(k, CoreArgs::new().scalar(1u32).input(&args.tensor(0)?))?;
            Ok(())
        })
        .unwrap();
    let too_many = chip
        .register_orchestration_fn("too_many", move |o, _| {
            let mut a = CoreArgs::new();
            for i in 0..17u32 {
                a.scalar(i);
            }
            o.submit_aiv(k, &a)?;
            Ok(())
        })
        .unwrap();
    let no_aic = chip
        .register_orchestration_fn("no_aic", move |o, _| {
            o.submit_aic(k, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    let unknown = chip
        .register_orchestration_fn("unknown", move |o, _| {
            o.submit_aiv(999u32, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    for (orch, want) in [
        (scalar_first, "before the first scalar"),
        (too_many, "more than 16"),
        (no_aic, "AIC core"),
        (unknown, "func_id 999"),
    ] {
        let x = vec![0f32; 4];
        let mut args = RunArgs::new();
        args.input(&x, &[4]);
        let e = chip
            .run(&orch, &mut args, &CallConfig::default())
            .unwrap_err();
        assert_eq!(e.code(), Some(codes::INVALID_ARGS), "{e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
}

/// A change to a configuration that makes it invalid.
type Change<T> = fn(&mut T);

#[test]
fn invalid_call_config_is_rejected_with_the_reference_message() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let orch = chip.register_orchestration_fn("o", |_, _| Ok(())).unwrap();
    chip.init().unwrap();
    // (what is changed in a run's CallConfig, words of the error)
    let bad_calls: [(Change<CallConfig>, &str); 2] = [
        (
            |c| c.rings[2].task_window = Some(100),
            "ring 2 task_window = 100",
        ),
        (|c| c.rings[0].heap_bytes = Some(10), ">= 1024"),
    ];
    for (change, want) in bad_calls {
        let mut c = CallConfig::default();
        change(&mut c);
        let e = chip.run(&orch, &mut RunArgs::new(), &c).unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    // (what is changed in a ChipConfig, words of the error)
    let bad_chips: [(Change<ChipConfig>, &str); 2] = [
        (|c| c.rings[1].dep_pool = 2, "ring 1 dep_pool = 2"),
        (|c| c.aiv_cores = 49, "aiv"),
    ];
    for (change, want) in bad_chips {
        let mut c = cfg();
        change(&mut c);
        let e = ChipWorker::new(c).unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
}

#[test]
fn swimlane_records_every_invocation_and_exports_chrome_json() {
    let mut chip = ChipWorker::new(ChipConfig::clusters(2)).unwrap();
    let k = chip.register_kernel_fn("spin", |_| Ok(())).unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o, _| {
            for _ in 0..10 {
                o.submit_aiv(k, CoreArgs::new().block_num(3))?;
            }
            o.submit(
                MixedKernels::none().with_aic(k).with_aiv0(k).with_aiv1(k),
                &CoreArgs::new(),
            )?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let dir = std::env::temp_dir().join(format!("strata-chip-swim-{}", std::process::id()));
    let c = CallConfig {
        swimlane: true,
        output_prefix: Some(dir.to_string_lossy().into_owned()),
        ..CallConfig::default()
    };
    let r = chip.run(&orch, &mut RunArgs::new(), &c).unwrap();
    let s = r.swimlane.unwrap();
    assert_eq!(s.records.len(), 33);
    assert_eq!(r.dispatches, 33);
    for rec in &s.records {
        assert!(rec.end_ns >= rec.start_ns);
        assert_eq!(rec.kernel, "spin");
        assert_eq!(s.core_types[rec.core as usize], rec.core_type);
    }
    let json = std::fs::read_to_string(dir.join("chip_swimlane.json")).unwrap();
    assert_eq!(json, s.to_chrome_json());
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 33);
    std::fs::remove_dir_all(&dir).unwrap();
    // Without swimlane there are no records.
    assert!(chip
        .run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap()
        .swimlane
        .is_none());
}

#[test]
fn a_kernel_that_ignores_cancellation_does_not_hang_run_or_close() {
    let mut chip = ChipWorker::new(ChipConfig {
        aiv_cores: 2,
        ..cfg()
    })
    .unwrap();
    let release = Arc::new(AtomicUsize::new(0));
    let rel = release.clone();
    let stuck = chip
        .register_kernel_fn("stuck", move |_| {
            // Ignores ctx.cancelled(); only the test can release it.
            until_opened(&rel);
            Ok(())
        })
        .unwrap();
    let noop = chip.register_kernel_fn("noop", |_| Ok(())).unwrap();
    let hang = chip
        .register_orchestration_fn("hang", move |o, _| {
            o.submit_aiv(stuck, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    let ok = chip
        .register_orchestration_fn("ok", move |o, _| {
            for _ in 0..4 {
                o.submit_aiv(noop, &CoreArgs::new())?;
            }
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let c = CallConfig::default().with_timeout(Duration::from_millis(100));
    let e = chip.run(&hang, &mut RunArgs::new(), &c).unwrap_err();
    assert!(
        matches!(e, ChipError::KernelTimeout { ref kernel, .. } if kernel == "stuck"),
        "{e}"
    );
    assert_eq!(e.code(), Some(codes::SCHEDULER_TIMEOUT));
    assert_eq!(chip.lost_cores().len(), 1);
    // One AIV core is left: the chip still runs AIV work.
    let r = chip
        .run(&ok, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert_eq!(r.tasks, 4);
    // close() detaches the stuck core instead of blocking.
    chip.close().unwrap();
    release.store(1, Ordering::SeqCst);
}

#[test]
fn a_cooperative_kernel_is_cancelled_and_its_core_returns_to_service() {
    let mut chip = ChipWorker::new(ChipConfig {
        aiv_cores: 1,
        aic_cores: 0,
        ..cfg()
    })
    .unwrap();
    let slow = chip
        .register_kernel_fn("slow", |ctx| {
            while !ctx.cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err("stopped".into())
        })
        .unwrap();
    let noop = chip.register_kernel_fn("noop", |_| Ok(())).unwrap();
    let o1 = chip
        .register_orchestration_fn("slow", move |o, _| {
            o.submit_aiv(slow, &CoreArgs::new())?;
            o.submit_aiv(noop, &CoreArgs::new())?; // queued behind it on the only core
            Ok(())
        })
        .unwrap();
    let o2 = chip
        .register_orchestration_fn("fast", move |o, _| {
            o.submit_aiv(noop, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let c = CallConfig::default().with_timeout(Duration::from_millis(100));
    let e = chip.run(&o1, &mut RunArgs::new(), &c).unwrap_err();
    assert_eq!(e.code(), Some(codes::SCHEDULER_TIMEOUT), "{e}");
    // The core comes back once its kernel noticed the cancellation.
    let t = std::time::Instant::now();
    while !chip.lost_cores().is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    chip.run(&o2, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert!(chip.lost_cores().is_empty());
}

#[test]
fn a_stuck_orchestration_makes_the_chip_unusable_without_hanging() {
    let mut small = cfg();
    small.tensor_wait_timeout = Duration::from_millis(50);
    small.ring_wait_timeout = Duration::from_millis(50);
    let mut chip = ChipWorker::new(small).unwrap();
    let gate = Arc::new(AtomicUsize::new(0));
    let g = gate.clone();
    let orch = chip
        .register_orchestration_fn("spins", move |_, _| {
            until_opened(&g);
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let c = CallConfig::default().with_timeout(Duration::from_millis(50));
    let e = chip.run(&orch, &mut RunArgs::new(), &c).unwrap_err();
    assert_eq!(e.code(), Some(codes::SCHEDULER_TIMEOUT), "{e}");
    assert!(matches!(
        chip.run(&orch, &mut RunArgs::new(), &c),
        Err(ChipError::Unusable(_))
    ));
    chip.close().unwrap();
    gate.store(1, Ordering::SeqCst);
}

/// Blocks the calling kernel or orchestration until the test opens `gate` (sets it
/// non-zero).
fn until_opened(gate: &AtomicUsize) {
    while gate.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// An orchestration that submitted a kernel and then never returns: the starvation
/// error carries what its tasks were doing — the kernel running on its core.
#[test]
fn a_stuck_orchestration_reports_what_its_tasks_were_doing() {
    let mut small = cfg();
    small.aiv_cores = 1;
    small.aic_cores = 0;
    small.tensor_wait_timeout = Duration::from_millis(50);
    small.ring_wait_timeout = Duration::from_millis(50);
    let mut chip = ChipWorker::new(small).unwrap();
    let gate = Arc::new(AtomicUsize::new(0));
    let (g, k) = (gate.clone(), gate.clone());
    let busy = chip
        .register_kernel_fn("busy", move |_| {
            until_opened(&k);
            Ok(())
        })
        .unwrap();
    let orch = chip
        .register_orchestration_fn("submits_then_spins", move |o, _| {
            o.submit_aiv(busy, &CoreArgs::new())?;
            until_opened(&g);
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let c = CallConfig::default().with_timeout(Duration::from_millis(50));
    let e = chip.run(&orch, &mut RunArgs::new(), &c).unwrap_err();
    assert_eq!(e.code(), Some(codes::SCHEDULER_TIMEOUT), "{e}");
    let w = e
        .wait_for()
        .unwrap_or_else(|| panic!("no wait-for state: {e}"));
    assert!(
        w.running
            .iter()
            .any(|r| r.name.ends_with("busy") && r.on == strata_types::Executor::Core(0)),
        "the busy kernel is shown running on core 0: {w}"
    );
    gate.store(1, Ordering::SeqCst);
    chip.close().unwrap();
}

#[test]
fn comm_context_reaches_kernels() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let k = chip
        .register_kernel_fn("rank", move |ctx| {
            let rank = ctx.comm::<(u32, u32)>().ok_or("no comm context")?;
            s.store(rank.0 as usize * 10 + rank.1 as usize, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o, _| {
            o.submit_aiv(k, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    assert!(chip
        .run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .is_err());
    chip.set_comm_context(Some(Arc::new((3u32, 4u32))));
    chip.run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 34);
}

#[test]
fn an_idle_chip_parks_its_threads() {
    // Only this chip's threads are measured (by name), so concurrent tests do not count.
    // Spinning, its 7 threads would burn ~2 CPUs × 400 ms; parked they use (almost)
    // nothing. The bound is loose on purpose.
    let cfg = ChipConfig {
        chip_id: 4242,
        ..ChipConfig::clusters(2)
    };
    let used = strata_fixtures::idle_cpu(cfg, Duration::from_millis(400)).unwrap();
    assert!(
        used < Duration::from_millis(150),
        "idle chip used {used:?} of CPU in 400 ms"
    );
}

#[test]
fn orchestration_errors_and_panics_are_reported() {
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let err = chip
        .register_orchestration_fn("err", |_, _| {
            Err(ChipError::InvalidRunArgs("custom".into()).into())
        })
        .unwrap();
    let panics = chip
        .register_orchestration_fn("panics", |_, _| panic!("oops"))
        .unwrap();
    let unclosed = chip
        .register_orchestration_fn("unclosed", |o, _| {
            o.scope_begin()?;
            o.scope_begin()?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let e = chip
        .run(&err, &mut RunArgs::new(), &CallConfig::default())
        .unwrap_err();
    assert!(
        matches!(e, ChipError::OrchestrationFailed { ref message, .. } if message.contains("custom")),
        "{e}"
    );
    let e = chip
        .run(&panics, &mut RunArgs::new(), &CallConfig::default())
        .unwrap_err();
    assert!(e.to_string().contains("oops"), "{e}");
    // Scopes left open are closed by the run.
    chip.run(&unclosed, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert!(matches!(
        chip.run(
            &OrchHandle::from_id(strata_types::CallableId([1; 32])),
            &mut RunArgs::new(),
            &CallConfig::default()
        ),
        Err(ChipError::UnknownCallable { .. })
    ));
}

#[test]
fn empty_and_busy_runs_interleave_with_their_own_reports() {
    // An empty run never involves the scheduler (no Begin/End hand-off); a run with tasks
    // must still get exactly its own scheduler report, swimlane and dispatch count.
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let k = chip.register_kernel_fn("k", |_| Ok(())).unwrap();
    let empty = chip
        .register_orchestration_fn("empty", |_, _| Ok(()))
        .unwrap();
    let n_tasks = chip
        .register_orchestration_fn("n", move |o, args| {
            for _ in 0..args.scalar::<u32>(0)? {
                o.submit_aiv(k, &CoreArgs::new())?;
            }
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let swim = CallConfig {
        swimlane: true,
        ..CallConfig::default()
    };
    for round in 0..50u32 {
        let n = 1 + round % 3;
        let r = chip.run(&n_tasks, RunArgs::new().scalar(n), &swim).unwrap();
        assert_eq!((r.tasks, r.dispatches), (n as u64, n as u64));
        assert_eq!(r.swimlane.as_ref().unwrap().records.len(), n as usize);
        assert!(r
            .spans()
            .iter()
            .any(|s| s.name == "chip.run.runner_run.device_wall.sched"));
        let r = chip.run(&empty, &mut RunArgs::new(), &swim).unwrap();
        assert_eq!((r.tasks, r.dispatches), (0, 0));
        assert!(r.swimlane.as_ref().unwrap().records.is_empty());
        assert!(!r
            .spans()
            .iter()
            .any(|s| s.name == "chip.run.runner_run.device_wall.sched"));
        let r = chip
            .run(
                &n_tasks,
                RunArgs::new().scalar(2u32),
                &CallConfig::default(),
            )
            .unwrap();
        assert_eq!(r.dispatches, 2);
        assert!(r.swimlane.is_none());
    }
    assert!(RunReport::default().spans().is_empty());
    assert!(RunReport::default().strace().is_empty());
}

#[test]
fn runs_from_changing_threads_wake_a_parked_caller() {
    // The caller of `run` may differ from run to run, and a caller whose run outlasts its
    // spin parks: the reply must wake whichever thread is waiting.
    let mut chip = ChipWorker::new(cfg()).unwrap();
    let slow = chip
        .register_kernel_fn("slow", |_| {
            std::thread::sleep(Duration::from_millis(3));
            Ok(())
        })
        .unwrap();
    let orch = chip
        .register_orchestration_fn("o", move |o, args| {
            if args.scalar::<u32>(0)? == 1 {
                o.submit_aiv(slow, &CoreArgs::new())?;
            }
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    for i in 0..20u32 {
        chip = std::thread::spawn(move || {
            let r = chip
                .run(&orch, RunArgs::new().scalar(i % 2), &CallConfig::default())
                .unwrap();
            assert_eq!(r.dispatches, u64::from(i % 2));
            if i % 4 == 0 {
                // Long enough for the orchestrator thread to park between runs.
                std::thread::sleep(Duration::from_millis(2));
            }
            chip
        })
        .join()
        .unwrap();
    }
    chip.close().unwrap();
}

#[test]
fn a_chip_parks_after_back_to_back_runs() {
    // Runs hand over by spinning; once they stop, every thread of the chip parks.
    let config = ChipConfig {
        chip_id: 4343,
        ..cfg()
    };
    let mut chip = ChipWorker::new(config).unwrap();
    let k = chip.register_kernel_fn("k", |_| Ok(())).unwrap();
    let empty = chip
        .register_orchestration_fn("empty", |_, _| Ok(()))
        .unwrap();
    let one = chip
        .register_orchestration_fn("one", move |o, _| {
            o.submit_aiv(k, &CoreArgs::new())?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    for i in 0..2000 {
        let orch = if i % 10 == 0 { &one } else { &empty };
        chip.run(orch, &mut RunArgs::new(), &CallConfig::default())
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let before = strata_testkit::threads_cpu_ns("chip4343-");
    std::thread::sleep(Duration::from_millis(400));
    let used =
        Duration::from_nanos(strata_testkit::threads_cpu_ns("chip4343-").saturating_sub(before));
    assert!(
        used < Duration::from_millis(150),
        "the chip used {used:?} of CPU in 400 ms after its runs"
    );
    chip.close().unwrap();
}

/// A task of many blocks may run longer than the stall budget of the run (twice the
/// longest timeout plus a second) while every block stays within the kernel timeout:
/// finished blocks count as progress, so the run succeeds instead of being declared stuck.
#[test]
fn a_many_block_task_longer_than_the_stall_budget_is_not_a_stall() {
    let small = ChipConfig {
        kernel_timeout: Duration::from_millis(100),
        tensor_wait_timeout: Duration::from_millis(100),
        ring_wait_timeout: Duration::from_millis(100),
        ..cfg()
    };
    let mut chip = ChipWorker::new(small).unwrap();
    let blocks = Arc::new(AtomicUsize::new(0));
    let b = blocks.clone();
    let k = chip
        .register_kernel_fn("slow_block", move |_| {
            std::thread::sleep(Duration::from_millis(40));
            b.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    let orch = chip
        .register_orchestration_fn("many_blocks", move |o, _| {
            // 96 blocks × 40 ms on 2 AIV cores ≈ 1.9 s > the 1.2 s budget.
            o.submit_aiv(k, CoreArgs::new().block_num(96))?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    chip.run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap();
    assert_eq!(blocks.load(Ordering::SeqCst), 96);
    chip.close().unwrap();
}

#[test]
fn task_args_with_a_recorded_invalid_argument_are_refused_before_anything_is_mapped() {
    use strata_types::{
        ArgSlot, BufferDesc, BufferLocation, IdentityMinter, TaskArgs, TensorView, TypesError,
    };
    let chip = ChipWorker::new(cfg()).unwrap();
    // SAFETY: the descriptor is never mapped: the conversion refuses the arguments first.
    let buf = unsafe {
        BufferDesc::from_parts(
            IdentityMinter::new().mint(),
            64,
            BufferLocation::HostShared {
                region: 1,
                offset: 0,
            },
        )
    };
    let view = TensorView::contiguous(DataType::F32, &[16]).unwrap();
    let whole = strata_types::BufferView::new(buf, view).unwrap();
    let args = TaskArgs::new().input(whole).output(whole.slice(0, 8, 20));
    let mapped = std::cell::Cell::new(0);
    // SAFETY: `map_shared` returns no pointer (it is not even called).
    let got = unsafe {
        RunArgs::from_task_args(&args, &chip, None, |_, _, _| {
            mapped.set(mapped.get() + 1);
            Err("not mapped".into())
        })
    };
    match got {
        Err(TaskArgsError::Invalid(TypesError::InvalidArgument { slot, reason })) => {
            assert_eq!(slot, ArgSlot::Tensor(1));
            assert!(matches!(*reason, TypesError::RangeOutOfBounds { .. }));
        }
        Err(e) => panic!("expected TaskArgsError::Invalid, got {e}"),
        Ok(_) => panic!("arguments with a recorded error were accepted"),
    }
    assert_eq!(mapped.get(), 0);
}
