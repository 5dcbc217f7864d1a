"""Serving one model across several processes with MLX's distributed backend (``mx.distributed``,
started by ``mlx.launch``): the group, the collectives the lockstep layer sends its step plans
with, and the sharding of a loaded model (mlx-lm's tensor- and pipeline-parallel code)."""
