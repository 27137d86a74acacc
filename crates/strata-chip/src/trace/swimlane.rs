//! Opt-in chip swimlane: one record per kernel invocation (task × block × subtask) per
//! core, exported as Chrome / Perfetto trace-event JSON.

use crate::config::CoreType;
use std::fmt::Write as _;

/// One kernel invocation on one core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwimRecord {
    /// The core.
    pub core: u32,
    /// Its type.
    pub core_type: CoreType,
    /// The task id.
    pub task: u64,
    /// The SPMD block.
    pub block: u32,
    /// The subtask lane: 0 AIC, 1 AIV0, 2 AIV1.
    pub lane: u8,
    /// The kernel's registered name.
    pub kernel: String,
    /// Start, in ns since the chip was initialised.
    pub start_ns: u64,
    /// End, in ns since the chip was initialised.
    pub end_ns: u64,
}

/// The swimlane of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swimlane {
    /// The chip's id (the trace's `pid`).
    pub chip: u32,
    /// Type of each core, by core id (the trace's `tid`).
    pub core_types: Vec<CoreType>,
    /// The records, in completion order.
    pub records: Vec<SwimRecord>,
}

fn escape(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

impl Swimlane {
    /// Chrome trace-event JSON (`{"traceEvents": [...]}`): one `"X"` (complete) event per
    /// record with `pid` = chip, `tid` = core, timestamps in µs, plus metadata events
    /// naming the chip and each core. Load it in Perfetto or `chrome://tracing`.
    ///
    /// ```
    /// use strata_chip::{Swimlane, SwimRecord, CoreType};
    /// let s = Swimlane {
    ///     chip: 0,
    ///     core_types: vec![CoreType::Aiv],
    ///     records: vec![SwimRecord { core: 0, core_type: CoreType::Aiv, task: 1, block: 0, lane: 1,
    ///                                kernel: "add".into(), start_ns: 1000, end_ns: 3000 }],
    /// };
    /// let json = s.to_chrome_json();
    /// assert!(json.starts_with("{\"traceEvents\":["));
    /// assert!(json.contains("\"ph\":\"X\""));
    /// ```
    pub fn to_chrome_json(&self) -> String {
        let mut out = String::with_capacity(128 + self.records.len() * 160);
        out.push_str("{\"traceEvents\":[");
        let _ = write!(
            out,
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"chip {}\"}}}}",
            self.chip, self.chip
        );
        for (core, ty) in self.core_types.iter().enumerate() {
            let _ = write!(
                out,
                ",{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{core},\"args\":{{\"name\":\"core {core} ({})\"}}}}",
                self.chip,
                ty.name()
            );
        }
        for r in &self.records {
            out.push_str(",{\"name\":\"");
            escape(&r.kernel, &mut out);
            let _ = write!(
                out,
                "\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"task\":{},\"block\":{},\"lane\":{}}}}}",
                r.core_type.name(),
                self.chip,
                r.core,
                r.start_ns as f64 / 1e3,
                r.end_ns.saturating_sub(r.start_ns) as f64 / 1e3,
                r.task,
                r.block,
                r.lane
            );
        }
        out.push_str("],\"displayTimeUnit\":\"ns\"}");
        out
    }

    /// Writes [`Swimlane::to_chrome_json`] to `path`, replacing what is there. A symlink
    /// at `path` is replaced, never followed: the JSON goes to a new file (created with
    /// `O_EXCL | O_NOFOLLOW`, mode 0600) renamed over `path`.
    ///
    /// # Errors
    /// The I/O error.
    pub fn write_chrome_json(&self, path: &std::path::Path) -> std::io::Result<()> {
        crate::trace::file::write_nofollow(path, self.to_chrome_json().as_bytes())
    }
}
