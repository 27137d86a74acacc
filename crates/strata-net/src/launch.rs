//! `strata-node launch`: reads who this process is from the launcher that started it —
//! Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK` / `_SIZE`), a PMI launcher such as MPICH's
//! Hydra (`PMI_RANK` / `PMI_SIZE`), or Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_STEP_NODELIST`) — works out where rank 0 listens and the job's secret, and
//! execs the program with them in its environment. Rank 0 becomes the level-4 root; the
//! other ranks serve as its remote level-3 workers ([`crate::add_launched_workers`]).
//!
//! **Rendezvous.** Rank 0 listens on a port derived from the job's id (or `--port`); its
//! host is the first node of Slurm's node list, or `mpirun`'s own host for Open MPI (the
//! `OMPI_MCA_orte_hnp_uri` address; rank 0 runs there when that host is first in the
//! host list, the usual layout), or `--root HOST`. A job on one host uses the loopback.
//! **Secret.** `--secret-file` / `STRATA_SECRET_FILE` if given; else one derived from a
//! per-job random value only the job's processes see (Open MPI's
//! `OMPI_MCA_orte_precondition_transports`), or from `~/.strata/secret` (created, mode
//! 0600, when missing — on a cluster the home directory is shared), keyed by the job id.

use crate::auth::{random_bytes, Secret};
use crate::error::NetError;
use crate::spec::{
    ENV_LAUNCH_RANK, ENV_LAUNCH_ROOT, ENV_LAUNCH_SECRET, ENV_LAUNCH_SIZE, ENV_LAUNCH_TRANSPORT,
    ENV_SECRET_FILE,
};
use std::collections::HashMap;
use std::path::PathBuf;

/// Who this process is in a launched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Which launcher set the environment (`"open-mpi"`, `"pmi"`, `"slurm"`).
    pub launcher: &'static str,
    /// This process's rank.
    pub rank: u32,
    /// The number of ranks.
    pub size: u32,
    /// The job's id (for the port and the secret).
    pub job: String,
    /// Where rank 0 runs, if the launcher tells.
    pub root_host: Option<String>,
    /// A per-job random value only the job's processes see, if the launcher has one.
    pub job_key: Option<String>,
}

/// Reads the launcher's environment from `env`.
///
/// # Errors
/// No launcher's variables, or malformed ones (named).
pub fn detect(env: &HashMap<String, String>) -> Result<LaunchEnv, NetError> {
    let num = |k: &str| -> Result<u32, NetError> {
        env.get(k)
            .ok_or_else(|| NetError::Config(format!("{k} is not set")))?
            .trim()
            .parse()
            .map_err(|_| NetError::Config(format!("{k}={:?} is not a number", env[k])))
    };
    let single_node = |n: Option<&String>| n.is_some_and(|v| v.trim() == "1");
    let e = if env.contains_key("OMPI_COMM_WORLD_RANK") {
        let hnp = env.get("OMPI_MCA_orte_hnp_uri").and_then(|u| hnp_host(u));
        LaunchEnv {
            launcher: "open-mpi",
            rank: num("OMPI_COMM_WORLD_RANK")?,
            size: num("OMPI_COMM_WORLD_SIZE")?,
            job: env
                .get("OMPI_MCA_ess_base_jobid")
                .or_else(|| env.get("PMIX_NAMESPACE"))
                .cloned()
                .unwrap_or_default(),
            root_host: if single_node(env.get("OMPI_MCA_orte_num_nodes")) {
                Some("127.0.0.1".into())
            } else {
                hnp
            },
            job_key: env.get("OMPI_MCA_orte_precondition_transports").cloned(),
        }
    } else if env.contains_key("SLURM_PROCID") {
        let nodes = env
            .get("SLURM_STEP_NODELIST")
            .or_else(|| env.get("SLURM_JOB_NODELIST"))
            .map(|l| expand_hostlist(l))
            .transpose()?
            .unwrap_or_default();
        LaunchEnv {
            launcher: "slurm",
            rank: num("SLURM_PROCID")?,
            size: num("SLURM_NTASKS").or_else(|_| num("SLURM_NPROCS"))?,
            job: format!(
                "{}.{}",
                env.get("SLURM_JOB_ID").map(String::as_str).unwrap_or("0"),
                env.get("SLURM_STEP_ID").map(String::as_str).unwrap_or("0")
            ),
            root_host: if nodes.len() == 1 {
                Some("127.0.0.1".into())
            } else {
                nodes.first().cloned()
            },
            job_key: None,
        }
    } else if env.contains_key("PMI_RANK") {
        LaunchEnv {
            launcher: "pmi",
            rank: num("PMI_RANK")?,
            size: num("PMI_SIZE")?,
            job: env
                .get("PMI_KVSNAME")
                .or_else(|| env.get("PMI_JOBID"))
                .cloned()
                .unwrap_or_default(),
            root_host: env
                .get("PMI_PORT")
                .and_then(|p| p.rsplit_once(':').map(|(h, _)| h.to_owned())),
            job_key: None,
        }
    } else {
        return Err(NetError::Config(
            "no launcher environment found (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID): run `strata-node launch` under mpirun or srun".into(),
        ));
    };
    if e.size == 0 || e.rank >= e.size {
        return Err(NetError::Config(format!(
            "rank {} of {} ranks is not valid",
            e.rank, e.size
        )));
    }
    Ok(e)
}

/// The host of Open MPI's `OMPI_MCA_orte_hnp_uri` (`jobid;tcp://ADDR:PORT;tcp6://[ADDR]:PORT`).
fn hnp_host(uri: &str) -> Option<String> {
    uri.split(';').find_map(|part| {
        let rest = part
            .strip_prefix("tcp://")
            .or_else(|| part.strip_prefix("tcp6://"))?;
        let (host, _) = rest.rsplit_once(':')?;
        Some(host.trim_matches(|c| c == '[' || c == ']').to_owned())
    })
}

/// Expands a Slurm host list: `node[01-04,07],login1,rack[1-2]-n[1-2]` →
/// `node01 … node04 node07 login1 rack1-n1 rack1-n2 rack2-n1 rack2-n2` (leading zeros
/// kept; brackets may appear several times in one name).
///
/// # Errors
/// Unbalanced brackets, a range that is not `A-B` with `A ≤ B`, or more than 100 000
/// names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, NetError> {
    let bad = |why: &str| NetError::Config(format!("host list {list:?}: {why}"));
    // Split on commas outside brackets.
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad("unbalanced or nested brackets"));
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced brackets"));
    }
    items.push(&list[start..]);
    let mut out = Vec::new();
    for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let close = rest[open..]
                .find(']')
                .ok_or_else(|| bad("unbalanced brackets"))?
                + open;
            let prefix = &rest[..open];
            let mut alts = Vec::new();
            for r in rest[open + 1..close].split(',') {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                let (lo, hi): (u64, u64) = (
                    a.trim()
                        .parse()
                        .map_err(|_| bad(&format!("{r:?} is not a number or range")))?,
                    b.trim()
                        .parse()
                        .map_err(|_| bad(&format!("{r:?} is not a number or range")))?,
                );
                if lo > hi || hi - lo > 100_000 {
                    return Err(bad(&format!("range {r:?}")));
                }
                let width = a.trim().len();
                for v in lo..=hi {
                    alts.push(format!("{v:0width$}"));
                }
            }
            let mut next = Vec::with_capacity(names.len() * alts.len());
            for n in &names {
                for a in &alts {
                    next.push(format!("{n}{prefix}{a}"));
                }
            }
            if next.len() > 100_000 {
                return Err(bad("more than 100 000 names"));
            }
            names = next;
            rest = &rest[close + 1..];
        }
        out.extend(names.into_iter().map(|n| n + rest));
        if out.len() > 100_000 {
            return Err(bad("more than 100 000 names"));
        }
    }
    Ok(out)
}

/// The rendezvous port of job `job`: 20000–39999, from a hash of the job's id, so every
/// rank computes the same one without talking.
pub fn job_port(job: &str) -> u16 {
    let mut h: u32 = 2166136261;
    for b in job.bytes() {
        h = (h ^ b as u32).wrapping_mul(16777619);
    }
    20000 + (h % 20000) as u16
}

/// What `strata-node launch` was told.
#[derive(Debug, Clone, Default)]
pub struct LaunchOptions {
    /// Rank 0's host, overriding what the launcher says.
    pub root: Option<String>,
    /// The rendezvous port, overriding the job-derived one.
    pub port: Option<u16>,
    /// A secret file, overriding the derived secret.
    pub secret_file: Option<PathBuf>,
    /// The sessions travel as MPI messages (`--transport mpi`) instead of over TCP; rank
    /// 0's address is then not needed.
    pub mpi: bool,
}

/// The environment the program gets: rank, size, rank 0's address, the job's secret.
///
/// # Errors
/// As [`detect`]; no way to find rank 0's host; an unreadable secret.
pub fn program_env(
    env: &HashMap<String, String>,
    opts: &LaunchOptions,
) -> Result<Vec<(String, String)>, NetError> {
    let e = detect(env)?;
    let host = opts.root.clone().or(e.root_host.clone());
    // Over MPI the ranks find each other through MPI: an address is passed on if known,
    // never required.
    let host = if opts.mpi {
        host.unwrap_or_else(|| "127.0.0.1".into())
    } else {
        host.ok_or_else(|| {
            NetError::Config(format!(
                "{}: cannot tell where rank 0 runs; pass `strata-node launch --root HOST`",
                e.launcher
            ))
        })?
    };
    let port = opts.port.unwrap_or_else(|| job_port(&e.job));
    let secret_file = opts
        .secret_file
        .clone()
        .or_else(|| env.get(ENV_SECRET_FILE).map(PathBuf::from));
    let secret = match (secret_file, &e.job_key) {
        (Some(f), _) => Secret::from_file(&f)?,
        (None, Some(k)) => Secret::new(k.as_bytes().to_vec())
            .unwrap_or_else(|_| {
                Secret::new(format!("{k:0>16}").into_bytes()).unwrap_or_else(|_| unreachable!())
            })
            .derive(e.job.as_bytes()),
        (None, None) => home_secret(env)?.derive(e.job.as_bytes()),
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Ok(vec![
        (ENV_LAUNCH_RANK.into(), e.rank.to_string()),
        (ENV_LAUNCH_SIZE.into(), e.size.to_string()),
        (ENV_LAUNCH_ROOT.into(), format!("{host}:{port}")),
        (ENV_LAUNCH_SECRET.into(), secret.to_hex()),
        (
            ENV_LAUNCH_TRANSPORT.into(),
            if opts.mpi { "mpi" } else { "tcp" }.into(),
        ),
    ])
}

/// `~/.strata/secret`, created (mode 0600, 32 random bytes as hex) when missing.
fn home_secret(env: &HashMap<String, String>) -> Result<Secret, NetError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let home = env
        .get("HOME")
        .ok_or_else(|| NetError::Config("HOME is not set; pass --secret-file".into()))?;
    let dir = PathBuf::from(home).join(".strata");
    let path = dir.join("secret");
    if !path.exists() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| NetError::io(format!("creating {}", dir.display()), e))?;
        let bytes = random_bytes::<32>()?;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => f
                .write_all(crate::auth::hex(&bytes).as_bytes())
                .map_err(|e| NetError::io(format!("writing {}", path.display()), e))?,
            // Another rank created it first.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(NetError::io(format!("creating {}", path.display()), e)),
        }
    }
    Secret::from_file(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn hostlists_expand_like_slurm() {
        assert_eq!(
            expand_hostlist("node[01-04,07]").unwrap(),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(
            expand_hostlist("a,b[8-10],c").unwrap(),
            ["a", "b8", "b9", "b10", "c"]
        );
        assert_eq!(
            expand_hostlist("rack[1-2]-n[1-2]").unwrap(),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
        );
        assert!(expand_hostlist("n[1-").is_err());
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[x]").is_err());
    }

    #[test]
    fn each_launcher_is_read() {
        let ompi = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_MCA_ess_base_jobid", "1234"),
            (
                "OMPI_MCA_orte_hnp_uri",
                "1233.0;tcp://10.1.2.3:4000;tcp6://[fd00::2]:4001",
            ),
            ("OMPI_MCA_orte_num_nodes", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (ompi.rank, ompi.size, ompi.root_host.as_deref()),
            (1, 3, Some("10.1.2.3"))
        );
        let slurm = detect(&env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "99"),
            ("SLURM_STEP_ID", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (
                slurm.rank,
                slurm.size,
                slurm.root_host.as_deref(),
                slurm.job.as_str()
            ),
            (0, 4, Some("gpu07"), "99.0")
        );
        let pmi = detect(&env(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("PMI_PORT", "h1:555"),
        ]))
        .unwrap();
        assert_eq!((pmi.rank, pmi.root_host.as_deref()), (2, Some("h1")));
        assert!(detect(&env(&[("PMI_RANK", "3"), ("PMI_SIZE", "3")])).is_err());
        assert!(detect(&env(&[])).is_err());
    }

    #[test]
    fn every_rank_derives_the_same_address_and_secret() {
        let base = [
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "77"),
            ("OMPI_MCA_orte_num_nodes", "1"),
            (
                "OMPI_MCA_orte_precondition_transports",
                "14eeba0aa48b94e9-046007c80fca2dbc",
            ),
        ];
        let mut a = env(&base);
        a.insert("OMPI_COMM_WORLD_RANK".into(), "0".into());
        let mut b = env(&base);
        b.insert("OMPI_COMM_WORLD_RANK".into(), "1".into());
        let ea = program_env(&a, &LaunchOptions::default()).unwrap();
        let eb = program_env(&b, &LaunchOptions::default()).unwrap();
        assert_eq!(ea[2..], eb[2..]);
        assert_eq!(ea[4], (ENV_LAUNCH_TRANSPORT.to_string(), "tcp".to_string()));
        assert_eq!(ea[2].1, format!("127.0.0.1:{}", job_port("77")));
    }
}
