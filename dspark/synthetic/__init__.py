"""What stands in for real checkpoints and real drafts when timing a system: model shapes of published checkpoints
(random weights), tiny random pairs in the real formats, and synthetic acceptance from a published profile. None of
it speaks for a draft's quality. Imports no torch here (the analysis reads `acceptance` without it)."""
