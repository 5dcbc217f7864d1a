"""The target's effective distribution p: request parameters (``params``), the sampler chain
(bias, penalties, DRY, top-k / typical / top-p / min-p, XTC, temperature) and the position-keyed
random keys every draw uses."""
