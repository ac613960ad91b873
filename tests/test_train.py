"""The draft trainer's objective: the training block forward is the inference one, and it learns."""

from __future__ import annotations

import pytest
import torch
from pairs import random_pair

from dspark.drafters import BlockDrafter
from dspark.engine import Engine, GenerationConfig
from dspark.training.loop import LossConfig, cosine_lr, draft_loss, sample_anchors, target_features, trainable_parameters


def _sequence(n=48, vocab=63, seed=0):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_training_blocks_see_what_inference_blocks_see():
    """Hidden states of a block in the batched, masked training forward equal those of the engine's draft step."""
    target, draft = random_pair(dtype=torch.float64)
    ids = _sequence()
    feats, _ = target_features(target, ids, draft.config.target_layer_ids)
    anchors = torch.tensor([5, 20, 33])
    captured = {}
    original = draft.base_logits

    def spy(hidden):
        captured["h"] = hidden
        return original(hidden)

    draft.base_logits = spy
    with torch.no_grad():
        draft_loss(draft, feats, torch.zeros(48, 64, dtype=torch.float64), ids, torch.ones(48, dtype=torch.bool),
                   anchors, LossConfig())
        train_h = captured["h"]
        for i, a in enumerate(anchors.tolist()):
            cache = draft.new_cache(64)
            draft.add_context(feats[None, :a], torch.arange(a)[None], cache)
            block = torch.full((1, draft.config.block_size), draft.config.mask_token_id)
            block[0, 0] = ids[a]
            pos = torch.arange(a, a + draft.config.block_size)[None]
            h = draft.block_hidden(block, pos, cache, a + draft.config.block_size)
            torch.testing.assert_close(train_h[i], h[0], rtol=1e-9, atol=1e-9)


def test_anchors_respect_the_loss_mask():
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 0, 1], dtype=torch.bool)
    anchors = sample_anchors(mask, 10, torch.Generator().manual_seed(0))
    assert anchors.tolist() == [2, 3, 6]


def test_loss_trains_the_draft_and_not_the_frozen_head():
    target, draft = random_pair(dtype=torch.float32, std=0.3)
    draft.train()
    ids = _sequence(96)
    mask = torch.ones(96, dtype=torch.bool)
    mask[:10] = False  # a prompt
    feats, t_logits = target_features(target, ids, draft.config.target_layer_ids)
    params = trainable_parameters(draft)
    for p in params:
        p.requires_grad_(True)
    assert all(p.requires_grad is False for p in draft.lm_head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    first = last = None
    for step in range(60):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, 60, 1e-2)
        out = draft_loss(draft, feats, t_logits, ids, mask, sample_anchors(mask, 32, gen), LossConfig())
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        first = first if first is not None else out
        last = out
    assert draft.lm_head.weight.grad is None
    assert last.loss.item() < 0.85 * first.loss.item() and last.tau > first.tau + 0.5  # it learns the target
    draft.eval().requires_grad_(False)
    cfg = GenerationConfig(max_new_tokens=40, temperature=0.0)
    plain = Engine(target).generate(ids[:10].tolist(), cfg)
    spec = Engine(target, BlockDrafter(draft)).generate(ids[:10].tolist(), cfg)
    assert spec.tokens == plain.tokens


def _examples(n=6, length=40, vocab=63):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g)
        mask = torch.arange(length) >= 8
        out.append((ids, mask))
    return out


def test_resumed_training_equals_an_uninterrupted_run(tmp_path):
    from dspark.training.loop import TrainArgs, load_checkpoint, train

    args = TrainArgs(steps=6, batch=2, lr=1e-2, checkpoint_every=3, loss=LossConfig(num_anchors=8))
    # A target with tied embedding and head (as the demo's): the resumed draft shares them, and its
    # checkpoints must still be written
    target, draft = random_pair(dtype=torch.float64, tie=True)
    whole = train(target, draft, _examples(), args)

    # The same 6-step schedule, checkpointed every step and interrupted during the third; then resumed.
    _, part = random_pair(dtype=torch.float64, tie=True)

    def stop_at_3(step, stats):
        if step == 2:
            raise KeyboardInterrupt

    try:
        train(target, part, _examples(), TrainArgs(**{**args.__dict__, "checkpoint_every": 1}), out_dir=tmp_path,
              on_step=stop_at_3)
    except KeyboardInterrupt:
        pass
    resumed_draft, step, opt_state = load_checkpoint(tmp_path, target)
    assert step == 2
    resumed = train(target, resumed_draft, _examples(), args, out_dir=tmp_path, start_step=step,
                    optimizer_state=opt_state)
    assert load_checkpoint(tmp_path, target)[1] == 6
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_a_stopped_run_checkpoints_its_last_step_and_resumes_to_the_same_result(tmp_path):
    import pytest

    from dspark.training.loop import TrainArgs, TrainingStopped, load_checkpoint, train

    args = TrainArgs(steps=5, batch=2, lr=1e-2, checkpoint_every=100, loss=LossConfig(num_anchors=8))
    target, draft = random_pair(dtype=torch.float64)
    whole = train(target, draft, _examples(), args)
    _, part = random_pair(dtype=torch.float64)
    done = []
    with pytest.raises(TrainingStopped) as stopped:
        train(target, part, _examples(), args, out_dir=tmp_path, on_step=lambda step, stats: done.append(step),
              stop=lambda: len(done) == 2)
    assert stopped.value.step == 2 and done == [0, 1]  # no step begun after the request
    resumed_draft, step, opt_state = load_checkpoint(tmp_path, target)  # saved although 2 is no checkpoint step
    assert step == 2
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")  # a save cut off between its two renames
    assert load_checkpoint(tmp_path, target)[1] == 2
    last = []
    resumed = train(target, resumed_draft, _examples(), args, start_step=step, optimizer_state=opt_state,
                    on_step=lambda step, stats: last.append(step), stop=lambda: last[-1] == 4)  # never asked at the end
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_stop_requested_turns_signals_and_a_time_limit_into_a_request():
    import signal

    from dspark.training.loop import stop_requested

    # Python's own SIGINT handler, as in a user's shell (a pytest-xdist worker ignores SIGINT, and an ignored
    # signal rightly stays ignored: checked below with SIGTERM)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _check_stop_requested(stop_requested)
    finally:
        signal.signal(signal.SIGINT, outer)


def _check_stop_requested(stop_requested):
    import os
    import signal

    import pytest

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with stop_requested() as stop:
        assert not stop()
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not fatal: the step in flight finishes
        assert stop()
        with pytest.raises(KeyboardInterrupt):  # a second signal does interrupt
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a signal the process ignores stays ignored
    try:
        with stop_requested() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert not stop()
    finally:
        signal.signal(signal.SIGTERM, before[1])
    with stop_requested(0.0) as stop:
        assert stop()
    with stop_requested(3600.0) as stop:
        assert not stop()


def test_train_draft_command_trains_saves_and_resumes(tiny_dir, tmp_path, monkeypatch, capfd):
    import json

    from cli_runner import run_cli

    from dspark.checkpoint import load_draft, load_target

    data = tmp_path / "data.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"double {i}"},
                          {"role": "assistant", "content": f"def f(x):\n    return {i} * x\n"}]} for i in range(8)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "draft"
    common = ["train-draft", "--target", tiny_dir / "target", "--data", data, "--out", out, "--batch", "2",
              "--num-anchors", "8", "--checkpoint-every", "2", "--device", "cpu"]
    code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "4")
    assert code == 0, err
    target = load_target(tiny_dir / "target").model
    made = load_draft(out, target).config  # --block-size and --markov-rank left out: dspark's defaults
    assert (made.format, made.block_size, made.markov_rank) == ("deepspec", 7, 64)
    code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "4")
    assert code == 2 and "pass --resume" in err  # never silently overwrites a run
    code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "6", "--resume", "--time-limit", "0")
    assert code == 3 and "continue with --resume" in err, err  # stopped after one step, checkpointed
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 5
    code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "6", "--resume")
    assert code == 0, err
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 6


def test_train_target_learns_its_data():
    from dspark.synthetic.tiny import random_target, tiny_target_config
    from dspark.training.loop import TrainArgs, lm_loss, train_target

    target = random_target(tiny_target_config(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                                              intermediate=64, eos=()), seed=0)
    examples = _examples(n=2)
    before = [float(lm_loss(target, ids, m)) for ids, m in examples]
    train_target(target, examples, TrainArgs(steps=80, batch=2, lr=1e-2))
    after = [float(lm_loss(target, ids, m)) for ids, m in examples]
    assert max(after) < 0.5 * min(before)  # it memorises two sequences
    ids, mask = examples[0]
    out = Engine(target).generate(ids[:12].tolist(), GenerationConfig(max_new_tokens=10))
    assert sum(a == b for a, b in zip(out.tokens, ids[12:22].tolist())) >= 7  # and continues them greedily


def test_padded_batch_loss_equals_the_per_sequence_losses():
    """Right padding never leaks into real tokens: the batched loss is the token-weighted mean of the
    sequences' own losses, whatever their lengths."""
    from dspark.synthetic.tiny import random_target, tiny_target_config
    from dspark.training.loop import lm_loss, pad_batch

    target = random_target(tiny_target_config(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                                              intermediate=64, eos=()), seed=0)
    g = torch.Generator().manual_seed(3)
    examples = []
    for n in (9, 17, 12):
        ids = torch.randint(0, 64, (n,), generator=g)
        examples.append((ids, torch.arange(n) >= 3))
    counts = [float(m[1:].sum()) for _, m in examples]
    own = sum(float(lm_loss(target, i, m)) * c for (i, m), c in zip(examples, counts)) / sum(counts)
    batched = float(lm_loss(target, *pad_batch(examples, "cpu")))
    assert abs(batched - own) < 1e-5


def test_a_padded_batch_of_sequences_trains_each_block_as_alone():
    """Blocks of sequences of different lengths, batched with padding, get the hidden states (and so
    the loss terms) they get one sequence at a time."""
    from dspark.training.loop import pad_anchors, pad_batch

    target, draft = random_pair(dtype=torch.float64)
    seqs = [(_sequence(30, seed=1), torch.arange(30) >= 4), (_sequence(48, seed=2), torch.arange(48) >= 9)]
    anchors = [torch.tensor([5, 12, 20]), torch.tensor([9, 40])]
    captured = []
    original = draft.base_logits

    def spy(hidden):
        captured.append(hidden)
        return original(hidden)

    draft.base_logits = spy
    taps = draft.config.target_layer_ids
    with torch.no_grad():
        ids, mask = pad_batch(seqs, "cpu")
        feats, logits = target_features(target, ids, taps)
        batched = draft_loss(draft, feats, logits, ids, mask, pad_anchors(anchors), LossConfig())
        alone = []
        for (i, m), a in zip(seqs, anchors):
            f, lg = target_features(target, i, taps)
            alone.append(draft_loss(draft, f, lg, i, m, a, LossConfig()))
    real = (pad_anchors(anchors) >= 0).flatten()  # the padding block of the shorter list weighs nothing
    assert real.tolist() == [True] * 3 + [True, True, False]
    torch.testing.assert_close(captured[0][real], torch.cat(captured[1:]), rtol=1e-9, atol=1e-9)
    assert batched.slots == sum(p.slots for p in alone)
    assert abs(float(batched.tau) - 1 - sum(float(p.tau - 1) * len(a) for p, a in zip(alone, anchors)) / 5) < 1e-9
    twice = draft_loss(draft, *(torch.stack([t, t]) for t in (f, lg, i, m)), torch.stack([a, a]), LossConfig())
    assert abs(twice.loss.item() - alone[-1].loss.item()) < 1e-9  # the batch mean of equal rows is the row's


def test_a_model_that_generated_can_still_train():
    """Generation fuses projection weights inside inference mode; the parameters must stay trainable."""
    from dspark.training.loop import TrainArgs, train

    target, draft = random_pair(dtype=torch.float32)
    Engine(target, BlockDrafter(draft)).generate(list(range(1, 12)), GenerationConfig(max_new_tokens=12))
    before = [p.detach().clone() for p in trainable_parameters(draft)]
    train(target, draft, _examples(n=2), TrainArgs(steps=2, batch=2, lr=1e-2))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainable_parameters(draft)))


def test_train_draft_command_trains_an_eagle3_draft_over_the_datas_vocabulary(tiny_dir, tmp_path, monkeypatch, capfd):
    import json

    from cli_runner import run_cli

    from dspark.checkpoint import load_draft, load_target
    from dspark.training.eagle3_objective import draft_vocabulary
    from dspark.training.loop import read_examples

    data = tmp_path / "data.jsonl"
    rows = [{"prompt_ids": [1, 2, 3], "response_ids": [40 + i % 5, 60, 61, 62 + i]} for i in range(8)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "eagle3"
    common = ["train-draft", "--target", tiny_dir / "target", "--data", data, "--out", out, "--method", "eagle3",
              "--batch", "2", "--device", "cpu"]
    code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "3", "--ttt-length", "3", "--draft-vocab-size", "12")
    assert code == 0, err
    target = load_target(tiny_dir / "target").model
    draft = load_draft(out, target)
    assert (draft.config.method, draft.config.format, draft.config.vocab_size) == ("eagle3", "eagle", 12)
    assert draft.config.target_layer_ids == (0, 1)  # vLLM's (2, L//2, L-3) of a 4-layer target, as outputs
    # the 12 most frequent answer tokens: 60 and 61 (8 each), 40 to 42 (2), then of those seen once the lowest ids
    want = draft_vocabulary(read_examples(data), 12, target.config.backbone.vocab_size)
    assert draft.model.target_ids().tolist() == (torch.arange(12) + want).tolist() == \
        [40, 41, 42, 43, 44, 60, 61, 62, 63, 64, 65, 66]
    for args, says in ((["--ttt-length", "0"], "--ttt-length 0"), (["--draft-vocab-size", "0"], "--draft-vocab-size 0"),
                       (["--draft-vocab-size", "9999"], "--draft-vocab-size 9999"), (["--layers", "2"], "--layers 2"),
                       (["--taps", "1,x"], "--taps must be"), (["--taps", "1,9"], "tapped target layer 9"),
                       (["--method", "medusa"], "--method 'medusa'")):
        code, _, err = run_cli(monkeypatch, capfd, *common, "--steps", "1", "--out", tmp_path / "bad", *args)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (args, err)
    code, _, err = run_cli(monkeypatch, capfd, *common[:-4], "--method", "dspark", "--ttt-length", "3", "--steps", "1")
    assert code == 2 and "--ttt-length is for --method eagle3" in err
    code, _, err = run_cli(monkeypatch, capfd, *common[:-4], "--method", "dspark", "--steps", "4", "--resume")
    assert code == 2 and "is of method eagle3; resume it with --method eagle3" in err


@pytest.mark.parametrize("method,extra,readers", [
    ("draft_model", "--markov-rank 8", "dspark"), ("draft_model", "--block-size 4", "dspark, dflash, dflash2 or eagle3"),
    ("draft_model", "--num-anchors 8", "dspark, dflash or dflash2"), ("dflash", "--markov-rank 8", "dspark"),
    ("dflash2", "--markov-rank 8", "dspark"), ("eagle3", "--num-anchors 8", "dspark, dflash or dflash2"),
    ("eagle3", "--mask-token-id 5", "dspark, dflash or dflash2"), ("eagle3", "--conv-kernel-size 3", "dflash2"),
    ("draft_model", "--taps 1,2", "dspark, dflash, dflash2 or eagle3"), ("dspark", "--draft-vocab-size 9", "eagle3"),
])
def test_an_option_another_method_reads_is_refused_not_ignored(tmp_path, monkeypatch, capfd, method, extra, readers):
    """A method-specific option given with a method that does not read it would train as if it were left out:
    refused in one line naming the methods that read it, before the target is even looked up (it does not exist)."""
    from cli_runner import run_cli

    code, stdout, err = run_cli(monkeypatch, capfd, "train-draft", "--target", tmp_path / "no-target", "--data",
                                tmp_path / "no.jsonl", "--out", tmp_path / "d", "--method", method, *extra.split())
    flag = extra.split()[0]
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1, err
    assert f"{flag} is for --method {readers}; leave it out for {method}" in " ".join(err.split()), err
    assert not (tmp_path / "d").exists()


def test_train_draft_resume_without_a_checkpoint_is_refused_before_loading(tiny_dir, tmp_path, monkeypatch, capfd):
    """--resume on a folder with no checkpoint (none yet, or a typo) would train from scratch and say
    nothing: it is refused in one line, with nothing written."""
    import json

    from cli_runner import run_cli

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6, i]}) + "\n" for i in range(4)))
    out = tmp_path / "draft"
    for made in (False, True):  # a folder that does not exist, then an empty one
        if made:
            out.mkdir()
        code, stdout, err = run_cli(monkeypatch, capfd, "train-draft", "--target", tiny_dir / "target", "--data",
                                    data, "--out", out, "--steps", "2", "--batch", "2", "--device", "cpu", "--resume")
        assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1, err
        assert f"--resume: {out} holds no checkpoint" in err and "leave out --resume" in err
        assert out.exists() == made and not any(tmp_path.glob("draft/*"))


def test_the_readmes_train_draft_example_runs_as_written(tmp_path, monkeypatch, capfd):
    """The README's `train-draft` example on the shipped data (`--data demo`: the demo target's own answers,
    shipped beside it), as written but for its --out (a fresh folder here): it trains a draft of the demo
    target that loads for it, its weights readable as its config is."""
    import os
    import shlex
    from pathlib import Path

    from cli_runner import run_cli

    from dspark.checkpoint import load_draft, load_target

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    shown = [line for line in readme.splitlines() if line.startswith("dspark-bench train-draft ") and "--data demo" in line]
    assert shown, "the README shows no train-draft example on the shipped data (--data demo)"
    args = shlex.split(shown[0])[1:]
    args[args.index("--out") + 1] = str(tmp_path / "draft")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capfd, *args)
    steps = args[args.index("--steps") + 1] if "--steps" in args else "1000"
    assert code == 0 and f"draft saved to {tmp_path / 'draft'} (deepspec format, dspark, {steps} steps)" in out, err
    draft = load_draft(tmp_path / "draft", load_target("demo").model)
    assert (draft.config.method, draft.config.format) == ("dspark", "deepspec")
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "draft" / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
