//! Node daemons on loopback for the remote examples: each example is its own node program
//! (a daemon starts this same executable for a session), so it can stand up "hosts" on one
//! machine without any setup.
//!
//! An example's `main` calls [`role`] first: as a daemon it serves and returns; as a
//! node's session process it builds the same worker as the root (whose `init` / `prepare`
//! then serves); otherwise it is the root and starts [`LocalNodes`].

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata_net::daemon::DaemonConfig;
use strata_net::Secret;

/// What this process of the example is.
pub enum Role {
    /// Started with `--node-daemon SECRET_FILE`: serve sessions (done when this returns).
    Daemon(Result<(), String>),
    /// A node's session process (its daemon started it with the root's arguments): build
    /// the same worker; its `init` / `prepare` serves and never returns.
    Node,
    /// The root: start the nodes and run the job.
    Root,
}

/// Decides this process's [`Role`] from its arguments and environment.
pub fn role() -> Role {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--node-daemon") {
        return Role::Daemon(match args.get(i + 1) {
            Some(f) => node_daemon(Path::new(f)),
            None => Err("--node-daemon needs the secret file".into()),
        });
    }
    if std::env::var_os(strata_net::ENV_NODE_WORKER).is_some() {
        Role::Node
    } else {
        Role::Root
    }
}

/// `--node-daemon SECRET_FILE`: serve sessions on a free loopback port (printed as
/// `listening ADDR`) with this program as the one program sessions may start.
fn node_daemon(secret_file: &Path) -> Result<(), String> {
    let secret = Secret::from_file(secret_file).map_err(|e| e.to_string())?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let config = DaemonConfig {
        listen: "127.0.0.1:0".into(),
        secret,
        programs: vec![me],
        handshake_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(10),
        max_sessions: 8,
    };
    strata_net::daemon::run(config, |addr| println!("listening {addr}")).map_err(|e| e.to_string())
}

/// Node daemons this process started on loopback, sharing a fresh session secret through
/// a 0600 file. Stopped (SIGTERM, bounded drain) by [`LocalNodes::stop`], killed on drop.
pub struct LocalNodes {
    dir: PathBuf,
    secret: Secret,
    nodes: Vec<(Child, String)>,
}

impl LocalNodes {
    /// Starts `n` daemons, each on its own port of 127.0.0.1.
    pub fn start(n: usize) -> Result<LocalNodes, String> {
        let dir = std::env::temp_dir().join(format!("strata-example-nodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let secret_file = dir.join("secret");
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
            .map_err(|e| format!("a session secret: {e}"))?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&secret_file, hex).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        let secret = Secret::from_file(&secret_file).map_err(|e| e.to_string())?;
        let mut nodes = LocalNodes {
            dir,
            secret,
            nodes: Vec::new(),
        };
        for _ in 0..n {
            let node = start_node(&secret_file)?;
            nodes.nodes.push(node);
        }
        Ok(nodes)
    }

    /// The daemons' `host:port` addresses.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|(_, a)| a.clone()).collect()
    }

    /// The session secret the daemons hold.
    pub fn secret(&self) -> Secret {
        self.secret.clone()
    }

    /// SIGTERMs every daemon and waits (up to 30 s each) for it to drain.
    pub fn stop(mut self) -> Result<(), String> {
        let mut first_error = Ok(());
        for (child, _) in std::mem::take(&mut self.nodes) {
            let r = stop_node(child);
            if first_error.is_ok() {
                first_error = r;
            }
        }
        first_error
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for (child, _) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_node(secret_file: &Path) -> Result<(Child, String), String> {
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("--node-daemon")
        .arg(secret_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting a node daemon: {e}"))?;
    let mut line = String::new();
    let read = child
        .stdout
        .take()
        .ok_or_else(|| "no stdout".to_string())
        .and_then(|out| {
            BufReader::new(out)
                .read_line(&mut line)
                .map_err(|e| e.to_string())
        });
    let addr = read.and_then(|_| {
        line.trim()
            .strip_prefix("listening ")
            .map(str::to_owned)
            .ok_or_else(|| format!("the node daemon did not start: {line:?}"))
    });
    match addr {
        Ok(addr) => Ok((child, addr)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// SIGTERM, then wait (bounded) for the daemon to drain.
fn stop_node(mut child: Child) -> Result<(), String> {
    // SAFETY: signalling a child this process started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(st)) = child.try_wait() {
            return if st.success() {
                Ok(())
            } else {
                Err(format!("node daemon exited {st}"))
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err("a node daemon did not drain within 30 s".into())
}
