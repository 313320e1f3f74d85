//! Property tests: random workloads (arrivals with shared prefixes, steps, forks, cancels)
//! driven through the scheduler and block pool, with every invariant checked after every
//! operation, and nothing leaked at the end; with one KV group, and with a windowed group
//! beside a full one (blocks released behind the window, prefixes reused only when every group
//! still holds what they need); and for a hybrid, whose recurrent state is checked against a
//! simulation of what each state slot holds after every step (fork copies, snapshot saves and
//! restores included).

use edgelm::engine::scheduler::{ScheduledBatch, Scheduler, SchedulerConfig};
use edgelm::engine::sequence::Sequence;
use edgelm::kv::{block_hash, BlockPool, KvLayout, NO_BLOCK};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// A prompt made of a shared prefix (one of 3) and a private tail.
    Arrive {
        prefix: u8,
        prefix_len: u8,
        tail_len: u8,
        max_new: u8,
    },
    Step,
    Fork {
        pick: u16,
    },
    Cancel {
        pick: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..3, 0u8..80, 1u8..40, 1u8..40).prop_map(|(prefix, prefix_len, tail_len, max_new)| Op::Arrive { prefix, prefix_len, tail_len, max_new }),
        5 => Just(Op::Step),
        1 => any::<u16>().prop_map(|pick| Op::Fork { pick }),
        1 => any::<u16>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

/// Every cached block's tokens are the sequence's tokens at that block, and its identity is
/// the chained hash of the sequence's blocks up to it.
fn check_cached_blocks(s: &Scheduler) -> Result<(), String> {
    let bt = s.pool.block_size();
    for seq in s.sequences() {
        for table in seq.blocks.tables() {
            let mut parent = None;
            for (i, &b) in table.iter().enumerate() {
                if (i + 1) * bt > seq.num_computed {
                    break;
                }
                let want = block_hash(parent, &seq.tokens[i * bt..(i + 1) * bt]);
                parent = Some(want);
                if b == NO_BLOCK {
                    continue;
                }
                if let Some((h, toks)) = s.pool.cached_tokens(b) {
                    if h != want || toks != &seq.tokens[i * bt..(i + 1) * bt] {
                        return Err(format!(
                            "seq {} block {i} (id {b}) cached under the wrong identity",
                            seq.id
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The three shared prefixes prompts start with.
fn prefixes() -> [Vec<u32>; 3] {
    [(0..80).collect(), (100..180).collect(), vec![5; 80]]
}

/// Applies an arrival, a fork or a cancellation to the workload (`live`: its sequences);
/// false for a step, which the caller runs (then [`after_step`]).
fn apply(op: &Op, s: &mut Scheduler, live: &mut Vec<u64>, next_id: &mut u64) -> bool {
    match *op {
        Op::Arrive {
            prefix,
            prefix_len,
            tail_len,
            max_new,
        } => {
            let mut prompt = prefixes()[prefix as usize][..prefix_len as usize].to_vec();
            prompt.extend((0..tail_len as u32).map(|t| 1000 + *next_id as u32 * 50 + t));
            let max_len = prompt.len() + max_new as usize;
            // Only what can ever fit is admitted (the engine rejects the rest up front).
            if max_len <= s.capacity_tokens() {
                s.add(Sequence::new(*next_id, *next_id, *next_id, prompt, max_len));
                live.push(*next_id);
                *next_id += 1;
            }
        }
        Op::Step => return false,
        Op::Fork { pick } => {
            if live.is_empty() {
                return true;
            }
            let parent = live[pick as usize % live.len()];
            let p = s.get(parent).unwrap();
            // Forks are made from a running sequence whose tokens are all computed.
            if p.num_computed == p.tokens.len()
                && !p.blocks.is_empty()
                && p.tokens.len() < p.max_len
            {
                let mut child = p.clone();
                child.id = *next_id;
                s.add_fork(parent, child);
                live.push(*next_id);
                *next_id += 1;
            }
        }
        Op::Cancel { pick } => {
            if !live.is_empty() {
                let id = live.remove(pick as usize % live.len());
                s.remove(id);
            }
        }
    }
    true
}

/// After step `b` was committed: every sequence that reached its end gets a next token (as
/// sampling would), and finished sequences leave.
fn after_step(s: &mut Scheduler, b: &ScheduledBatch, live: &mut Vec<u64>) {
    for span in &b.spans {
        let seq = s.get_mut(span.seq).unwrap();
        if seq.num_computed == seq.tokens.len() {
            let t = 7000 + seq.tokens.len() as u32;
            seq.tokens.push(t);
        }
    }
    let done: Vec<u64> = live
        .iter()
        .copied()
        .filter(|&id| s.get(id).is_some_and(|q| q.tokens.len() >= q.max_len))
        .collect();
    for id in done {
        s.remove(id);
        live.retain(|&x| x != id);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_every_invariant(ops in prop::collection::vec(op(), 1..120), blocks in 8usize..64, budget in 8usize..96, windowed: bool) {
        let layout = if windowed { KvLayout::new(&[None, Some(12)]) } else { KvLayout::full(2) };
        let mut s = Scheduler::new(SchedulerConfig { max_seqs: 6, max_batched_tokens: budget }, BlockPool::new(blocks, 8), layout);
        let mut next_id = 0u64;
        let mut live: Vec<u64> = Vec::new();
        for op in ops {
            if !apply(&op, &mut s, &mut live, &mut next_id) {
                let b = s.schedule();
                prop_assert!(b.num_tokens() <= budget);
                s.commit(&b);
                after_step(&mut s, &b, &mut live);
            }
            prop_assert_eq!(s.pool.check_invariants(s.block_tables()), Ok(()));
            prop_assert_eq!(check_cached_blocks(&s), Ok(()));
            prop_assert_eq!(s.pool.free_count() + s.pool.used(), s.pool.total());
        }
        for id in live {
            s.remove(id);
        }
        prop_assert_eq!(s.pool.used(), 0, "blocks leaked");
        prop_assert_eq!(s.pool.check_invariants(std::iter::empty()), Ok(()));
    }

    /// A hybrid (3 state slots for 6 running sequences, 4 snapshots): the executor is simulated
    /// by what each state slot holds (the tokens its state has seen). Every span must start
    /// from its own sequence's state at its start (or at position 0, from nothing), whatever
    /// forks, snapshot restores, evictions, cancellations and preemptions happened before.
    #[test]
    fn random_hybrid_workloads_resume_from_the_right_state(ops in prop::collection::vec(op(), 1..120), blocks in 8usize..64, budget in 8usize..96) {
        let mut s = Scheduler::new(SchedulerConfig { max_seqs: 6, max_batched_tokens: budget }, BlockPool::new(blocks, 8), KvLayout::full(1))
            .with_state_slots(3, 4);
        // Per slot, the tokens its state has seen.
        let mut held: Vec<Vec<u32>> = vec![Vec::new(); 7];
        let mut next_id = 0u64;
        let mut live: Vec<u64> = Vec::new();
        for op in ops {
            if !apply(&op, &mut s, &mut live, &mut next_id) {
                let b = s.schedule();
                for &(from, to) in &b.state_copies {
                    held[to as usize] = held[from as usize].clone();
                }
                let mut slots = std::collections::HashSet::new();
                for span in &b.spans {
                    let seq = s.get(span.seq).unwrap();
                    let slot = seq.state_slot.expect("a running hybrid sequence has a slot") as usize;
                    prop_assert!(slot < 3 && slots.insert(slot), "slot {} given twice", slot);
                    if span.start > 0 {
                        prop_assert_eq!(&held[slot][..], &seq.tokens[..span.start], "seq {} resumed from another state", span.seq);
                    }
                    for save in b.state_saves.iter().filter(|v| v.seq == span.seq) {
                        prop_assert!(save.to >= 3);
                        held[save.to as usize] = seq.tokens[..span.start + save.after].to_vec();
                    }
                    held[slot] = seq.tokens[..span.start + span.len].to_vec();
                }
                s.commit(&b);
                after_step(&mut s, &b, &mut live);
            }
            prop_assert_eq!(s.pool.check_invariants(s.block_tables()), Ok(()));
            prop_assert!(s.state_slot_usage().0 <= 3);
        }
        for id in live {
            s.remove(id);
        }
        prop_assert_eq!(s.pool.used(), 0, "blocks leaked");
        prop_assert_eq!(s.state_slot_usage(), (0, 3), "slots leaked");
    }
}
