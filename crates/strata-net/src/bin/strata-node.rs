//! `strata-node`: the node daemon and the job launcher of strata's network layer.
//! Run `strata-node --help` for what each command and flag does.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use strata_net::daemon::{run, DaemonConfig};
use strata_net::launch::{program_env, LaunchOptions};
use strata_net::Secret;

const HELP: &str = "\
strata-node: run strata level-3 workers for a level-4 root on another host.

USAGE:
  strata-node serve --listen ADDR:PORT --secret-file PATH --program PATH [--program PATH ...]
                    [--handshake-timeout SECS] [--drain-timeout SECS] [--max-sessions N]
  strata-node launch [--transport tcp|mpi] [--root HOST] [--port PORT] [--secret-file PATH]
                     -- PROGRAM [ARGS...]
  strata-node --help

serve: a long-lived daemon that accepts sessions from level-4 roots
  (strata_net::add_remote_worker). Each session names a program by its ELF build-id; the
  daemon starts that program (with the root's arguments) in a new process group, hands
  it the authenticated connection, and the program serves as the root's remote level-3
  worker until the root shuts it down.
  --listen ADDR:PORT        where to accept sessions: 0.0.0.0:7070, [::]:7070 (IPv6),
                            127.0.0.1:7070; port 0 picks a free port (printed).
  --secret-file PATH        the secret roots must prove (HMAC challenge-response; it never
                            crosses the wire). The file must not be readable by group or
                            others (chmod 600), else the daemon refuses to start.
                            Roots use the same secret (RemoteSpec::secret_file or
                            STRATA_SECRET_FILE).
  --program PATH            an executable sessions may start, identified by its build-id;
                            repeat for several. A session asking for another build is
                            refused with a message saying so.
  --handshake-timeout SECS  how long a connection may take to authenticate; a client that
                            connects and sends nothing is dropped then (default 5).
  --drain-timeout SECS      on SIGTERM/SIGINT: how long running sessions get to end
                            (their roots are told why) before their process groups are
                            killed (default 10).
  --max-sessions N          sessions served at once; more are refused (default 64).

launch: start PROGRAM as one rank of a job that mpirun (Open MPI: OMPI_COMM_WORLD_RANK/
  _SIZE), a PMI launcher (PMI_RANK/PMI_SIZE) or Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
  SLURM_STEP_NODELIST, host lists like node[01-04,07]) started. Rank 0 becomes the
  level-4 root; every other rank serves as one of its remote level-3 workers
  (strata_net::add_launched_workers). The ranks find rank 0 and share the job's secret
  without anyone writing them: rank 0 listens on a port derived from the job id, on the
  first Slurm node or mpirun's host (loopback for a one-host job); the secret is derived
  from a per-job value of the launcher or from ~/.strata/secret (created 0600).
  --transport tcp|mpi       how the sessions travel: TCP to rank 0's port (default), or
                            MPI messages between the ranks (mpirun only; the program and
                            this binary built with strata-net's `mpi` feature).
  --root HOST               rank 0's host, when the launcher cannot tell it.
  --port PORT               the rendezvous port, instead of the job-derived one.
  --secret-file PATH        use this secret (mode 600) instead of the derived one.
  -- PROGRAM [ARGS...]      the program every rank runs (the same on every host).

  Examples:
    mpirun -n 3 strata-node launch -- ./my_job --size 1024
    mpirun -n 3 strata-node launch --transport mpi -- ./my_job --size 1024
    srun -N 2 -n 2 strata-node launch -- ./my_job
";

fn value<'a>(args: &'a [String], i: &mut usize, flag: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{flag} needs a value (see --help)"))
}

fn secs(v: &str, flag: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag} {v:?} is not a number of seconds"))
}

fn serve(args: &[String]) -> Result<(), String> {
    let (mut listen, mut secret, mut programs) = (None, None, Vec::new());
    let (mut handshake, mut drain, mut max) =
        (Duration::from_secs(5), Duration::from_secs(10), 64usize);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--listen" => listen = Some(value(args, &mut i, "--listen")?.to_owned()),
            "--secret-file" => secret = Some(PathBuf::from(value(args, &mut i, "--secret-file")?)),
            "--program" => programs.push(PathBuf::from(value(args, &mut i, "--program")?)),
            "--handshake-timeout" => {
                handshake = secs(
                    value(args, &mut i, "--handshake-timeout")?,
                    "--handshake-timeout",
                )?
            }
            "--drain-timeout" => {
                drain = secs(value(args, &mut i, "--drain-timeout")?, "--drain-timeout")?
            }
            "--max-sessions" => {
                max = value(args, &mut i, "--max-sessions")?
                    .parse()
                    .map_err(|_| "--max-sessions needs a number".to_string())?
            }
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("serve: unknown argument {other:?} (see --help)")),
        }
        i += 1;
    }
    let listen = listen.ok_or("serve needs --listen ADDR:PORT (see --help)")?;
    let secret_file = secret.ok_or("serve needs --secret-file PATH (see --help)")?;
    let secret = Secret::from_file(&secret_file).map_err(|e| e.to_string())?;
    if programs.is_empty() {
        return Err("serve needs at least one --program PATH: the executables sessions may start (see --help)".into());
    }
    let config = DaemonConfig {
        listen,
        secret,
        programs,
        handshake_timeout: handshake,
        drain_timeout: drain,
        max_sessions: max,
    };
    run(config, |addr| {
        // One machine-readable line for scripts and tests that bind port 0.
        println!("listening {addr}");
    })
    .map_err(|e| e.to_string())
}

fn launch(args: &[String]) -> Result<(), String> {
    let mut opts = LaunchOptions::default();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--root" => opts.root = Some(value(args, &mut i, "--root")?.to_owned()),
            "--transport" => match value(args, &mut i, "--transport")? {
                "tcp" => opts.mpi = false,
                "mpi" if cfg!(feature = "mpi") => opts.mpi = true,
                "mpi" => {
                    return Err(
                        "--transport mpi: this strata-node was built without the `mpi` feature (cargo build -p strata-net --features mpi)".into(),
                    )
                }
                other => {
                    return Err(format!(
                        "--transport {other:?}: the transports are tcp and mpi"
                    ))
                }
            },
            "--port" => {
                opts.port = Some(
                    value(args, &mut i, "--port")?
                        .parse()
                        .map_err(|_| "--port needs a port number".to_string())?,
                )
            }
            "--secret-file" => {
                opts.secret_file = Some(PathBuf::from(value(args, &mut i, "--secret-file")?))
            }
            "--help" | "-h" => {
                print!("{HELP}");
                return Ok(());
            }
            "--" => break,
            other => {
                return Err(format!(
                    "launch: unknown argument {other:?} (the program goes after `--`; see --help)"
                ))
            }
        }
        i += 1;
    }
    let program = args
        .get(i + 1)
        .ok_or("launch needs `-- PROGRAM [ARGS...]` (see --help)")?;
    let env: HashMap<String, String> = std::env::vars().collect();
    let vars = program_env(&env, &opts).map_err(|e| e.to_string())?;
    let err = std::process::Command::new(program)
        .args(&args[i + 2..])
        .envs(vars)
        .exec();
    Err(format!("cannot start {program}: {err}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("launch") => launch(&args[1..]),
        Some("--help" | "-h" | "help") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(format!(
            "unknown command {other:?}: use serve or launch (see --help)"
        )),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata-node: {e}");
            ExitCode::from(2)
        }
    }
}
