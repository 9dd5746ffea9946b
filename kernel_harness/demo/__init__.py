"""``make demo``: the whole procedure of SKILL.md, run for real on a shipped example."""
