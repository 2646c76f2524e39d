"""Speculative decoding: the MTP drafter (engine/spec/mtp.py) and draft verification (verify.py).

Owns: proposing draft tokens and deciding which are accepted. The runner calls it with tensors and
plain per-row data; the scheduler only ever sees token lists and counts (engine/step.py).
"""
