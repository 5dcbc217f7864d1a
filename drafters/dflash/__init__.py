"""The DFlash round loop's drafters: z-lab DFlash, LFM2 DSpark and the Muse Glimmer assistant,
with their checkpoint layouts (``checkpoint``) and block-diffusion network (``network``)."""
