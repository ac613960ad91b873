"""The EAGLE-3 draft checkpoint formats, one module each, with the block formats' parts plus
`KIND = "eagle3"`: `authors` (the EAGLE authors', SpecForge's and AngelSlim's `LlamaForCausalLMEagle3`
layout), `speculators` (vLLM speculators' `speculators_model_type: eagle3`) and `deepspec`
(DeepSpec's `Qwen3Eagle3Model`). What they share is in `common`; `dspark.formats` registers them.

Their configs name tapped target layers in two conventions: vLLM's `eagle_aux_hidden_state_layer_ids`
(id k: the state entering layer k) and DeepSpec's `target_layer_ids` (ours: the output of layer i),
so vLLM's ids are ours + 1.
"""
