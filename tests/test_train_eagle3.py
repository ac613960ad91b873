"""The EAGLE-3 objective (training-time test): its loss is the hand computation from an explicit
reference of the layer, step j's rows see what chain step j sees in the engine, it learns, it resumes
exactly, and a reduced draft vocabulary scores against the restricted target distribution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pairs import eagle3_pair
from test_eagle3 import _rms, _rope, reference_chain

from dspark.errors import DSparkError
from dspark.training.eagle3_objective import TTTConfig, draft_vocabulary, ttt_loss
from dspark.training.loop import LossConfig, TrainArgs, load_checkpoint, target_features, train


def _layer(draft, embeds, hidden, positions, past_k, past_v):
    """The draft layer written out for rows [T, H] at `positions`, attending to the given past keys
    and values [heads, P, D] (already rotated; all visible) and causally to each other. Returns
    (normed, pre-norm, the rows' rotated keys, values)."""
    cfg, layer = draft.config, draft.midlayer
    b, eps = cfg.backbone, cfg.backbone.rms_norm_eps
    h = _rms(hidden, layer.hidden_norm.weight, eps)
    x = torch.cat((_rms(embeds, layer.input_layernorm.weight, eps), h), -1)
    a, t = layer.self_attn, x.shape[0]
    q = (x @ a.q_proj.weight.T).view(t, b.num_heads, b.head_dim).transpose(0, 1)
    k = (x @ a.k_proj.weight.T).view(t, b.num_kv_heads, b.head_dim).transpose(0, 1)
    v = (x @ a.v_proj.weight.T).view(t, b.num_kv_heads, b.head_dim).transpose(0, 1)
    q, k = _rope(q, positions, b.rope_theta), _rope(k, positions, b.rope_theta)
    keys, values = torch.cat((past_k, k), 1), torch.cat((past_v, v), 1)
    group = b.num_heads // b.num_kv_heads
    p = past_k.shape[1]
    visible = torch.cat((torch.ones(t, p, dtype=torch.bool), torch.ones(t, t, dtype=torch.bool).tril()), 1)
    scores = q @ keys.repeat_interleave(group, 0).transpose(1, 2) / b.head_dim ** 0.5
    out = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ values.repeat_interleave(group, 0)
    h1 = hidden + out.transpose(0, 1).reshape(t, -1) @ a.o_proj.weight.T
    m = _rms(h1, layer.post_attention_layernorm.weight, eps)
    h2 = h1 + (F.silu(m @ layer.mlp.gate_proj.weight.T) * (m @ layer.mlp.up_proj.weight.T)) @ layer.mlp.down_proj.weight.T
    return _rms(h2, draft.norm.weight, eps), h2, k, v


def _soft_ce(draft, normed, target_logits):
    return -(F.softmax(target_logits, -1) * F.log_softmax(normed @ draft.lm_head.weight.T, -1)).sum(-1)


def _step0(draft, ids, feats):
    """Step 0 over every row but the last (which has no next token): the layer written out, causal."""
    b = draft.config.backbone
    empty = torch.zeros(b.num_kv_heads, 0, b.head_dim, dtype=torch.float64)
    n = ids.shape[0]
    return _layer(draft, draft.embed_tokens.weight[ids[1:]], feats[:-1] @ draft.fc.weight.T, torch.arange(n - 1),
                  empty, empty)


def _case(n=14, vocab=16, prompt=3, **kw):
    target, draft = eagle3_pair(vocab=vocab, **kw)
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(5))
    mask = torch.arange(n) >= prompt
    feats, logits = target_features(target, ids, draft.config.target_layer_ids)
    return target, draft, ids, mask, feats, logits


def test_one_step_loss_is_the_mean_soft_cross_entropy_of_the_scored_rows():
    """Row t reads fc(target states at t) and the token at t + 1, is scored against the target's
    distribution at t + 1 when the tokens at t + 1 and t + 2 are in the loss mask."""
    _, draft, ids, mask, feats, logits = _case()
    n = ids.shape[0]
    with torch.no_grad():
        got = ttt_loss(draft, feats, logits, ids, mask, TTTConfig(ttt_length=1))
        normed = _step0(draft, ids, feats)[0]
    rows = [t for t in range(n - 2) if mask[t + 1] and mask[t + 2]]
    assert rows == list(range(2, 12))  # the prompt's last row (it reads the first answer token) and on
    want = _soft_ce(draft, normed[rows], logits[[t + 1 for t in rows]]).mean()
    assert float(got.loss) == pytest.approx(float(want), rel=1e-5)
    assert got.rows.tolist() == [10]


def test_the_second_step_reads_the_first_steps_output_and_sees_the_causal_keys_and_its_own():
    """Step 1 of row t: the token at t + 2, step 0's pre-norm output of row t, RoPE position t + 1,
    attention over step 0's keys of rows <= t and its own key; weighted 0.8 beside step 0."""
    _, draft, ids, mask, feats, logits = _case()
    n = ids.shape[0]
    with torch.no_grad():
        got = ttt_loss(draft, feats, logits, ids, mask, TTTConfig(ttt_length=2))
        normed0, pre0, k0, v0 = _step0(draft, ids, feats)
        embed = draft.embed_tokens.weight
        rows0 = [t for t in range(n - 2) if mask[t + 1] and mask[t + 2]]
        rows1 = [t for t in rows0 if t + 3 < n and mask[t + 3]]
        step1 = torch.cat([_layer(draft, embed[ids[t + 2]][None], pre0[t][None], torch.tensor([t + 1]),
                                  k0[:, : t + 1], v0[:, : t + 1])[0] for t in rows1])
    loss0 = _soft_ce(draft, normed0[rows0], logits[[t + 1 for t in rows0]]).mean()
    loss1 = _soft_ce(draft, step1, logits[[t + 2 for t in rows1]]).mean()
    assert got.step_ce.tolist() == pytest.approx([float(loss0), float(loss1)], rel=1e-5)
    assert float(got.loss) == pytest.approx(float(loss0 + 0.8 * loss1), rel=1e-5)
    assert got.rows.tolist() == [10, 9]


def test_on_its_own_tokens_each_step_is_the_engines_chain_step():
    """Where the data continues with the draft's own greedy choices, TTT step j of row t proposes what
    chain step j proposes after the committed tokens up to t + 1 (`reference_chain`, which every engine
    proposal equals): training's steps are inference's."""
    target, draft = eagle3_pair(vocab=16, num_tokens=3)
    ids = torch.randint(0, 16, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    to_target, captured = draft.target_ids(), []
    original = draft.logits
    draft.logits = lambda normed: captured.append(normed) or original(normed)
    for t in (0, 4, 9):
        committed = ids[: t + 2]  # row t reads the token at t + 1: the anchor
        chain = reference_chain(target, draft, committed, 3)
        seq = torch.tensor(committed + chain)
        captured.clear()
        with torch.no_grad():
            ttt_loss(draft, *target_features(target, seq, draft.config.target_layer_ids), seq,
                     torch.ones(len(seq), dtype=torch.bool), TTTConfig(ttt_length=3))
        assert [int(to_target[original(h)[0, t].argmax()]) for h in captured] == chain


def test_a_reduced_vocabulary_scores_the_restricted_renormalised_distribution():
    """Draft ids map to target ids through d2t; the target's distribution is cut to those ids and
    renormalised; rows whose target arg-max the draft cannot propose are not scored (and count as misses)."""
    target, draft, ids, mask, feats, logits = _case(vocab=16, draft_vocab=6)
    keep = torch.tensor([0, 2, 3, 7, 11, 15])
    with torch.no_grad():
        draft.d2t.copy_(keep - torch.arange(6))
        draft.lm_head.weight.copy_(target.lm_head.weight[keep])
        got = ttt_loss(draft, feats, logits, ids, mask, TTTConfig(ttt_length=1))
        normed = _step0(draft, ids, feats)[0]
    n = ids.shape[0]
    rows = [t for t in range(n - 2) if mask[t + 1] and mask[t + 2]]
    proposable = [t for t in rows if int(logits[t + 1].argmax()) in keep.tolist()]
    assert 0 < len(proposable) < len(rows)  # the case masks some rows and keeps others
    want = _soft_ce(draft, normed[proposable], logits[[t + 1 for t in proposable]][:, keep]).mean()
    assert float(got.loss) == pytest.approx(float(want), rel=1e-5)
    assert got.rows.tolist() == [len(proposable)]
    hits = sum(int(keep[(normed[t] @ draft.lm_head.weight.T).argmax()]) == int(logits[t + 1].argmax()) for t in rows)
    assert float(got.accuracy[0]) == pytest.approx(hits / len(rows))


def test_draft_vocabulary_takes_the_most_frequent_scored_tokens_as_offsets():
    examples = [(torch.tensor([9, 9, 9, 1, 1, 4, 4, 6]), torch.tensor([False, False, False, True, True, True, True, True])),
                (torch.tensor([6, 2, 2]), torch.tensor([True, True, False]))]
    # scored: 1 x2, 4 x2, 6 x2, 2 x1 (9 is prompt only); ties go to the lower id
    d2t = draft_vocabulary(examples, 3, 10)
    assert (torch.arange(3) + d2t).tolist() == [1, 4, 6]
    assert (torch.arange(4) + draft_vocabulary(examples, 4, 10)).tolist() == [1, 2, 4, 6]
    for bad in (0, 10):
        with pytest.raises(DSparkError, match=f"draft vocabulary {bad}"):
            draft_vocabulary(examples, bad, 10)


def _examples(n=6, length=40, vocab=16):
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, vocab, (length,), generator=g), torch.arange(length) >= 8) for _ in range(n)]


def test_the_objective_learns_and_the_estimated_acceptance_rises():
    target, draft = eagle3_pair(vocab=16, dtype=torch.float32, num_tokens=4)
    log = []
    train(target, draft, _examples(), TrainArgs(steps=40, batch=4, lr=1e-2, loss=TTTConfig(ttt_length=3)),
          on_step=lambda step, stats: log.append(stats[0]))
    first, last = log[0], log[-1]
    assert float(last.loss.detach()) < 0.7 * float(first.loss.detach())
    assert float(last.tau) > float(first.tau) + 0.3
    assert all(p.grad is None for p in draft.embed_tokens.parameters())  # the target's embedding stays frozen


def test_resumed_eagle3_training_equals_an_uninterrupted_run(tmp_path):
    args = TrainArgs(steps=6, batch=2, lr=1e-2, checkpoint_every=3, loss=TTTConfig(ttt_length=3))
    target, draft = eagle3_pair(vocab=16, draft_vocab=10)
    whole = train(target, draft, _examples(), args)
    _, part = eagle3_pair(vocab=16, draft_vocab=10)

    def stop_at_3(step, stats):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(target, part, _examples(), TrainArgs(**{**args.__dict__, "checkpoint_every": 1}), out_dir=tmp_path,
              on_step=stop_at_3)
    resumed_draft, step, opt_state = load_checkpoint(tmp_path, target)
    assert step == 2 and resumed_draft.config.method == "eagle3"
    resumed = train(target, resumed_draft, _examples(), args, out_dir=tmp_path, start_step=step,
                    optimizer_state=opt_state)
    assert load_checkpoint(tmp_path, target)[1] == 6
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_the_objective_must_be_the_drafts():
    target, draft = eagle3_pair(vocab=16)
    with pytest.raises(DSparkError, match="LossConfig is the block objective, and this draft is eagle3; pass TTTConfig"):
        train(target, draft, _examples(), TrainArgs(steps=1, batch=2, loss=LossConfig()))
    with pytest.raises(DSparkError, match="ttt_length 0: give at least 1"):
        train(target, draft, _examples(), TrainArgs(steps=1, batch=2, loss=TTTConfig(ttt_length=0)))
