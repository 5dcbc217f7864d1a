"""Drafters: where speculative proposals come from (a small draft model, prompt lookup), behind one
interface (`base.py`). Depends on the engine only."""
