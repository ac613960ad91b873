"""Training drafts for a target: the loop every draft shares, DeepSpec's block objective, EAGLE-3's training-time
test, and self-distillation data (the target's own answers)."""
