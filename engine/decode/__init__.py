"""Decoding: one engine step over rows of any kind (``step``), and one sequence decoded plainly
(``plain``)."""
