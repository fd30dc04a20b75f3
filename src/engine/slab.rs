//! A vector arena with a free list: ids stay small and lookups are indexing.

#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, item: T) -> u32 {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            self.items[i as usize] = Some(item);
            i
        } else {
            self.items.push(Some(item));
            (self.items.len() - 1) as u32
        }
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        let item = self.items.get_mut(id as usize)?.take();
        if item.is_some() {
            self.live -= 1;
            self.free.push(id);
        }
        item
    }

    pub fn get(&self, id: u32) -> Option<&T> {
        self.items.get(id as usize)?.as_ref()
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.items.get_mut(id as usize)?.as_mut()
    }

    pub fn len(&self) -> usize {
        self.live
    }

    /// One past the largest id ever handed out: a bound for per-id tables.
    pub fn id_bound(&self) -> usize {
        self.items.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (i as u32, t)))
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    fn index(&self, id: u32) -> &T {
        match self.items.get(id as usize) {
            Some(Some(t)) => t,
            _ => panic!("engine invariant: stale id {id}"),
        }
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    fn index_mut(&mut self, id: u32) -> &mut T {
        match self.items.get_mut(id as usize) {
            Some(Some(t)) => t,
            _ => panic!("engine invariant: stale id {id}"),
        }
    }
}
