"""Speculative decoding: the MTP drafter (engine/spec/mtp.py), draft verification (verify.py), the static
buffers and CUDA graphs of the speculative forwards (graphs.py) and the reduced proposal head (draft_head.py).

Owns: proposing draft tokens and deciding which are accepted. The runner calls it with tensors and
plain per-row data; the scheduler only ever sees token lists and counts (engine/step.py).
"""
