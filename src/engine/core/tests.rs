//! The engine's steps driven one at a time over the fake executor (`fake_executor`), whose
//! model counts: every expected output is the prompt's last token counting on.

use super::fake_executor::{next_token, FakeExecutor, FakeProbe, HIDDEN, VOCAB};
use super::*;
use crate::engine::request::GenParams;
use std::sync::mpsc::Receiver;

const BLOCK_SIZE: usize = 4;
const BLOCKS: usize = 64;
const BUDGET: usize = 16;

fn config() -> EngineConfig {
    EngineConfig {
        block_size: BLOCK_SIZE,
        max_seqs: 8,
        max_batched_tokens: BUDGET,
        // Prefill takes the whole step budget (pacing follows measured times).
        prefill_pacing: 0.0,
        prompt_lookup: 4,
        ..EngineConfig::default()
    }
}

fn engine() -> (Engine, FakeProbe) {
    let (exec, probe) = FakeExecutor::new(BLOCKS, BLOCK_SIZE);
    let shape = ModelShape {
        vocab_size: VOCAB,
        layout: KvLayout::full(1),
        context: 256,
        weight_bytes: 0,
        state_bytes: 0,
        pooling: Pooling::Mean,
        hidden_width: HIDDEN,
        input_width: HIDDEN,
        encoder: false,
    };
    let (engine, _) = Engine::new(Box::new(exec), shape, Vec::new(), &config());
    (engine, probe)
}

fn greedy(max_tokens: usize, prompt_lookup: bool) -> GenParams {
    GenParams {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        prompt_lookup,
        ..GenParams::default()
    }
}

fn submit(
    engine: &mut Engine,
    id: RequestId,
    prompt: &[u32],
    params: GenParams,
) -> Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    let req = Request {
        id,
        prompt: prompt.to_vec(),
        images: Vec::new(),
        budget: params.max_tokens.unwrap_or(usize::MAX),
        params,
        submitted: Instant::now(),
    };
    engine.apply(Command::Submit(Box::new(req), tx));
    rx
}

/// Every live sequence's computed positions hold its own tokens in the executor's KV (a
/// rejected draft token left in the store lies past `num_computed`).
fn assert_kv_holds_tokens(engine: &Engine, probe: &FakeProbe) {
    for s in engine.sched.sequences() {
        let table = &s.blocks.tables()[0];
        for pos in 0..s.num_computed {
            assert_eq!(
                probe.kv_at(table, pos),
                Some(s.tokens[pos]),
                "sequence {} position {pos}",
                s.id
            );
        }
    }
    engine
        .sched
        .pool
        .check_invariants(engine.sched.block_tables())
        .unwrap();
}

/// Steps until nothing is left, checking the KV after each step.
fn run_to_idle(engine: &mut Engine, probe: &FakeProbe) {
    for _ in 0..1000 {
        if engine.sched.is_idle() {
            return;
        }
        engine.step();
        assert_kv_holds_tokens(engine, probe);
    }
    panic!("the engine did not finish");
}

/// Everything a request's receiver holds so far.
fn events(rx: &Receiver<Event>) -> Vec<Event> {
    rx.try_iter().collect()
}

/// The tokens of completion `index` among `events`.
fn tokens_of(events: &[Event], index: usize) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token {
                index: i, token, ..
            } if *i == index => Some(*token),
            _ => None,
        })
        .collect()
}

fn finish_reasons(events: &[Event]) -> Vec<(usize, FinishReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Finished { index, reason, .. } => Some((*index, *reason)),
            _ => None,
        })
        .collect()
}

fn errors(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Error(_)))
        .count()
}

/// `n` tokens counting on after `t`.
fn count_after(t: u32, n: usize) -> Vec<u32> {
    std::iter::successors(Some(next_token(t)), |&t| Some(next_token(t)))
        .take(n)
        .collect()
}

/// The pool holds no sequence's blocks and the engine no sequence's or request's state.
fn assert_all_released(engine: &Engine) {
    assert!(engine.sched.is_idle());
    assert_eq!(
        engine.sched.pool.used(),
        0,
        "every block is back in the pool"
    );
    assert!(
        engine.sched.sequences().next().is_none(),
        "no sequence record is left"
    );
    assert!(engine.requests.is_empty(), "no request state is left");
}

/// A counting run, a break, the run's start again: once the output reaches 12 its last
/// tokens recur in the prompt, so prompt lookup drafts what followed them there.
const LOOKUP_PROMPT: [u32; 11] = [10, 11, 12, 13, 14, 15, 16, 17, 3, 10, 11];

#[test]
fn prompt_lookup_keeps_what_plain_decoding_gives_and_rolls_a_rejected_draft_back() {
    let (mut plain, plain_probe) = engine();
    let rx = submit(&mut plain, 1, &LOOKUP_PROMPT, greedy(12, false));
    run_to_idle(&mut plain, &plain_probe);
    let plain_tokens = tokens_of(&events(&rx), 0);
    assert_eq!(plain_tokens, count_after(11, 12));

    let (mut e, probe) = engine();
    let rx = submit(&mut e, 1, &LOOKUP_PROMPT, greedy(12, true));
    e.step(); // the prompt, and its first token: 12
              // "10 11 12" occurred at the start: the first draft (3 tokens) is what followed, and holds.
    e.step();
    assert_eq!(probe.last_batch().tokens, [12, 13, 14, 15]);
    let s = e.sched.get(0).unwrap();
    assert_eq!(s.tokens[11..], [12, 13, 14, 15, 16]);
    assert_eq!(
        s.num_computed, 15,
        "accepted draft tokens count as computed"
    );
    assert_eq!(
        e.sched.get(0).unwrap().draft_cap,
        4,
        "a draft that held whole grows the next"
    );
    // "14 15 16" is followed by "17 3 10 11" in the prompt: 17 holds, 3 is rejected.
    e.step();
    let verified = probe.last_batch();
    assert_eq!(verified.tokens, [16, 17, 3, 10, 11]);
    assert_eq!(verified.positions, [15, 16, 17, 18, 19]);
    let s = e.sched.get(0).unwrap();
    assert_eq!(s.tokens[11..], [12, 13, 14, 15, 16, 17, 18]);
    assert_eq!(
        s.num_computed, 17,
        "the rejected draft's positions are not computed"
    );
    let table = s.blocks.tables()[0].clone();
    assert_eq!(
        probe.kv_at(&table, 17),
        Some(3),
        "the store still holds the rejected token"
    );
    assert_eq!(
        e.sched.get(0).unwrap().draft_cap,
        2,
        "one more than what held"
    );
    assert_kv_holds_tokens(&e, &probe);
    // The next step runs the model's own token where the rejected draft stood.
    e.step();
    let next = probe.last_batch();
    assert_eq!((next.tokens, next.positions), (vec![18], vec![17]));
    assert_eq!(probe.kv_at(&table, 17), Some(18));

    run_to_idle(&mut e, &probe);
    let ev = events(&rx);
    assert_eq!(tokens_of(&ev, 0), plain_tokens);
    assert_eq!(finish_reasons(&ev), [(0, FinishReason::Length)]);
    assert_eq!(
        (e.local.draft_tokens, e.local.accepted_draft_tokens),
        (7, 4)
    );
    assert!(
        probe.batches().len() < plain_probe.batches().len(),
        "accepted drafts save steps"
    );
    assert_all_released(&e);
}

#[test]
fn a_step_runs_each_prompt_chunk_each_decode_and_each_draft_token_as_one_row() {
    let (mut e, probe) = engine();
    let a = submit(&mut e, 1, &LOOKUP_PROMPT, greedy(8, true));
    e.step();
    let b_prompt: Vec<u32> = (30..50).collect();
    let c_prompt = [5, 6, 7, 8, 9];
    let b = submit(&mut e, 2, &b_prompt, greedy(4, false));
    let c = submit(&mut e, 3, &c_prompt, greedy(4, false));
    // (seq, len, draft) of each span; the rows sent; the logits rows asked for.
    let mut steps = Vec::new();
    while !e.sched.is_idle() {
        let batch = e.schedule().unwrap();
        e.run_batch(&batch);
        let spans: Vec<_> = batch
            .spans
            .iter()
            .map(|s| (s.seq, s.len, s.draft))
            .collect();
        let meta = probe.last_batch();
        assert_eq!(meta.tokens.len(), batch.num_tokens());
        steps.push((spans, meta.tokens.len(), meta.logits_for.len()));
        assert_kv_holds_tokens(&e, &probe);
    }
    let expected = vec![
        // A decodes 12 with a draft of 3; B's prompt takes the 12 rows left (no logits).
        (vec![(0, 4, 3), (1, 12, 0)], 16, 4),
        // A: 16 with a draft of 2 (its length limit); B's last 8 prompt tokens; C's 5.
        (vec![(0, 3, 2), (1, 8, 0), (2, 5, 0)], 16, 5),
        // One row each: A's last token, B's and C's first decodes.
        (vec![(0, 1, 0), (1, 1, 0), (2, 1, 0)], 3, 3),
        (vec![(1, 1, 0), (2, 1, 0)], 2, 2),
        (vec![(1, 1, 0), (2, 1, 0)], 2, 2),
    ];
    assert_eq!(steps, expected);
    assert_eq!(probe.batches()[0].tokens.len(), LOOKUP_PROMPT.len());
    assert_eq!(tokens_of(&events(&a), 0), count_after(11, 8));
    assert_eq!(tokens_of(&events(&b), 0), count_after(49, 4));
    assert_eq!(tokens_of(&events(&c), 0), count_after(9, 4));
    assert_all_released(&e);
}

#[test]
fn a_failed_step_errors_its_requests_frees_their_blocks_and_the_engine_serves_on() {
    let (mut e, probe) = engine();
    let forked = GenParams {
        n: 2,
        ..greedy(8, false)
    };
    let r1 = submit(&mut e, 1, &[1, 2, 3, 4, 5, 6], forked);
    let r2 = submit(&mut e, 2, &[20, 21, 22, 23, 24], greedy(8, false));
    e.step(); // both prompts; request 1 forks its second completion
    assert_eq!(e.sched.sequences().count(), 3);
    assert!(e.sched.pool.used() > 0);
    probe.fail_next();
    e.step();
    assert_eq!(
        probe.last_batch().tokens.len(),
        3,
        "the failed step carried all three"
    );
    let (ev1, ev2) = (events(&r1), events(&r2));
    assert_eq!(errors(&ev1), 1);
    assert_eq!(errors(&ev2), 1);
    assert_eq!(
        finish_reasons(&ev1),
        [(0, FinishReason::Cancelled), (1, FinishReason::Cancelled)]
    );
    assert_eq!(finish_reasons(&ev2), [(0, FinishReason::Cancelled)]);
    assert_all_released(&e);

    let r3 = submit(&mut e, 3, &[20, 21, 22, 23, 24], greedy(8, false));
    run_to_idle(&mut e, &probe);
    let ev3 = events(&r3);
    assert_eq!(errors(&ev3), 0);
    assert_eq!(tokens_of(&ev3, 0), count_after(24, 8));
    assert_eq!(finish_reasons(&ev3), [(0, FinishReason::Length)]);
    assert_all_released(&e);
}

#[test]
fn only_plain_greedy_rows_come_back_as_tokens() {
    let cases = [
        (greedy(4, false), true),
        (
            GenParams {
                logprobs: Some(2),
                ..greedy(4, false)
            },
            false,
        ),
        (
            GenParams {
                n: 2,
                ..greedy(4, false)
            },
            false,
        ),
        (
            GenParams {
                sampling: SamplingParams {
                    temperature: 0.0,
                    repetition_penalty: 1.1,
                    ..SamplingParams::default()
                },
                ..greedy(4, false)
            },
            false,
        ),
        (
            GenParams {
                sampling: SamplingParams {
                    seed: Some(7),
                    ..SamplingParams::default()
                },
                ..greedy(4, false)
            },
            false,
        ),
    ];
    for (params, tokens) in cases {
        let (mut e, probe) = engine();
        let rx = submit(&mut e, 1, &[1, 2, 3], params.clone());
        let batch = e.schedule().unwrap();
        let readout = e.readout(&batch);
        assert_eq!(matches!(readout, Readout::Greedy), tokens, "{params:?}");
        e.run_batch(&batch);
        run_to_idle(&mut e, &probe);
        let ev = events(&rx);
        assert_eq!(finish_reasons(&ev).len(), params.n, "{params:?}");
        if params.sampling.temperature <= 0.0 {
            assert_eq!(tokens_of(&ev, 0), count_after(3, 4), "{params:?}");
        }
        assert_all_released(&e);
    }
}

#[test]
fn cancelling_a_forked_request_drops_every_record_and_block_and_spares_the_others() {
    let (mut e, probe) = engine();
    let forked = GenParams {
        n: 3,
        ..greedy(8, false)
    };
    let r1 = submit(&mut e, 1, &[1, 2, 3, 4, 5, 6], forked);
    let r2 = submit(&mut e, 2, &[20, 21, 22], greedy(4, false));
    e.step();
    e.step();
    assert_eq!(
        e.sched.sequences().count(),
        4,
        "three completions and the other request"
    );
    assert_eq!(e.requests[&1].seqs.len(), 3);
    e.apply(Command::Cancel(1));
    assert_eq!(e.sched.sequences().count(), 1);
    assert!(e.sched.sequences().all(|s| s.request == 2));
    run_to_idle(&mut e, &probe);
    let ev1 = events(&r1);
    for index in 0..3 {
        assert_eq!(
            tokens_of(&ev1, index),
            count_after(6, 2),
            "completion {index}"
        );
    }
    assert_eq!(
        finish_reasons(&ev1),
        (0..3)
            .map(|i| (i, FinishReason::Cancelled))
            .collect::<Vec<_>>()
    );
    assert_eq!(tokens_of(&events(&r2), 0), count_after(22, 4));
    assert_all_released(&e);
}

fn embedding() -> GenParams {
    GenParams {
        max_tokens: Some(0),
        embed: true,
        ..GenParams::default()
    }
}

/// The fake's mean-pooled vector of `prompt`, normalised: the mean of its rows `(t, 1)`.
fn fake_embedding(prompt: &[u32]) -> Vec<f32> {
    let mean = prompt.iter().map(|&t| t as f32).sum::<f32>() / prompt.len() as f32;
    let mut v = vec![mean, 1.0];
    crate::engine::pooled::l2_normalize(&mut v);
    v
}

#[test]
fn embeddings_pool_every_chunk_batched_with_generation_and_hold_no_blocks() {
    let (mut engine, probe) = engine();
    // 40 tokens: three chunks of the 16-token budget, beside a generating request.
    let long: Vec<u32> = (0..40).map(|i| (i * 7 % 60) as u32).collect();
    let gen = submit(&mut engine, 1, &[3, 4, 5], greedy(4, false));
    let emb = submit(&mut engine, 2, &long, embedding());
    let short = submit(&mut engine, 3, &[9], embedding());
    run_to_idle(&mut engine, &probe);
    assert_eq!(tokens_of(&events(&gen), 0), count_after(5, 4));
    for (rx, prompt) in [(&emb, &long[..]), (&short, &[9][..])] {
        match &events(rx)[..] {
            [Event::Embedding {
                vector,
                prompt_tokens,
            }] => {
                assert_eq!(*prompt_tokens, prompt.len());
                let want = fake_embedding(prompt);
                assert!(vector.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6));
            }
            other => panic!("expected one embedding, got {other:?}"),
        }
    }
    // The embedding spans asked for no logits, and for a hidden row per prompt token.
    let hidden: usize = probe.batches().iter().map(|b| b.hidden_for.len()).sum();
    assert_eq!(hidden, long.len() + 1);
    assert_eq!(engine.sched.pool.used(), 0);
    assert!(engine.requests.is_empty() && engine.sched.sequences().next().is_none());
}

#[test]
fn a_model_without_pooling_refuses_embeddings() {
    let (mut engine, _) = engine();
    engine.pooling = Pooling::None;
    let rx = submit(&mut engine, 1, &[1, 2], embedding());
    assert_eq!(errors(&events(&rx)), 1);
    assert!(engine.sched.is_idle());
}
