//! Per-session, per-module state.

use std::any::{Any, TypeId};

/// A small type map holding each module's state for one session.
///
/// Owned by the session task (DESIGN.md invariant 2) and lent to hook
/// handlers through [`crate::SessionCtx::state`]. Each module keys its state
/// by a private type, so modules cannot see or clobber each other's state.
/// Most sessions hold zero to three entries, hence a vector, not a map: an
/// idle session with no module state costs no allocation.
#[derive(Default)]
pub struct Extensions {
    entries: Vec<(TypeId, Box<dyn Any + Send>)>,
}

impl Extensions {
    /// Empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state of type `T`, if set.
    pub fn get<T: Any + Send>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.entries
            .iter()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_ref())
    }

    /// The state of type `T`, mutably, if set.
    pub fn get_mut<T: Any + Send>(&mut self) -> Option<&mut T> {
        let id = TypeId::of::<T>();
        self.entries
            .iter_mut()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_mut())
    }

    /// Sets the state of type `T`, returning the previous value.
    pub fn insert<T: Any + Send>(&mut self, value: T) -> Option<T> {
        let old = self.remove::<T>();
        self.entries.push((TypeId::of::<T>(), Box::new(value)));
        old
    }

    /// The state of type `T`, created with `f` if absent.
    pub fn get_or_insert_with<T: Any + Send>(&mut self, f: impl FnOnce() -> T) -> &mut T {
        let id = TypeId::of::<T>();
        let pos = match self.entries.iter().position(|(k, _)| *k == id) {
            Some(p) => p,
            None => {
                self.entries.push((id, Box::new(f())));
                self.entries.len() - 1
            }
        };
        self.entries[pos]
            .1
            .downcast_mut()
            .expect("entry keyed by its own TypeId")
    }

    /// Removes and returns the state of type `T`.
    pub fn remove<T: Any + Send>(&mut self) -> Option<T> {
        let id = TypeId::of::<T>();
        let pos = self.entries.iter().position(|(k, _)| *k == id)?;
        let (_, v) = self.entries.swap_remove(pos);
        v.downcast().ok().map(|b| *b)
    }

    /// Number of modules holding state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no module holds state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_insert_get_remove_by_type() {
        struct A(u32);
        struct B(&'static str);
        let mut e = Extensions::new();
        assert!(e.get::<A>().is_none());
        e.insert(A(1));
        e.insert(B("x"));
        e.get_mut::<A>().unwrap().0 += 1;
        assert_eq!(e.get::<A>().unwrap().0, 2);
        assert_eq!(e.get::<B>().unwrap().0, "x");
        assert_eq!(e.remove::<A>().unwrap().0, 2);
        assert!(e.get::<A>().is_none());
        assert_eq!(e.get_or_insert_with(|| A(7)).0, 7);
        assert_eq!(e.len(), 2);
    }
}
