//! A minimal seccomp filter for tests that must run under a sandbox that refuses a system
//! call (as Docker's or systemd's profiles refuse calls newer than the profile).

/// Offsets into the kernel's `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

/// `AUDIT_ARCH_*` of the architecture this test binary is built for.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xc000_00f3;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Installs, on the **calling thread** (and every thread and process it creates later),
/// a seccomp filter that answers system call `nr` with `-1`/`errno` and allows every
/// other call. Sets `PR_SET_NO_NEW_PRIVS` first (needed without `CAP_SYS_ADMIN`). There
/// is no way back: call it in a forked child or a thread that ends with the test.
///
/// # Errors
/// The `prctl` that failed and its OS error.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
pub fn refuse_syscall(nr: libc::c_long, errno: i32) -> Result<(), String> {
    const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const RET_K: u32 = libc::BPF_RET | libc::BPF_K;
    let program = [
        // A foreign architecture's numbers mean other calls: allow them.
        stmt(LD_W_ABS, ARCH_OFFSET),
        jump(JEQ_K, AUDIT_ARCH, 0, 3),
        stmt(LD_W_ABS, NR_OFFSET),
        jump(JEQ_K, nr as u32, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS only sets a flag on this thread.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "prctl(PR_SET_NO_NEW_PRIVS): {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `prog` points at `program`, a valid classic-BPF program that lives across
    // the call (the kernel copies it); the filter only affects this thread's future calls.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(format!(
            "prctl(PR_SET_SECCOMP): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_call_fails_with_the_given_errno_on_that_thread_only() {
        let on_thread = std::thread::spawn(|| {
            refuse_syscall(libc::SYS_getppid, libc::EPERM)?;
            // SAFETY: getppid has no preconditions.
            let r = unsafe { libc::syscall(libc::SYS_getppid) };
            let e = std::io::Error::last_os_error().raw_os_error();
            Ok::<_, String>((r, e))
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(on_thread, (-1, Some(libc::EPERM)));
        // SAFETY: getppid has no preconditions.
        let here = unsafe { libc::syscall(libc::SYS_getppid) };
        assert!(here > 0, "other threads unaffected");
    }
}
