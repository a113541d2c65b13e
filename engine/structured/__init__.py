"""Constrained decoding: constraints compiled by llguidance, and the token masks they put on
each step's logits."""
