"""EAGLE-3 drafters: one decoder layer reading three of the target's hidden states (``drafter.py``)."""
