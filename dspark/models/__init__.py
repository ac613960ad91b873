"""The models as modules: the Qwen3 target, the block (DSpark/DFlash) and EAGLE-3 drafts, the layers they share,
and the normalised configurations every checkpoint format loads into."""
