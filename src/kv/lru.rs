//! An intrusive doubly-linked list over block ids: O(1) push to the back, pop from the
//! front, and removal from the middle (a cached free block that gets reused).

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    pub fn new(capacity: usize) -> LruList {
        LruList {
            prev: vec![NONE; capacity],
            next: vec![NONE; capacity],
            linked: vec![false; capacity],
            head: NONE,
            tail: NONE,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, id: u32) -> bool {
        self.linked[id as usize]
    }

    pub fn push_back(&mut self, id: u32) {
        let i = id as usize;
        assert!(!self.linked[i], "block {id} is already in the list");
        self.prev[i] = self.tail;
        self.next[i] = NONE;
        if self.tail != NONE {
            self.next[self.tail as usize] = id;
        } else {
            self.head = id;
        }
        self.tail = id;
        self.linked[i] = true;
        self.len += 1;
    }

    pub fn pop_front(&mut self) -> Option<u32> {
        if self.head == NONE {
            return None;
        }
        let id = self.head;
        self.remove(id);
        Some(id)
    }

    pub fn remove(&mut self, id: u32) {
        let i = id as usize;
        assert!(self.linked[i], "block {id} is not in the list");
        let (p, n) = (self.prev[i], self.next[i]);
        if p != NONE {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
        self.linked[i] = false;
        self.len -= 1;
    }

    /// Ids from front (evicted first) to back.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NONE {
                return None;
            }
            let id = cur;
            cur = self.next[id as usize];
            Some(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_remove_in_order() {
        let mut l = LruList::new(5);
        for i in [3, 1, 4, 0] {
            l.push_back(i);
        }
        l.remove(1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![3, 4, 0]);
        assert_eq!(l.pop_front(), Some(3));
        l.push_back(1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![4, 0, 1]);
        assert_eq!(l.len(), 3);
        assert!(!l.contains(3));
    }
}
