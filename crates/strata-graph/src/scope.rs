//! The scope stack: each open scope holds one reference on every task submitted in it and
//! picks the heap ring of its depth.

use crate::error::GraphError;
use crate::slot::TaskRef;

/// Maximum scope nesting, counting the run's outer scope.
pub const MAX_SCOPE_DEPTH: usize = 64;

#[derive(Debug)]
struct Frame {
    serial: u64,
    tasks: Vec<TaskRef>,
}

/// A stack of scope frames (orchestrator-owned, no locking).
#[derive(Debug, Default)]
pub(crate) struct ScopeStack {
    frames: Vec<Frame>,
    spare: Vec<Vec<TaskRef>>,
    next_serial: u64,
}

impl ScopeStack {
    /// Number of open scopes.
    pub(crate) fn depth(&self) -> usize {
        self.frames.len()
    }

    /// Zero-based depth of the innermost scope (0 with no scope or only the run's outer
    /// scope), which selects the heap ring.
    pub(crate) fn current_depth(&self) -> usize {
        self.frames.len().saturating_sub(1)
    }

    pub(crate) fn begin(&mut self) -> Result<(), GraphError> {
        if self.frames.len() >= MAX_SCOPE_DEPTH {
            return Err(GraphError::ScopeDepthExceeded {
                max: MAX_SCOPE_DEPTH,
            });
        }
        self.next_serial += 1;
        let tasks = self.spare.pop().unwrap_or_default();
        self.frames.push(Frame {
            serial: self.next_serial,
            tasks,
        });
        Ok(())
    }

    /// Registers a task with the innermost scope; returns that scope's serial, or `None`
    /// when no scope is open (the task then carries no scope reference).
    pub(crate) fn register(&mut self, task: TaskRef) -> Option<u64> {
        let f = self.frames.last_mut()?;
        f.tasks.push(task);
        Some(f.serial)
    }

    /// Tasks registered in the innermost scope.
    pub(crate) fn innermost_len(&self) -> usize {
        self.frames.last().map_or(0, |f| f.tasks.len())
    }

    /// Pops the innermost scope, handing its tasks (in registration order) to `release`.
    pub(crate) fn end(&mut self, mut release: impl FnMut(TaskRef)) -> Result<(), GraphError> {
        let mut f = self.frames.pop().ok_or(GraphError::NoOpenScope)?;
        for t in f.tasks.drain(..) {
            release(t);
        }
        self.spare.push(f.tasks);
        Ok(())
    }

    /// Whether the scope with `serial` is still open.
    pub(crate) fn is_open(&self, serial: u64) -> bool {
        // Serials increase up the stack.
        self.frames
            .binary_search_by_key(&serial, |f| f.serial)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the reference's scope cases (test_scope.cpp).
    use super::*;

    fn t(i: u32) -> TaskRef {
        TaskRef {
            index: i,
            id: i as u64,
        }
    }

    fn end_collect(s: &mut ScopeStack) -> Result<Vec<u32>, GraphError> {
        let mut v = vec![];
        s.end(|t| v.push(t.index))?;
        Ok(v)
    }

    #[test]
    fn initial_depth_is_zero_and_end_without_begin_fails() {
        let mut s = ScopeStack::default();
        assert_eq!(s.depth(), 0);
        assert!(matches!(end_collect(&mut s), Err(GraphError::NoOpenScope)));
    }

    #[test]
    fn single_scope_releases_registered_tasks_in_order() {
        let mut s = ScopeStack::default();
        s.begin().unwrap();
        s.register(t(10));
        s.register(t(20));
        assert_eq!(end_collect(&mut s).unwrap(), vec![10, 20]);
        assert_eq!(s.depth(), 0);
    }

    #[test]
    fn register_outside_scope_is_a_noop() {
        let mut s = ScopeStack::default();
        assert_eq!(s.register(t(1)), None);
        assert_eq!(s.depth(), 0);
    }

    #[test]
    fn nested_scopes_release_only_their_own() {
        let mut s = ScopeStack::default();
        s.begin().unwrap();
        let outer = s.register(t(1)).unwrap();
        s.begin().unwrap();
        let inner = s.register(t(2)).unwrap();
        assert!(s.is_open(outer) && s.is_open(inner));
        assert_eq!(end_collect(&mut s).unwrap(), vec![2]);
        assert_eq!(s.depth(), 1);
        assert!(!s.is_open(inner));
        assert_eq!(end_collect(&mut s).unwrap(), vec![1]);
        assert_eq!(s.depth(), 0);
    }

    #[test]
    fn empty_scope_releases_nothing_and_depth_is_capped() {
        let mut s = ScopeStack::default();
        s.begin().unwrap();
        assert!(end_collect(&mut s).unwrap().is_empty());
        for _ in 0..MAX_SCOPE_DEPTH {
            s.begin().unwrap();
        }
        assert!(matches!(
            s.begin(),
            Err(GraphError::ScopeDepthExceeded { max: 64 })
        ));
        assert_eq!(s.current_depth(), 63);
    }
}
