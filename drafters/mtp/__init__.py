"""Multi-token-prediction drafters: MTP weights read from the target's own safetensors or a
NextN assistant (``checkpoint``), the head network (``head``) and the round loop's drafter."""
