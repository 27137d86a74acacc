//! A progress bar for long dispatch loops and `benchmark()`: on a terminal it redraws one
//! line of standard error (done / total, rate, time left) at most ten times a second; when
//! standard error is not a terminal (a pipe, a file, CI) or `STRATA_PROGRESS=0`, it stays
//! quiet.

use std::io::Write;
use std::time::{Duration, Instant};

/// A progress bar over `total` steps.
///
/// ```
/// let mut p = strata::Progress::new("requests", 3);
/// for _ in 0..3 {
///     // ... one dispatch ...
///     p.tick();
/// }
/// p.finish();
/// ```
#[derive(Debug)]
pub struct Progress {
    what: String,
    total: u64,
    done: u64,
    start: Instant,
    last_draw: Option<Instant>,
    shown: bool,
}

/// Whether standard error is a terminal and progress is wanted.
fn enabled() -> bool {
    if std::env::var("STRATA_PROGRESS").is_ok_and(|v| v == "0") {
        return false;
    }
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

impl Progress {
    /// A bar for `total` steps of `what` (shown only on a terminal).
    pub fn new(what: impl Into<String>, total: u64) -> Progress {
        Progress {
            what: what.into(),
            total,
            done: 0,
            start: Instant::now(),
            last_draw: None,
            shown: enabled(),
        }
    }

    /// Steps done so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// One more step done.
    pub fn tick(&mut self) {
        self.done += 1;
        if !self.shown {
            return;
        }
        let now = Instant::now();
        if self
            .last_draw
            .is_some_and(|t| now - t < Duration::from_millis(100))
            && self.done < self.total
        {
            return;
        }
        self.last_draw = Some(now);
        let _ = std::io::stderr().write_all(self.line().as_bytes());
    }

    /// The bar as it would be drawn (a carriage return, no newline).
    pub fn line(&self) -> String {
        const WIDTH: u64 = 30;
        let total = self.total.max(1);
        let filled = (self.done.min(total) * WIDTH / total) as usize;
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            self.done as f64 / secs
        } else {
            0.0
        };
        let left = if rate > 0.0 {
            (total.saturating_sub(self.done)) as f64 / rate
        } else {
            0.0
        };
        format!(
            "\r[{}{}] {}/{} {}, {:.1}/s, ETA {:.1}s ",
            "=".repeat(filled),
            " ".repeat(WIDTH as usize - filled),
            self.done,
            self.total,
            self.what,
            rate,
            left
        )
    }

    /// Clears the bar's line.
    pub fn finish(&mut self) {
        if self.shown && self.last_draw.is_some() {
            let _ = std::io::stderr().write_all(format!("\r{}\r", " ".repeat(80)).as_bytes());
        }
        self.shown = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_steps_and_fills_the_bar_in_proportion() {
        let mut p = Progress::new("rounds", 4);
        p.shown = false;
        p.tick();
        p.tick();
        let line = p.line();
        assert!(
            line.starts_with(&format!(
                "\r[{}{}] 2/4 rounds",
                "=".repeat(15),
                " ".repeat(15)
            )),
            "{line:?}"
        );
        assert_eq!(p.done(), 2);
    }
}
