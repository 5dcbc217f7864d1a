"""What the response formats share. Each completion-style API's format (``api/<name>/format.py``)
implements ``base.ResponseFormat``: how its request becomes the one plan and how the results are
shaped, streamed or not; every such route runs the one pipeline (``pipeline``) with its format, so
a new API is a new package with a format, not a new loop. Here: those interfaces (``base``), the
pieces several APIs' bodies carry (``openai``, ``probs``, ``settings``, ``native_result``) and
the ids of response objects (``ids``)."""
