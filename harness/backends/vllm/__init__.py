"""vLLM as a backend: its offline engine (`offline`, the `vllm` backend), the `vllm serve` process the harness
starts (`process`) and the `vllm-server` backend over it (`server`), and what both share: the engine arguments a
user gives (`args`), what the installed vLLM can run (`checks`), a draft as vLLM reads it (`drafts`), where vLLM's
output goes (`output`), and a tensor-parallel engine's environment (`parallel`)."""
