//! The index's reads and looks: which roots' trees are due, and what each
//! read found.

use std::collections::HashSet;
use std::hash::Hash;
use std::time::{Duration, Instant};

use super::super::schedule::{self, Last};
use super::super::uid::Uid;
use super::stored::LastRead;
use super::{DueRoot, Index, Look, TreeState};

/// Whether a candidate's tree is read this look.
enum Due {
    /// Read now: its rank and kind's number.
    Now(u8, u32),
    /// Not due (or no longer a root): no longer a candidate.
    Not,
    /// Its kind is not listed now: a candidate again once it is.
    Later,
}

/// A set a start's burst grew (100,000 roots due) keeps its room once
/// emptied: given back when mostly empty.
fn shrink<T: Eq + Hash>(set: &mut HashSet<T>) {
    if set.capacity() > 1024 && set.len() < set.capacity() / 8 {
        set.shrink_to_fit();
    }
}

impl Index {
    /// How `uid`'s tree was last read, whether it is in sight or not.
    pub(super) fn read_of(&self, uid: &Uid) -> Option<LastRead> {
        match self.objects.get(uid) {
            Some(o) => o.last_read(),
            None => self.unseen_reads.get(uid).map(|(_, r)| *r),
        }
    }

    /// Forgets how `uid`'s tree was read; true if it was.
    fn forget_read(&mut self, uid: &Uid) -> bool {
        self.forget_members(uid);
        self.poke_reads.remove(uid);
        let in_sight = self.objects.get_mut(uid).is_some_and(|o| {
            let was = o.last_read().is_some();
            o.set_read(None);
            was
        });
        in_sight || self.unseen_reads.remove(uid).is_some()
    }

    /// A tree taken into a look could not be read: due again at the next.
    pub fn not_read(&mut self, root: &str) {
        let uid = Uid::new(root);
        self.poke_reads.remove(&uid);
        self.dirty.insert(uid);
    }

    /// Forgets what `root`'s last read found in it and around it.
    fn forget_members(&mut self, root: &Uid) {
        if let Some(before) = self.tree_configs.remove(root) {
            for config in before.iter() {
                if self.config_homes.get(config) == Some(root) {
                    self.config_homes.remove(config);
                }
            }
        }
        if let Some(before) = self.trees.remove(root) {
            for member in before.iter() {
                if self.members.get(member) == Some(root) {
                    self.members.remove(member);
                    self.read_outside.remove(member);
                }
            }
        }
    }

    /// Records a read of `root`'s tree.
    pub fn read(&mut self, root: &str, rv: u64, at: Instant, state: TreeState) {
        let uid = Uid::new(root);
        let number = self.last_read.wrapping_add(1);
        let Some(o) = self.objects.get_mut(&uid) else {
            return;
        };
        self.last_read = number;
        o.set_read(Some(LastRead {
            rv,
            number,
            active: state.active,
        }));
        self.forget_members(&uid);
        let members: Box<[Uid]> = state
            .members
            .iter()
            .chain(&state.outside)
            .map(Uid::from)
            .collect();
        // Its own objects are its; one outside it stays with the tree it is
        // in (or the first that read it).
        for (i, member) in members.iter().enumerate() {
            if i < state.members.len() {
                self.members.insert(member.clone(), uid.clone());
                self.read_outside.remove(member);
            } else if !self.members.contains_key(member) {
                self.members.insert(member.clone(), uid.clone());
                self.read_outside.insert(member.clone());
            }
        }
        if !members.is_empty() {
            self.trees.insert(uid.clone(), members);
        }
        for (config, in_tree) in &state.configs {
            if *in_tree {
                self.config_homes.insert(config.clone(), uid.clone());
            } else {
                self.config_homes
                    .entry(config.clone())
                    .or_insert_with(|| uid.clone());
            }
        }
        if !state.configs.is_empty() {
            let configs = state.configs.iter().map(|(c, _)| c.clone()).collect();
            self.tree_configs.insert(uid.clone(), configs);
        }
        // The trees of what it needs outside it read it again, as their
        // outside user, to hold what they keep for it (a new gateway's
        // Releases on an old cluster's ProviderConfigs): else only at their
        // resync. Not from a read only a poke caused.
        if !self.poke_reads.remove(&uid) {
            for needed in &state.needed_outside {
                let needed = Uid::new(needed);
                // Only the tree it is in: one that merely read it (a shared
                // ProviderConfig in no tree) holds nothing of it.
                if self.read_outside.contains(&needed) {
                    continue;
                }
                match self.members.get(&needed) {
                    Some(home) if *home != uid => {
                        self.poked.insert(home.clone());
                    }
                    _ => {}
                }
            }
        }
        if !state.alone {
            self.resyncs.push_back((at, uid.clone(), number));
        }
        if state.active {
            self.settling.remove(&uid);
            self.active.insert(uid, at);
        } else if state.settling {
            self.active.remove(&uid);
            self.settling.insert(uid, at);
        } else {
            self.active.remove(&uid);
            self.settling.remove(&uid);
        }
    }

    /// The trees this look reads, in rank (see [`schedule::rank`]), at most
    /// [`schedule::READS_PER_LOOK`]; what is left stays due. Resyncs are
    /// taken at most every [`schedule::QUIET_LOOK`], and never of a root
    /// read alone.
    pub fn look(&mut self, now: Instant, resync: Duration) -> Look {
        let mut candidates: HashSet<Uid> = self.dirty.iter().cloned().collect();
        candidates.extend(self.poked.iter().cloned());
        // An active tree whose objects the watches saw change is dirty
        // already; the others are read again every ACTIVE_EVERY, for what
        // no watch follows (a Secret, a ProviderConfig). Every look, a
        // teardown's 200-ms looks read each tree in it five times a second.
        candidates.extend(
            self.active
                .iter()
                .filter(|(_, at)| now.duration_since(**at) >= schedule::ACTIVE_EVERY)
                .map(|(uid, _)| uid.clone()),
        );
        let resync_due = self.resyncs_due(now, resync);
        candidates.extend(resync_due.iter().cloned());
        let settle_due: HashSet<Uid> = self
            .settling
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= schedule::SETTLE_EVERY)
            .map(|(uid, _)| uid.clone())
            .collect();
        candidates.extend(settle_due.iter().cloned());
        // Ranked by what the index holds; a DueRoot made only for what
        // this look takes (at a start all 100,000 are due).
        let mut due: Vec<(u8, u32, Uid)> = Vec::new();
        for uid in candidates {
            match self.rank(&uid, &resync_due, &settle_due) {
                Due::Now(rank, kind) => due.push((rank, kind, uid)),
                Due::Not => {
                    self.dirty.remove(&uid);
                    self.poked.remove(&uid);
                }
                Due::Later => {}
            }
        }
        // Rank, then kind, then uid: the same look for the same state, and a
        // look's trees of few kinds, each listed once (spread over every
        // kind, each look of a start listed all 100,000 objects).
        let kind = |n: u32| self.kind_names.get(n);
        due.sort_by(|a, b| (a.0, kind(a.1), &a.2).cmp(&(b.0, kind(b.1), &b.2)));
        let urgent = |due: &[(u8, u32, Uid)]| due.iter().filter(|d| d.0 < 3).count();
        let urgent_due = urgent(&due);
        schedule::take_this_look(&mut due, |d| d.0);
        self.poke_reads.clear();
        for (_, _, uid) in &due {
            let poked = self.poked.remove(uid);
            let changed = self.dirty.remove(uid);
            let only_poked = poked
                && !changed
                && !self.active.contains_key(uid)
                && !settle_due.contains(uid)
                && !resync_due.contains(uid)
                && self
                    .objects
                    .get(uid)
                    .and_then(|o| o.last_read().map(|r| r.rv == o.rv))
                    .unwrap_or(false);
            if only_poked {
                self.poke_reads.insert(uid.clone());
            }
        }
        let backlog = urgent(&due) < urgent_due;
        shrink(&mut self.dirty);
        shrink(&mut self.poked);
        let listed_all = self.listed_all();
        let left = if listed_all {
            let mut left: Vec<Uid> = self.left.drain().collect();
            shrink(&mut self.left);
            left.sort();
            left.iter().map(Uid::to_string).collect()
        } else {
            Vec::new()
        };
        Look {
            backlog,
            due: due
                .into_iter()
                .filter_map(|(rank, _, uid)| self.due_root(rank, uid))
                .collect(),
            listed_all,
            left,
        }
    }

    /// The roots whose resync is due now, at most RESYNCS_PER_LOOK, and only
    /// every QUIET_LOOK.
    fn resyncs_due(&mut self, now: Instant, resync: Duration) -> HashSet<Uid> {
        let mut due = HashSet::new();
        if self
            .resynced
            .is_some_and(|at| now.duration_since(at) < schedule::QUIET_LOOK)
        {
            return due;
        }
        while let Some((at, _, _)) = self.resyncs.front() {
            if now.duration_since(*at) < resync || due.len() >= schedule::RESYNCS_PER_LOOK {
                break;
            }
            let Some((_, uid, number)) = self.resyncs.pop_front() else {
                break;
            };
            // Read again since: its newer entry stands.
            if self.read_of(&uid).is_some_and(|r| r.number == number) {
                due.insert(uid);
            }
        }
        if !due.is_empty() {
            self.resynced = Some(now);
        }
        due
    }

    /// How soon `uid`'s tree is read (see [`schedule::rank`]). A root read
    /// that no longer begins a tree is taken as left here.
    fn rank(&mut self, uid: &Uid, resync_due: &HashSet<Uid>, settle_due: &HashSet<Uid>) -> Due {
        if !self.begins_tree(uid) {
            // Its kind not listed now (or the read root's kind, gone from
            // sight with its watch): due again once it is.
            let kind = match (self.objects.get(uid), self.unseen_reads.get(uid)) {
                (Some(o), _) => Some(o.kind),
                (None, Some((kind, _))) => Some(*kind),
                (None, None) => None,
            };
            let kind = kind.and_then(|k| self.kind_names.get(k));
            if kind.is_some_and(|k| {
                self.kinds.get(k).is_some_and(|k| k.ordered) && !self.kind_is_listed(k)
            }) {
                return Due::Later;
            }
            // What it held stays held until the trees it leaves behind are
            // read: an orphaning delete makes roots of what it controlled,
            // and their first reads hold again what they need. Let go of
            // before, what the old root held could go in no order (a Fleet
            // deleted as its Region left lost its InferenceCluster's hold
            // while its Releases still needed the cluster, CI's load making
            // a look 82 s).
            if self.leaves_unread_roots(uid) {
                self.dirty.insert(uid.clone());
                return Due::Later;
            }
            if self.forget_read(uid) {
                self.active.remove(uid);
                self.settling.remove(uid);
                self.left.insert(uid.clone());
            }
            return Due::Not;
        }
        let Some(o) = self.objects.get(uid) else {
            return Due::Not;
        };
        let last = o.last_read().map(|r| Last {
            changed: r.rv != o.rv || self.poked.contains(uid),
            active: r.active || settle_due.contains(uid),
            resync_due: resync_due.contains(uid),
        });
        match schedule::rank(o.deleting, last) {
            Some(rank) => Due::Now(rank, o.kind),
            None => Due::Not,
        }
    }

    /// Whether a member of `root`'s last read tree now begins a tree of its
    /// own and was never read as one.
    fn leaves_unread_roots(&self, root: &Uid) -> bool {
        self.trees.get(root).is_some_and(|members| {
            members.iter().any(|m| {
                m != root
                    && self.begins_tree(m)
                    && self.objects.get(m).is_some_and(|o| o.last_read().is_none())
            })
        })
    }

    /// What a look hands out for a root it takes.
    fn due_root(&self, rank: u8, uid: Uid) -> Option<DueRoot> {
        let o = self.objects.get(&uid)?;
        Some(DueRoot {
            rank,
            uid: uid.to_string(),
            rv: o.rv,
            kind: self.kind_of(o)?.clone(),
            namespace: self.namespace_of(o).map(str::to_string),
            name: o.name.as_str().to_string(),
        })
    }

    /// Roots never read yet that begin a tree now: none once every tree was
    /// read since the start.
    pub fn unread_roots(&self) -> usize {
        self.dirty
            .iter()
            .filter(|uid| self.read_of(uid).is_none() && self.begins_tree(uid))
            .count()
    }

    /// How many roots were read and still begin trees.
    pub fn roots_read(&self) -> usize {
        let in_sight = self.objects.values().filter(|o| o.last_read().is_some());
        in_sight.count() + self.unseen_reads.len()
    }

    /// Something is due at the next look without any new event: an active
    /// tree, a change not taken yet, or a root left to tell.
    #[cfg(test)]
    pub fn busy(&self) -> bool {
        !self.dirty.is_empty()
            || !self.poked.is_empty()
            || !self.left.is_empty()
            || !self.active.is_empty()
            || !self.settling.is_empty()
    }
}
