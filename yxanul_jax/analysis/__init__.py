"""What a config and its compiled step cost: counts, memory estimates, HLO reading, compiles for a GPU not here."""
